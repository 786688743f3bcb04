"""`StepLedger`: the one account of where a run's training time went.

The trainer books each timing window once, here, after the log point's synchronize: its wall
seconds, the data wait and compute of its optimizer steps (profiling.StepClock: host clocks on
the CPU, CUDA events on a GPU) and the images they took. Warm-up steps (compile, allocator and
oneDNN/cuDNN plans) are booked apart, as `warmup_seconds`, and stay out of every rate;
evaluation and checkpoints are never booked. summary.json's images/s, data-wait fraction and
seconds (run_summary.py), the progress line's ETA and the bottleneck verdict (doctor.py) are all
read from these totals, so they cannot disagree.

With several ranks a window's data wait is the slowest rank's (every other rank waits for it
inside the gradient all-reduce, which their clocks count as compute), and its compute this
rank's. The ledger is saved in each checkpoint under "timing" (`state_dict`), so a resumed run's
totals cover the whole run; a checkpoint written before the ledger existed holds the same sums
as counters (`from_legacy_counters`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .profiling import WindowTimes

# The CUDA host-issue probes kept (one per log window): when full, every other one is dropped,
# so the median stays a median over the whole run in a few KB of checkpoint.
MAX_PROBES = 512
# Counters that held the ledger's sums in checkpoints written before it: name -> field.
LEGACY_COUNTERS = {"timed_seconds": "seconds", "timed_data_wait": "data_wait",
                   "timed_steps": "steps", "timed_images": "images",
                   "warmup_seconds": "warmup_seconds"}


@dataclass
class StepLedger:
    seconds: float = 0.0  # timed wall seconds (warm-up, evaluation and checkpoints excluded)
    data_wait: float = 0.0  # of them, the device waited for batches (the slowest rank's)
    compute: float = 0.0  # forward, backward and optimizer step; the rest is loop overhead
    steps: int = 0  # timed optimizer steps
    images: int = 0  # images of the timed steps, all ranks
    warmup_seconds: float = 0.0
    # CUDA: per window, host launch time / GPU span of its first step (profiling.py)
    host_issue_probes: list[float] = field(default_factory=list)

    def book(self, window: WindowTimes, images: int, data_wait: float) -> None:
        """A flushed window whose micro-batches took `images` images (all ranks'); `data_wait`
        is the window's data wait as the run counts it (the slowest rank's)."""
        if not window.steps and not images:
            return  # nothing ran: the seconds are the gap between two flushes
        self.seconds += window.seconds
        self.data_wait += data_wait
        self.compute += window.compute
        self.steps += len(window.steps)
        self.images += images
        if window.host_issue_fraction is not None:
            self.host_issue_probes.append(window.host_issue_fraction)
            if len(self.host_issue_probes) > MAX_PROBES:
                del self.host_issue_probes[::2]

    def book_warmup(self, seconds: float) -> None:
        self.warmup_seconds += seconds

    # ------------------------------------------------------------------ what is read

    @property
    def images_per_second(self) -> float | None:
        return self.images / self.seconds if self.seconds > 0 else None

    @property
    def data_wait_fraction(self) -> float | None:
        return self.data_wait / self.seconds if self.seconds > 0 else None

    @property
    def mean_step_seconds(self) -> float:
        return self.seconds / self.steps if self.steps else 0.0

    @property
    def host_issue_fraction(self) -> float | None:
        """The median probe: one window's can catch a GC pause or a checkpoint's I/O."""
        probes = sorted(self.host_issue_probes)
        return probes[len(probes) // 2] if probes else None

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_state(cls, saved: dict) -> StepLedger:
        """From `state_dict()`'s output, each value checked (TypeError/ValueError otherwise:
        the caller reports a damaged checkpoint)."""
        ledger = cls(**saved)
        for f in dataclasses.fields(cls):
            value = getattr(ledger, f.name)
            values = value if isinstance(value, list) else [value]
            if f.name == "host_issue_probes" and not isinstance(value, list):
                raise TypeError(f"timing {f.name!r} is {value!r:.60}")
            kinds = (int,) if isinstance(f.default, int) else (int, float)
            for v in values:
                if type(v) not in kinds:
                    raise TypeError(f"timing {f.name!r} is {value!r:.60}")
                if not v >= 0:
                    raise ValueError(f"timing {f.name!r} is {value!r:.60}")
        return ledger

    @classmethod
    def from_legacy_counters(cls, counters: dict) -> StepLedger:
        """The ledger of a checkpoint from before it: its counters held the sums
        (LEGACY_COUNTERS), but no compute total; all of a timed second that was not data wait
        is taken for compute, as that run's summary counted it."""
        ledger = cls.from_state({name: counters[key] for key, name in LEGACY_COUNTERS.items()
                                 if key in counters})
        ledger.compute = max(0.0, ledger.seconds - ledger.data_wait)
        return ledger
