"""Step timing, the timing ledger, the --profile trace and the timeline picture."""
from __future__ import annotations

import json
import time

import pytest
import torch

from turbotrain.train.records.ledger import MAX_PROBES, StepLedger
from turbotrain.train.records.profiling import DATA_RANGE, StepClock, StepTime, WindowTimes
from turbotrain.train.records.timeline import StepTimeline

from ..conftest import FAST


def test_step_clock_splits_data_wait_and_compute_on_cpu():
    clock = StepClock(torch.device("cpu"))
    for step in (1, 2):
        for micro in range(2):  # two micro-batches per optimizer step
            with clock.waiting():
                time.sleep(0.02)
            time.sleep(0.01)
            clock.computed(step if micro == 1 else None)
    window = clock.flush()
    assert [s.step for s in window.steps] == [1, 2]
    # 4 x 20 ms waiting, 4 x 10 ms computing; sleep overshoots a little, never undershoots.
    assert 0.08 <= window.data_wait < 0.12 and 0.04 <= window.compute < 0.07
    assert window.seconds >= window.data_wait + window.compute
    assert clock.flush().steps == []  # flushing starts a new window


class _InstantGpuEvent:
    """torch.cuda.Event on a pretend GPU that runs each kernel the moment it is launched."""

    def __init__(self, enable_timing=False):
        self.at = None

    def record(self, stream=None):
        self.at = time.perf_counter()

    def elapsed_time(self, end):
        return 1000 * (end.at - self.at)


def test_step_clock_on_cuda_times_with_events_and_never_synchronises(monkeypatch):
    """The step loop's only syncs are the trainer's, one per log window: the clock adds none
    (it once synchronised after each window's first step for its host-bound probe)."""
    monkeypatch.setattr(torch.cuda, "Event", _InstantGpuEvent)
    monkeypatch.setattr(torch.cuda, "synchronize",
                        lambda *a: pytest.fail("StepClock synchronised inside the step loop"))
    clock = StepClock(torch.device("cuda"))
    for step in (1, 2, 3):
        with clock.waiting():
            time.sleep(0.02)
        time.sleep(0.005)
        clock.computed(step)
    window = clock.flush()
    assert [s.step for s in window.steps] == [1, 2, 3]
    # This GPU finishes each step right after its last launch: the host-bound signature.
    assert window.host_issue_fraction == pytest.approx(1.0, abs=0.05)
    # Steps 2 and 3: the GPU sat idle from the previous step's end to this batch's arrival.
    assert all(0.02 <= s.data_wait < 0.05 and s.compute >= 0.005 for s in window.steps[1:])


def test_the_ledger_books_windows_and_survives_a_checkpoint():
    ledger = StepLedger()
    ledger.book_warmup(3.0)  # never in a rate
    ledger.book(WindowTimes(2.0, [StepTime(1, 0.5, 1.2), StepTime(2, 0.3, 0.9)], 0.5), 64,
                data_wait=0.8)
    ledger.book(WindowTimes(0.001), 0, data_wait=0.0)  # an empty window: nothing ran
    ledger.book(WindowTimes(1.0, [StepTime(3, 0.1, 0.8)], 0.7), 32, data_wait=0.4)  # rank max
    assert (ledger.seconds, ledger.steps, ledger.images) == (3.0, 3, 96)
    assert ledger.data_wait == pytest.approx(1.2) and ledger.compute == pytest.approx(2.9)
    assert ledger.images_per_second == 32 and ledger.data_wait_fraction == pytest.approx(0.4)
    assert ledger.mean_step_seconds == 1.0 and ledger.host_issue_fraction == 0.7
    assert StepLedger.from_state(ledger.state_dict()) == ledger
    for _ in range(3 * MAX_PROBES):  # one probe per window, thinned on a long run
        ledger.book(WindowTimes(1.0, [StepTime(4, 0.0, 1.0)], 0.9), 1, data_wait=0.0)
    assert len(ledger.host_issue_probes) <= MAX_PROBES and ledger.host_issue_fraction == 0.9
    with pytest.raises(ValueError):
        StepLedger.from_state({**ledger.state_dict(), "seconds": float("nan")})
    with pytest.raises(TypeError):
        StepLedger.from_state({**ledger.state_dict(), "steps": 2.5})


def test_a_checkpoint_from_before_the_ledger_gives_its_counters_sums():
    """Its counters held timed_seconds/_data_wait/_steps/_images and warmup_seconds, and no
    compute: the timed time that was not data wait is taken for compute."""
    ledger = StepLedger.from_legacy_counters({
        "step": 40, "timed_seconds": 10.0, "timed_data_wait": 2.5, "timed_steps": 38,
        "timed_images": 1216, "warmup_seconds": 4.0})
    assert ledger == StepLedger(seconds=10.0, data_wait=2.5, compute=7.5, steps=38,
                                images=1216, warmup_seconds=4.0)


def test_timeline_stays_bounded_and_keeps_every_step():
    timeline = StepTimeline(max_points=8)
    timeline.add([StepTime(i, 0.01, 0.02) for i in range(1, 101)])
    assert len(timeline) <= 8 and sum(timeline.counts) == 100
    assert list(timeline.first_step) == sorted(timeline.first_step)
    assert sum(timeline.data_wait) == pytest.approx(1.0)


