"""The bottleneck verdict in one pure function of the measured shares of a step: what `train`'s
doctor (records/doctor.py) and `turbotrain doctor` (tools/doctor_*.py) both say, in the same
words. A leaf: no imports, so the script doctor's parent process never loads torch for it.

* input-bound: at least INPUT_BOUND of the step waits for the next batch;
* copy-bound: at least COPY_BOUND goes to copying batches to the device (train's pipelines hand
  batches over on the device, so train never measures a copy and never says it);
* host-bound: the GPU finishes right after the host's last launch, or the loop's own overhead
  (outside data, copy and compute) takes at least HOST_BOUND;
* compute-bound: otherwise.
"""
from __future__ import annotations

# TensorFlow's profiler calls a run "highly input-bound" from 20 % of step time waiting for
# input: removing a 20 % wait makes the run 1.25x faster, worth changing the pipeline for.
INPUT_BOUND = 0.20
# A copy taking 20 % of the step is the same 1.25x, and pinned memory + non_blocking removes
# most of it.
COPY_BOUND = 0.20
# Host launch time / GPU span of a step at or above this: the GPU idles until Python has
# launched the last kernel, so a faster GPU would not help (85 %: within the probe's noise).
HOST_ISSUE_BOUND = 0.85
HOST_BOUND = 0.20  # loop overhead (logging, syncs) outside data wait and compute

VERDICTS = ("input-bound", "copy-bound", "host-bound", "compute-bound")


def verdict_of(wait: float, compute: float, copy: float = 0.0,
               host_issue_fraction: float | None = None) -> str:
    """`wait`, `compute`, `copy`: fractions of the step's wall time. The first rule that holds
    wins, in VERDICTS' order (host-bound by launch time before the overhead rule)."""
    overhead = max(0.0, 1.0 - wait - compute - copy)
    if wait >= INPUT_BOUND:
        return "input-bound"
    if copy >= COPY_BOUND:
        return "copy-bound"
    if host_issue_fraction is not None and host_issue_fraction >= HOST_ISSUE_BOUND:
        return "host-bound"
    if overhead >= HOST_BOUND:
        return "host-bound"
    return "compute-bound"
