"""`RunMonitor`: the trainer's one handle on the step clock, memory peaks, the `--profile` trace
window, the timeline picture and the doctor's verdict.

The trainer calls, per micro-batch, `with monitor.waiting(): next(iterator)` and then
`monitor.computed()` (or `monitor.step_done(step)` after an optimizer step); per log window
`reset_window()` / `flush()` around its own synchronize, booking the flushed window in the run's
timing ledger (ledger.py); and `finish(run, ledger)` at the end, which diagnoses that ledger.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from ..step.device import peak_device_memory_bytes, peak_host_memory_bytes
from .doctor import Diagnosis, diagnose, facts_of_run
from .ledger import StepLedger
from .machine_load import LoadWatch
from .profiling import StepClock, TraceWindow, WindowTimes
from .timeline import TIMELINE_NAME, StepTimeline

# Optimizer steps `--profile` records: enough to see a steady pattern, small enough for a trace
# that Perfetto opens instantly (~2-20 MB).
PROFILE_STEPS = 10


class RunMonitor:
    def __init__(self, device: torch.device, run_dir: str | Path, *, warmup_steps: int,
                 profile: bool = False, writes_files: bool = True):
        self.device = device
        self.run_dir = Path(run_dir)
        self.writes_files = writes_files
        self.clock = StepClock(device)
        self.timeline = StepTimeline()
        # Trace the steps right after warm-up (compile and allocator warm-up would drown
        # the steady pattern); only the rank that writes files profiles.
        self.trace = (TraceWindow(self.run_dir, device, first_step=warmup_steps + 1,
                                  steps=PROFILE_STEPS) if profile and writes_files else None)
        self.process_step = 0  # optimizer steps done by this process
        self.last_window: WindowTimes | None = None
        self.load = LoadWatch()  # each window's pace beside the machine's load (the verdict's)

    # ------------------------------------------------------------------ the hot loop

    @contextlib.contextmanager
    def waiting(self):
        if self.trace is not None:
            with self.clock.untimed():  # starting the profiler takes ~10-100 ms
                self.trace.before_step(self.process_step + 1)
            with self.trace.data_range(), self.clock.waiting():
                yield
        else:
            with self.clock.waiting():
                yield

    def computed(self) -> None:
        """A micro-batch that does not end in an optimizer step has been queued."""
        self.clock.computed()

    def step_done(self, step: int) -> None:
        """Optimizer step `step` (the run's count) is queued."""
        self.clock.computed(step)
        self.process_step += 1
        if self.trace is not None:
            recording = self.trace.active
            with self.clock.untimed():  # the last profiled step exports the trace (~0.1-1 s)
                self.trace.after_step(self.process_step)
            if recording:  # the timeline shades the profiled steps
                first = self.timeline.profiled[0] if self.timeline.profiled else step
                self.timeline.profiled = (first, step)

    def epoch_started(self, step: int) -> None:
        self.timeline.mark_epoch(step + 1)

    def resumed(self, saved_timeline: dict | None, step: int) -> None:
        """A run resumed after optimizer step `step`: the timeline its checkpoint saved (None:
        a checkpoint from before timelines were saved) continues, marked where it resumed.
        Raises TypeError/ValueError for a saved timeline that is not one `state_dict` wrote."""
        if saved_timeline is not None:
            self.timeline.load_state_dict(saved_timeline)
        self.timeline.mark_resume(step + 1)

    # ------------------------------------------------------------------ windows

    def reset_window(self) -> None:
        """An untimed stretch (warm-up, evaluation, checkpoint) ended; the device is idle."""
        self.clock.reset()

    def flush(self) -> WindowTimes:
        """After the caller's synchronize: the window's timed steps (also drawn on the
        timeline); the caller books them in its ledger."""
        window = self.last_window = self.clock.flush()
        self.timeline.add(window.steps)
        self.load.sample(window.seconds, len(window.steps), window.data_wait)
        return window

    def window_record(self) -> dict:
        """The last flushed window for metrics.jsonl: mean ms per step and memory peaks."""
        window, record = self.last_window, {}
        if window is not None and window.steps:
            n = len(window.steps)
            record = {"data_wait_ms": 1000 * window.data_wait / n,
                      "compute_ms": 1000 * window.compute / n}
        return {**record, **self.memory()}

    def memory(self) -> dict:
        return {"peak_host_memory_bytes": peak_host_memory_bytes(),
                "peak_device_memory_bytes": peak_device_memory_bytes(self.device)}

    # ------------------------------------------------------------------ the end

    def finish(self, run, ledger: StepLedger) -> tuple[Diagnosis | None, list[Path]]:
        """Stops a running trace; writes timeline.png; returns the verdict on the run's
        `ledger` and the files. The rank that writes files diagnoses (the verdict is printed
        and saved there); the others return None."""
        files = self.trace.stop() if self.trace is not None else []
        diagnosis = None
        if self.writes_files:
            diagnosis = diagnose(facts_of_run(run, ledger, self.load.windows))
            title = f"{run.config.model}, {run.pipeline_name} pipeline, batch " \
                    f"{run.config.batch_size} on {self.device}"
            picture = self.timeline.plot(self.run_dir / TIMELINE_NAME, title)
            if picture is not None:
                files = [*files, picture]
        return diagnosis, list(files)

    def close(self) -> None:
        """Stops a trace left running by an error; safe to call twice."""
        if self.trace is not None and self.trace.active:
            self.trace.profiler.stop()
            self.trace.profiler = None
