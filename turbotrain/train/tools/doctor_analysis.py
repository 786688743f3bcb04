"""What the hook measured, read into one report per training process: the shares of a step,
the verdict (records/verdict.py, the words `train` uses) and the findings
(doctor_findings.py). Pure: records in, a dict out, so every rule is tested on made-up
records as well as on real runs.
"""
from __future__ import annotations

import statistics

from ..records.verdict import verdict_of
from .doctor_findings import Measured, findings_of

SHARES = ("wait", "copy", "fwd_bwd", "optim", "other")
SHARE_NAMES = {"wait": "waiting for data", "copy": "copying to the device",
               "fwd_bwd": "forward + backward", "optim": "optimizer step",
               "other": "elsewhere in Python"}


def processes(files: dict[str, list[dict]]) -> list[dict]:
    """The training processes (those that stepped an optimizer, iterated a DataLoader or ran a
    model), each with the fetch records of its loader workers merged in; rank order."""
    by_pid = {}
    for records in files.values():
        start = next((r for r in records if r.get("kind") == "start"), None)
        if start is not None:
            by_pid[start["pid"]] = {"start": start, "records": list(records)}
    trainers = {pid: p for pid, p in by_pid.items()
                if any(r.get("kind") in ("step", "loader", "model") for r in p["records"])}
    for pid, p in by_pid.items():
        parent = trainers.get(p["start"].get("ppid"))
        if pid not in trainers and parent is not None:
            parent["records"] += [r for r in p["records"] if r.get("kind") == "fetch"]
    return sorted(trainers.values(), key=lambda p: (p["start"].get("rank") or 0,
                                                     p["start"]["pid"]))


def analyse(process: dict, machine: dict) -> dict:
    """One process's report: `machine` holds cores and bf16_native (measured by the parent)."""
    records = process["records"]
    kinds = {}
    for r in records:
        kinds.setdefault(r.get("kind"), []).append(r)
    steps = _timed_steps(kinds.get("step", []))
    report = {"pid": process["start"]["pid"], "rank": process["start"].get("rank"),
              "timed_steps": len(steps), "notes": [], "findings": [],
              "ended": (kinds.get("end") or [{}])[-1].get("reason")}
    loaders = kinds.get("loader", [])
    models = kinds.get("model", [])
    report["loaders"] = loaders
    report["model"] = models[-1] if models else None
    report["notes"] += _blind_spots(kinds, loaders, models)
    if not steps:
        report["verdict"] = "unknown"
        return report
    mean = {key: statistics.fmean(s[key] for s in steps)
            for key in ("dur", "wait", "copy", "fwd", "bwd", "optim", "batches", "images",
                        "forwards", "backwards", "syncs", "sync_s")}
    mean["faults"] = _faults_per_step(kinds.get("faults", []))
    mean["fwd_bwd"] = mean["fwd"] + mean["bwd"]
    mean["other"] = max(0.0, mean["dur"] - mean["wait"] - mean["copy"] - mean["fwd_bwd"]
                        - mean["optim"])
    shares = {k: (mean[k] / mean["dur"] if mean["dur"] > 0 else 0.0) for k in SHARES}
    report["step_ms"] = round(1000 * mean["dur"], 3)
    report["images_per_second"] = (round(mean["images"] / mean["dur"], 1)
                                   if mean["images"] and mean["dur"] > 0 else None)
    report["shares"] = {k: round(v, 4) for k, v in shares.items()}
    report["ms"] = {k: round(1000 * mean[k], 3) for k in SHARES}
    report["page_faults_per_step"] = round(mean["faults"], 1)
    gpu = [g["ms"] / 1000 for g in kinds.get("gpu", [])]
    report["gpu_busy_share"] = (round(min(1.0, statistics.median(gpu) / mean["dur"]), 4)
                                if gpu and mean["dur"] > 0 else None)
    report["verdict"] = verdict_of(shares["wait"], shares["fwd_bwd"] + shares["optim"],
                                   shares["copy"])
    fetches = kinds.get("fetch", []) + [  # loader workers' records, then this process's
        {"s": st["fetch_s"], "decode": st["decode_s"], "batches": st["fetched"]}
        for st in steps if st.get("fetched")]
    measured = Measured(
        step=mean, loader=loaders[-1] if loaders else None, model=report["model"],
        probe=(kinds.get("probe") or [None])[-1],
        # the mean, not the median: throughput pays for the slow batches too
        load_seconds=_per_batch(fetches),
        load_cpu_seconds=_cpu_per_batch(kinds.get("fetch", [])),
        decode_share=(sum(f["decode"] for f in fetches) / sum(f["s"] for f in fetches)
                      if fetches and sum(f["s"] for f in fetches) > 0 else 0.0),
        batch=(kinds.get("batch") or [None])[-1],
        syncs=(kinds.get("syncs") or [{}])[-1],
        gpu_seconds=statistics.median(gpu) if gpu else None,
        cores=machine["cores"], bf16_native=machine["bf16_native"],
        freed_memory_kept=machine.get("freed_memory_kept", False))
    report["load_ms_per_batch"] = (round(1000 * measured.load_seconds, 3)
                                   if measured.load_seconds is not None else None)
    report["load_cpu_ms_per_batch"] = (round(1000 * measured.load_cpu_seconds, 3)
                                       if measured.load_cpu_seconds is not None else None)
    report["decode_share"] = round(measured.decode_share, 4)
    report["findings"] = findings_of(measured)
    return report


