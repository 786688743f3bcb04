"""Was the machine busy with something else? A run's step times read beside the machine's load.

On a shared machine the steps of a compute-bound run slow down when other processes take the
cores (1.1 s -> 5-14 s a step in issue 46's report), and the verdict must then say so instead of
advising a smaller model. At each log point `LoadWatch.sample` records the window's pace, its
data wait, the 1-minute load average (os.getloadavg) and the share of CPU time stolen by the
hypervisor since the last sample (/proc/stat's `steal`): two cheap reads per log point, none per
step. `busy_machine(windows, ...)` is the pure rule the doctor applies to them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .verdict import INPUT_BOUND

# A window whose steps took at least this multiple of the run's quiet pace is a slow one.
SLOW_FACTOR = 2.0
# Slow windows must hold at least this share of the timed seconds for the verdict to change.
BUSY_SHARE = 0.25
# Runnable threads beyond this run's own (load average less its torch threads and workers):
# one more core's worth of work competing for the cores.
OUTSIDE_LOAD = 1.0
STEAL = 0.05  # CPU time taken by the hypervisor for other guests
# Outside load of at least this share of the cores for the whole run: the run had about half
# the machine or less at every step, so its steps are no measure of the model.
SHARED_CORES = 0.5
QUIET_QUANTILE = 0.25  # the run's own pace: its faster windows'
MAX_WINDOWS = 512  # kept: when full, every other one is dropped (a few KB)
PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class LoadWindow:
    seconds: float  # the window's timed wall seconds
    steps: int
    data_wait: float  # share of the window waiting for batches
    load: float | None  # 1-minute load average at its end (None: not available here)
    steal: float | None  # share of CPU time stolen since the previous sample

    @property
    def step_seconds(self) -> float:
        return self.seconds / self.steps


@dataclass(frozen=True)
class Busy:
    quiet_step: float  # seconds a step when the machine was quiet
    slow_step: float  # ... in the slow windows (their median)
    slow_share: float  # of the timed seconds
    load: float | None  # the highest load average in a slow window
    steal: float | None  # the highest steal share in a slow window


def busy_machine(windows: list[LoadWindow], *, own_threads: int) -> Busy | None:
    """Whether the run's steps slowed while other work loaded the machine: slow windows
    (SLOW_FACTOR x the quiet pace, no data wait) hold BUSY_SHARE of the time and, in them, the
    load average exceeds the run's own threads by OUTSIDE_LOAD or the hypervisor stole STEAL."""
    timed = [w for w in windows if w.steps > 0 and w.seconds > 0]
    if len(timed) < 3:
        return None
    paces = sorted(w.step_seconds for w in timed)
    quiet = paces[int(QUIET_QUANTILE * (len(paces) - 1))]
    slow = [w for w in timed if w.step_seconds >= SLOW_FACTOR * quiet
            and w.data_wait < INPUT_BOUND]
    share = sum(w.seconds for w in slow) / sum(w.seconds for w in timed)
    if share < BUSY_SHARE:
        return None
    loads = [w.load for w in slow if w.load is not None]
    steals = [w.steal for w in slow if w.steal is not None]
    load, steal = (max(loads) if loads else None), (max(steals) if steals else None)
    outside = load is not None and load - own_threads >= OUTSIDE_LOAD
    if not (outside or (steal is not None and steal >= STEAL)):
        return None  # slower for a reason of its own (a larger size, a sync): not the machine
    slow_paces = sorted(w.step_seconds for w in slow)
    return Busy(quiet_step=quiet, slow_step=slow_paces[len(slow_paces) // 2],
                slow_share=share, load=load, steal=steal)


def shared_throughout(windows: list[LoadWindow], *, own_threads: int, cores: int
                      ) -> float | None:
    """The median load average when, all run long, other work kept at least half the cores
    (and OUTSIDE_LOAD) busy: no window is quiet, so no step time is this model's own (None:
    it was not, or the load is not known here)."""
    loads = sorted(w.load for w in windows if w.load is not None and w.steps > 0)
    if len(loads) < 3:
        return None
    median = loads[len(loads) // 2]
    return median if median - own_threads >= max(OUTSIDE_LOAD, SHARED_CORES * cores) else None


def read_cpu_times(path: Path = PROC_STAT) -> tuple[int, int] | None:
    """(all CPU time, stolen CPU time) in clock ticks since boot, from /proc/stat's `cpu` line;
    None where there is no such file (macOS, Windows) or it reads otherwise."""
    try:
        with open(path, "rb") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != b"cpu":
        return None
    try:
        ticks = [int(v) for v in fields[1:]]
    except ValueError:
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
    return sum(ticks[:8]), ticks[7]


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # not on Windows
        return None


class LoadWatch:
    """The log windows' pace beside the machine's load, sampled at each log point."""

    def __init__(self, cpu_times: Callable[[], tuple[int, int] | None] = read_cpu_times,
                 load: Callable[[], float | None] = load_average):
        self._cpu_times, self._load = cpu_times, load
        self._last = cpu_times()
        self.windows: list[LoadWindow] = []

    def sample(self, seconds: float, steps: int, data_wait: float) -> None:
        """After a flushed log window: `seconds` timed, `steps` optimizer steps, `data_wait`
        seconds of it waiting for batches."""
        now = self._cpu_times()
        steal = None
        if now is not None and self._last is not None and now[0] > self._last[0]:
            steal = (now[1] - self._last[1]) / (now[0] - self._last[0])
        self._last = now
        if steps <= 0 or seconds <= 0:
            return
        self.windows.append(LoadWindow(seconds, steps, data_wait / seconds, self._load(), steal))
        if len(self.windows) > MAX_WINDOWS:
            del self.windows[::2]
