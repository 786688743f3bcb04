"""The doctor's probe (tools/doctor_probe.py): how many passes each variant gets and which
time stands for it, and the current thread count probed once, as the base; and the hook's step
records (tools/doctor_hook.py) written as rows and read back (doctor_run.read_measurements)."""
from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import torch

from turbotrain.train.tools import doctor_probe as probe
from turbotrain.train.tools.doctor_analysis import _faults_per_step
from turbotrain.train.tools.doctor_hook import STEP_FIELDS, StepClock
from turbotrain.train.tools.doctor_run import read_measurements


def _fake_passes(monkeypatch, seconds_of: dict):
    """_pass returns each variant's next time from `seconds_of` (by its input's batch size)."""
    calls: dict = {}

    def fake_pass(model, x, autocast):
        key = int(x.shape[0])
        calls[key] = calls.get(key, 0) + 1
        value = next(seconds_of[key])
        if isinstance(value, Exception):
            raise value
        return value
    monkeypatch.setattr(probe, "_pass", fake_pass)
    return calls


def test_short_passes_repeat_to_their_time_and_the_fastest_stands_for_them(monkeypatch):
    # a 1 ms pass that is slow (3 ms) for its first 20 passes, as in a slow spell
    calls = _fake_passes(monkeypatch, {
        1: itertools.chain([0.003] * 20, itertools.repeat(0.001)),
        2: itertools.chain([0.5, 0.5, 0.004], itertools.repeat(0.005)),
        3: itertools.repeat(RuntimeError("out of memory\nmore"))})
    times = probe._interleaved({"short": (None, torch.zeros(1), None, 1),
                                "other": (None, torch.zeros(2), None, 1),
                                "failing": (None, torch.zeros(3), None, 1)})
    assert times["short"] == 0.001  # the fastest, found past the slow spell
    assert times["other"] == 0.004  # the untimed first passes do not count
    assert times["failing"] == {"error": "out of memory"} and calls[3] == 1
    # neither reached PROBE_SECONDS (0.2 s at most of the short one): MAX_ROUNDS each
    assert calls[1] == calls[2] == probe.UNTIMED + probe.MAX_ROUNDS


def test_a_long_variant_beside_a_short_one_stops_at_the_budget(monkeypatch):
    calls = _fake_passes(monkeypatch, {1: itertools.repeat(0.001), 2: itertools.repeat(0.3)})
    probe._interleaved({"a": (None, torch.zeros(1), None, 1),
                        "b": (None, torch.zeros(2), None, 1)})
    # 0.301 s a round: the budget (2 s) is spent after 7 timed rounds, past the 5 repeats
    assert calls[2] == probe.UNTIMED + 7


def test_rounds_end_once_every_variant_has_its_seconds(monkeypatch):
    calls = _fake_passes(monkeypatch, {1: itertools.repeat(0.125), 2: itertools.repeat(0.0625)})
    probe._interleaved({"a": (None, torch.zeros(1), None, 1),
                        "b": (None, torch.zeros(2), None, 1)})
    # the 1/8 s passes had their 5 repeats after 5 rounds, the 1/16 s ones their 0.5 s after 8
    # (1.5 s in all, within the budget)
    assert calls[1] == calls[2] == probe.UNTIMED + 8


