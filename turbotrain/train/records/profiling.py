"""Where each training step's time goes: waiting for data vs forward/backward/step.

`StepClock` splits every optimizer step into *data wait* and *compute*:

* CPU: the loop is the device, so `time.perf_counter` around `next(iterator)` is the wait and
  the rest of the micro-batch (forward, backward, optimizer step) is the compute.
* CUDA: the host runs ahead of the GPU, so host clocks would count GPU work as "waiting". Two
  CUDA events per micro-batch, recorded when the batch arrives and when its work is queued,
  are read after the trainer's synchronize at each log point: event start -> end is the GPU's
  compute span, the previous end -> this start is how long the GPU sat idle waiting for the
  batch. Nothing here synchronises: the only syncs are the trainer's, one per log window.
  The probe: a window's first step starts on an idle GPU (the log point synchronised it), so
  its GPU span (events) is the longer of its GPU work and the host's launching; host launch
  time / that span says whether the GPU waits for Python (a ratio near 1: the GPU finished
  right after the last launch) or the host waits for the GPU. (It used to synchronise after
  that step to time the same span on the host clock: a second sync in every window.)

`TraceWindow` records a few steps after warm-up with `torch.profiler`: RUNDIR/trace.json
(chrome://tracing or ui.perfetto.dev) and RUNDIR/profile.txt (top operators by self time).
The batch fetch is the labelled range DATA_RANGE in both.
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from turbotrain.files.safe_create import replacing_path, write_file

DATA_RANGE = "data_loading"  # the profiler label of `next(iterator)`
TRACE_NAME = "trace.json"
PROFILE_TABLE_NAME = "profile.txt"
TOP_OPERATORS = 25  # rows of profile.txt
# Kineto (the profiler's C++ side) logs to stderr: on a CPU it has nothing to say but its
# start/stop markers and "gpuGetDeviceCount failed with code 35" (it asks the CUDA runtime for
# GPUs there are none of). Its logger reads KINETO_LOG_LEVEL when the first profile starts;
# above its last level (USDT, 5) it prints nothing. Set for CPU runs only, and only when the
# user has not set it: on CUDA its errors are worth seeing.
KINETO_QUIET = "6"


@dataclass(frozen=True)
class StepTime:
    step: int
    data_wait: float  # seconds the device waited for this step's batches
    compute: float  # seconds of forward, backward and optimizer step


@dataclass
class WindowTimes:
    """One timing window (log interval) of finished optimizer steps."""
    seconds: float  # wall time, measured after a synchronize
    steps: list[StepTime] = field(default_factory=list)
    host_issue_fraction: float | None = None  # CUDA probe (see the module docstring)

    @property
    def data_wait(self) -> float:
        return sum(s.data_wait for s in self.steps)

    @property
    def compute(self) -> float:
        return sum(s.compute for s in self.steps)


@dataclass
class _Micro:
    host_wait: float
    device_was_idle: bool  # after a synchronize: its gap is the host wait
    start: object = None  # torch.cuda.Event
    end: object = None


class StepClock:
    """Use: `reset()` at a window start (device synchronised), `with waiting(): next(it)` per
    micro-batch, then `computed(step)` once its work is queued (`step` set when it ended in an
    optimizer step), and `flush()` after synchronising at the window's end."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._events: list = []  # reused across windows: creating events each step costs too
        self.reset()

    def reset(self) -> None:
        self.window_start = time.perf_counter()
        self._done: list = []  # CPU: StepTime; CUDA: (step, [_Micro])
        self._micros: list[_Micro] = []
        self._wait = self._compute = 0.0  # host seconds of the step so far
        self._arrived = self.window_start
        self._next_idle = True
        self._used_events = 0
        self._probe_host: float | None = None  # host seconds launching the first step

    def _event(self):
        if self._used_events == len(self._events):
            self._events.append(torch.cuda.Event(enable_timing=True))
        self._used_events += 1
        event = self._events[self._used_events - 1]
        event.record()
        return event

    @contextlib.contextmanager
    def waiting(self):
        start = time.perf_counter()
        yield  # StopIteration from next() propagates, and nothing is recorded
        self._arrived = time.perf_counter()
        wait = self._arrived - start
        self._wait += wait
        if self.cuda:
            self._micros.append(_Micro(wait, self._next_idle, start=self._event()))
            self._next_idle = False

    def computed(self, step: int | None = None) -> None:
        self._compute += time.perf_counter() - self._arrived
        if self.cuda and self._micros:
            self._micros[-1].end = self._event()
        if step is None:
            return
        if not self.cuda:
            self._done.append(StepTime(step, self._wait, self._compute))
        else:
            self._done.append((step, self._micros))
            if len(self._done) == 1:  # the probe's host side; its GPU side is in the events
                self._probe_host = self._compute
            self._micros = []
        self._wait = self._compute = 0.0

    @contextlib.contextmanager
    def untimed(self):
        """Work inside (a profiler export) is left out of the window's wall time."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.window_start += time.perf_counter() - start

    def flush(self) -> WindowTimes:
        """The window's finished steps; the caller has synchronised the device."""
        seconds = time.perf_counter() - self.window_start
        if not self.cuda:
            times = WindowTimes(seconds, list(self._done))
        else:
            steps = self._device_steps()
            probe = None
            if steps and self._probe_host is not None and steps[0].compute > 0:
                probe = min(1.0, self._probe_host / steps[0].compute)
            times = WindowTimes(seconds, steps, probe)
        self.reset()
        return times

    def _device_steps(self) -> list[StepTime]:
        steps, previous_end = [], None
        for step, micros in self._done:
            wait = compute = 0.0
            for m in micros:
                if m.device_was_idle or previous_end is None:
                    wait += m.host_wait
                else:  # elapsed_time is in milliseconds
                    wait += max(0.0, previous_end.elapsed_time(m.start) / 1000)
                compute += m.start.elapsed_time(m.end) / 1000
                previous_end = m.end
            steps.append(StepTime(step, wait, compute))
        return steps