def test_timeline_state_round_trips_through_a_checkpoint_and_refuses_damage(tmp_path):
    """A resumed run appends to the timeline its checkpoint saved (torch.load with
    weights_only=True reads it back), so timeline.png covers the whole run."""
    timeline = StepTimeline(max_points=8)
    timeline.add([StepTime(i, 0.01, 0.02) for i in range(1, 51)])
    timeline.mark_epoch(1)
    timeline.mark_epoch(26)
    timeline.profiled = (3, 12)
    torch.save({"timeline": timeline.state_dict()}, tmp_path / "state.pt")
    saved = torch.load(tmp_path / "state.pt", weights_only=True)["timeline"]
    resumed = StepTimeline(max_points=8)
    resumed.load_state_dict(saved)
    resumed.mark_resume(51)
    resumed.add([StepTime(i, 0.01, 0.02) for i in range(51, 101)])
    assert sum(resumed.counts) == 100 and len(resumed) <= 8
    assert resumed.first_step[0] == 1 and list(resumed.first_step) == sorted(resumed.first_step)
    assert resumed.epoch_starts == [1, 26] and resumed.resumes == [51]
    assert resumed.profiled == (3, 12) and resumed.per_bucket >= timeline.per_bucket
    assert resumed.plot(tmp_path / "timeline.png").stat().st_size > 0
    for damage in ({"counts": [1]}, {"data_wait": [-1.0] * len(saved["data_wait"])},
                   {"per_bucket": 0}, {"first_step": "x"}, {"profiled": [1]},
                   {"counts": [1] * 9, "first_step": [1] * 9, "data_wait": [0.0] * 9,
                    "compute": [0.0] * 9}):
        with pytest.raises((TypeError, ValueError)):
            StepTimeline(max_points=8).load_state_dict({**saved, **damage})
    with pytest.raises(KeyError):
        StepTimeline().load_state_dict({})


def test_timeline_shows_each_evaluation_and_their_total_time(tmp_path, monkeypatch):
    """Issue 46: timeline.png had no evaluation time; evaluations run between steps, so each
    is a mark at its step with its seconds, and the legend says their total. They are saved
    in the checkpoint, and one from before them (no "evals") loads with none."""
    from turbotrain.train.records import timeline as timeline_module
    timeline = StepTimeline(max_points=8)
    timeline.add([StepTime(i, 0.01, 0.02) for i in range(1, 41)])
    timeline.mark_eval(20, 1.5)
    timeline.mark_eval(40, 2.25)
    saved = timeline.state_dict()
    resumed = StepTimeline(max_points=8)
    resumed.load_state_dict(saved)
    assert resumed.evals == [[20, 1.5], [40, 2.25]]
    old = dict(saved)
    del old["evals"]
    resumed.load_state_dict(old)
    assert resumed.evals == []
    for damage in ([[20, -1.0]], [[20]], "x", [["a", 1.0]]):
        with pytest.raises((TypeError, ValueError)):
            StepTimeline(max_points=8).load_state_dict({**saved, "evals": damage})
    drawn = {}
    save = timeline_module.save_figure

    def keep(fig, path, **kwargs):
        ax = fig.axes[0]
        drawn["marks"] = [(list(line.get_xdata()), line.get_label()) for line in ax.get_lines()
                          if line.get_label().startswith("evaluation")]
        drawn["texts"] = [text.get_text() for text in ax.texts]
        return save(fig, path, **kwargs)
    monkeypatch.setattr(timeline_module, "save_figure", keep)
    assert timeline.plot(tmp_path / "timeline.png").is_file()
    assert drawn["marks"] == [([20, 40], "evaluation (2, 3.75 s in all, not in the steps)")]
    assert drawn["texts"] == ["1.5 s", "2.2 s"]


def test_timeline_draws_the_step_where_a_target_or_budget_stopped_the_run(tmp_path,
                                                                          monkeypatch):
    from turbotrain.train.records import timeline as timeline_module
    timeline = StepTimeline(max_points=8)
    timeline.add([StepTime(i, 0.01, 0.02) for i in range(1, 41)])
    timeline.stopped = (37, "time_budget")
    drawn = {}
    save = timeline_module.save_figure

    def keep(fig, path, **kwargs):
        drawn["stops"] = [(line.get_xdata()[0], line.get_label()) for ax in fig.axes
                          for line in ax.get_lines() if line.get_label().startswith("stopped")]
        return save(fig, path, **kwargs)
    monkeypatch.setattr(timeline_module, "save_figure", keep)
    assert timeline.plot(tmp_path / "timeline.png").is_file()
    assert drawn["stops"] == [(37, "stopped: time budget")]


def test_profile_writes_a_trace_with_the_data_loading_range(train_cli, tiny_dataset, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", out, "--epochs", 1,
                                  "--batch-size", 8, "--max-steps", 6, "--profile", *FAST)
    assert code == 0, err
    trace = json.loads((out / "trace.json").read_text())  # valid JSON (Chrome/Perfetto format)
    names = {event.get("name") for event in trace["traceEvents"]}
    assert DATA_RANGE in names
    assert any(str(name).startswith("ProfilerStep#") for name in names)
    table = (out / "profile.txt").read_text()
    assert DATA_RANGE in table and "Self CPU" in table
    assert f"wrote {out / 'trace.json'}" in stdout
    # --profile is a diagnostic, not a setting of the run: it is not saved for reruns.
    assert "\nprofile:" not in (out / "config.yaml").read_text()


def test_an_exhausted_pipeline_ends_the_epoch_through_the_monitor(tmp_path):
    from turbotrain.train.records.monitor import RunMonitor
    monitor = RunMonitor(torch.device("cpu"), tmp_path, warmup_steps=0, profile=True)
    with pytest.raises(StopIteration):
        with monitor.waiting():
            next(iter([]))
    monitor.close()
    assert monitor.clock.flush().steps == []