def test_the_current_thread_count_is_the_base_probed_once(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    written = []
    clock = SimpleNamespace(last_root=model, last_input=torch.randn(2, 4), facts={},
                            activation_bytes=0, probing=False,
                            recorder=SimpleNamespace(write=written.append))
    monkeypatch.setitem(probe.CONFIG, "cores", 2)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        probe.run_probes(clock)
    finally:
        torch.set_num_threads(threads)
    record = written[-1]
    assert "error" not in record, record
    assert set(record["threads"]) == {"1", "2"} and record["threads"]["2"] == record["base"]
    assert clock.probing is False


def test_variants_at_different_thread_counts_get_the_repeats_only(monkeypatch):
    calls = _fake_passes(monkeypatch, {1: itertools.repeat(0.001), 2: itertools.repeat(0.001)})
    threads = torch.get_num_threads()
    try:
        times = probe._interleaved({"base": (None, torch.zeros(1), None, threads),
                                    "other": (None, torch.zeros(2), None, threads + 1)})
    finally:
        torch.set_num_threads(threads)
    assert calls[1] == calls[2] == probe.UNTIMED + probe.PROBE_REPEATS
    assert times == {"base": 0.001, "other": 0.001}


class _Recorder:
    flushed = 0.0

    def __init__(self):
        self.records, self.flush_every = [], float("inf")

    def write(self, record):
        self.records.append(json.loads(json.dumps(record)))  # as the file would hold it

    @property
    def flush_due(self) -> bool:
        return self.flush_every == 0.0

    @flush_due.setter
    def flush_due(self, due: bool) -> None:
        self.flush_every = 0.0 if due else float("inf")

    def flush(self):
        pass


def test_steps_are_written_as_rows_and_read_back_as_step_records(tmp_path):
    recorder = _Recorder()
    clock = StepClock(recorder)
    optimizer = object()
    for _ in range(4):
        clock.optimizer_post(optimizer, (), {})
    assert recorder.records == []  # not due: the rows wait in memory
    recorder.flush_due = True
    clock.optimizer_post(optimizer, (), {})
    assert [r["kind"] for r in recorder.records] == ["steps"]
    assert len(recorder.records[0]["rows"]) == 4  # the first step end only starts the clock
    recorder.flush_due = False
    clock.optimizer_post(optimizer, (), {})
    clock.finish("measured")  # writes what is left
    folder = tmp_path / "measurements"
    folder.mkdir()
    (folder / "1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recorder.records))
    steps = [r for r in read_measurements(folder)["1"] if r["kind"] == "step"]
    assert [s["i"] for s in steps] == [1, 2, 3, 4, 5]
    assert set(steps[0]) == {"kind", *STEP_FIELDS} and steps[0]["warmup"] is True


def test_the_hook_lets_go_of_the_model_once_it_is_measured():
    # a DDP model it kept alive outlived its process group at the script's exit: an abort
    clock = StepClock(_Recorder())
    model = torch.nn.Linear(2, 2)
    clock.roots, clock.last_root, clock.last_input = [model], model, torch.zeros(1, 2)
    probed = []
    clock.run_probes = probed.append
    clock.finish("measured")
    assert probed == [clock]
    assert clock.roots == [] and clock.last_root is None and clock.last_input is None


def test_each_line_of_steps_carries_the_page_faults_of_its_steps(monkeypatch, tmp_path):
    from turbotrain.train.tools import doctor_hook
    # the training thread's fault counter: read at the first step's end, then at each line
    readings = iter([100, 140, 1140])
    monkeypatch.setattr(doctor_hook, "_minor_faults", lambda: next(readings))
    recorder = _Recorder()
    clock = StepClock(recorder)
    clock.warmup = 2
    optimizer = object()
    for _ in range(3):
        clock.optimizer_post(optimizer, (), {})  # the end of warm-up writes its line: steps 1 and 2
    for _ in range(4):
        clock.optimizer_post(optimizer, (), {})
    clock.write_step_rows()  # steps 3 to 6
    assert [r["faults"] for r in recorder.records if r["kind"] == "steps"] == [40, 1000]
    folder = tmp_path / "measurements"
    folder.mkdir()
    (folder / "1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recorder.records))
    windows = [r for r in read_measurements(folder)["1"] if r["kind"] == "faults"]
    assert windows == [{"kind": "faults", "faults": 40, "steps": 2, "warmup": True},  # alone
                       {"kind": "faults", "faults": 1000, "steps": 4, "warmup": False}]
    # the mean a step over the lines after warm-up
    assert _faults_per_step(windows) == 250
    assert _faults_per_step(windows[:1]) == 20  # only warm-up lines: all of them


def test_the_cost_of_a_page_fault_is_probed_against_warm_writes():
    if probe._minor_faults() == 0:  # no getrusage (Windows)
        assert probe._fault_probe() == {}
        return
    threads = torch.get_num_threads()
    cost = probe._fault_probe()["fault_seconds"]
    torch.set_num_threads(threads)  # run_probes restores it; called alone here
    # a fault costs 0.1-20 us on any machine (1.4 us on the 2-core dev VM); a probe that
    # timed no fault or all of the writes would fall outside
    assert 1e-7 < cost < 2e-5