def _faults_per_step(windows: list[dict]) -> float:
    """The training thread's page faults a step, over the lines of steps after warm-up (all of
    them when every line held a warm-up step); 0 where unmeasured."""
    timed = [w for w in windows if not w["warmup"]] or windows
    steps = sum(w["steps"] for w in timed)
    return sum(w["faults"] for w in timed) / steps if steps else 0.0


def _per_batch(fetches: list[dict]) -> float | None:
    """Mean seconds to load one batch; a step's own record may hold several batches."""
    batches = sum(f.get("batches", 1) for f in fetches)
    return sum(f["s"] for f in fetches) / batches if batches else None


def _cpu_per_batch(fetches: list[dict]) -> float | None:
    """Mean CPU seconds of a worker's batch (None: no worker recorded its CPU time)."""
    cpu = [f["cpu"] for f in fetches if isinstance(f.get("cpu"), (int, float))]
    return sum(cpu) / len(cpu) if cpu else None


def _timed_steps(steps: list[dict]) -> list[dict]:
    """The steps after warm-up; all of them when the script stepped too few times for one."""
    timed = [s for s in steps if not s.get("warmup")]
    return timed or steps


def _blind_spots(kinds: dict, loaders: list, models: list) -> list[str]:
    notes = []
    if not kinds.get("step"):
        notes.append("no torch.optim optimizer stepped: steps could not be timed, so there "
                     "are no shares, no verdict and no step-time findings")
    if not loaders:
        notes.append("no torch DataLoader was iterated: the wait for data is not measured "
                     "(whatever feeds the model counts as 'elsewhere in Python'), and the "
                     "loader findings (num_workers, pin_memory, PIL decode) were not checked")
    if not models:
        notes.append("no module with parameters ran a forward: the model's device, dtype and "
                     "memory format are unknown")
    if kinds.get("step") and not kinds.get("probe"):
        notes.append("the model was not probed (the script ended before the timed steps did): "
                     "findings that need a measured alternative were not checked")
    probe = (kinds.get("probe") or [{}])[-1]
    if probe.get("error"):
        notes.append(f"the probe of a model copy failed: {probe['error']}")
    for error in kinds.get("error", []):
        notes.append(f"the hook could not attach ({error.get('where')}): {error.get('error')}")
    return notes


def summary(reports: list[dict]) -> dict | None:
    """Across ranks: the slowest rank sets the pace (every rank waits for it at each
    all-reduce)."""
    timed = [r for r in reports if r.get("timed_steps")]
    if len(reports) < 2 or not timed:
        return None
    slowest = max(timed, key=lambda r: r["step_ms"])
    steps = [r["step_ms"] for r in timed]
    return {"ranks": len(reports), "slowest_rank": slowest["rank"],
            "step_ms": {"min": min(steps), "max": max(steps)},
            "verdict": slowest["verdict"],
            "verdicts": {str(r["rank"]): r["verdict"] for r in reports}}