# ---------------------------------------------------------------------------- trace

class TraceWindow:
    """`torch.profiler` over optimizer steps `first_step`..`first_step + steps - 1` (counted in
    this process), then trace.json and profile.txt in `run_dir`. Stopped early, it writes what
    it recorded."""

    def __init__(self, run_dir: str | Path, device: torch.device, *, first_step: int,
                 steps: int):
        self.run_dir = Path(run_dir)
        self.device = device
        self.first_step = first_step
        self.last_step = first_step + steps - 1
        self.profiler = None
        self.recorded_steps = 0
        self.written: list[Path] = []

    @property
    def active(self) -> bool:
        return self.profiler is not None

    def data_range(self):
        """The label around a batch fetch while recording; a no-op otherwise."""
        if self.profiler is None:
            return contextlib.nullcontext()
        return torch.profiler.record_function(DATA_RANGE)

    def before_step(self, process_step: int) -> None:
        """Called before fetching the batches of optimizer step `process_step` (1-based)."""
        if process_step == self.first_step and self.profiler is None and not self.written:
            from torch.profiler import ProfilerAction, ProfilerActivity, profile
            activities = [ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            else:
                os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET)
            # A schedule (always recording: the window is started and stopped here) makes the
            # profiler mark each optimizer step as a ProfilerStep#N range.
            self.profiler = profile(activities=activities, record_shapes=False,
                                    with_stack=False, schedule=lambda _: ProfilerAction.RECORD)
            self.profiler.start()

    def after_step(self, process_step: int) -> None:
        if self.profiler is None:
            return
        self.profiler.step()  # marks ProfilerStep#N in the trace
        self.recorded_steps += 1
        if process_step >= self.last_step:
            self.stop()

    def stop(self) -> list[Path]:
        if self.profiler is None:
            return self.written
        profiler, self.profiler = self.profiler, None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        profiler.stop()
        trace = self.run_dir / TRACE_NAME
        with replacing_path(trace) as tmp:
            profiler.export_chrome_trace(str(tmp))
        sort = "self_cuda_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        table = profiler.key_averages().table(sort_by=sort, row_limit=TOP_OPERATORS)
        text = self.run_dir / PROFILE_TABLE_NAME
        write_file(text, f"top {TOP_OPERATORS} operators by self time over "
                         f"{self.recorded_steps} optimizer step(s); the batch fetch is "
                         f"'{DATA_RANGE}'\n{table}\n")
        self.written = [trace, text]
        return self.written
