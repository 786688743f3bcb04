"""Step timing, the --profile trace and the timeline picture."""
from __future__ import annotations

import json
import time

import pytest
import torch

from turbotrain.train.profiling import DATA_RANGE, StepClock, StepTime
from turbotrain.train.timeline import StepTimeline

from .conftest import FAST


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


def test_timeline_stays_bounded_and_keeps_every_step():
    timeline = StepTimeline(max_points=8)
    timeline.add([StepTime(i, 0.01, 0.02) for i in range(1, 101)])
    assert len(timeline) <= 8 and sum(timeline.counts) == 100
    assert list(timeline.first_step) == sorted(timeline.first_step)
    assert sum(timeline.data_wait) == pytest.approx(1.0)


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
    from turbotrain.train.monitor import RunMonitor
    monitor = RunMonitor(torch.device("cpu"), tmp_path, warmup_steps=0, profile=True)
    with pytest.raises(StopIteration):
        with monitor.waiting():
            next(iter([]))
    monitor.close()
    assert monitor.clock.flush().steps == []
