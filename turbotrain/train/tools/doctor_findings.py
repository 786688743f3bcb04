"""The doctor's findings: each rule is a pure function of what the hook measured in the loop
(the mean step, split into wait / copy / forward+backward / optimizer / other), the loader and
model it saw, and the probe of a model copy (doctor_probe.py). A finding names the evidence,
the change (a code line), and its expected speedup from a stated model of the step built on
measured numbers only:

* a change to one part of the step replaces that part's measured time by the probe's measured
  time for the alternative (Amdahl: the rest of the step is kept as measured);
* loader workers overlap loading with the step: step = max(the main thread's work, the
  measured load time per batch / workers).

Findings with a gain under MIN_GAIN are dropped. The rest are ranked in two kinds: first the
changes to the script itself (a flag, a line: their gain is the model above, on the script's
own measurements) by gain, then the switches to another loader (`turbotrain.Loader` for a PIL
hot spot), whose gain is an upper bound of another nature (the whole wait removed), so it
never outranks a measured fix of the script that it would only hide.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..step.host_memory import MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES

MIN_GAIN = 1.05  # below 5 % a change is within run-to-run noise
SOME_WAIT = 0.05  # the loader is keeping up below this share of the step
INPUT_BOUND_WAIT = 0.20  # records/verdict.py's input-bound threshold
DECODE_HOT = 0.50  # PIL decode at least half of loading a batch
FAR_BELOW = 4  # "a batch far below memory": at least 4x the batch fits


@dataclass(frozen=True)
class Measured:
    step: dict  # mean seconds per step: dur, wait, copy, fwd_bwd, optim, other, counts
    loader: dict | None
    model: dict | None
    probe: dict | None
    load_seconds: float | None  # mean seconds to fetch one batch (worker or main process)
    decode_share: float  # PIL decode / fetch time
    batch: dict | None  # the first batch's device and pinning
    syncs: dict
    gpu_seconds: float | None  # median GPU span of a step (CUDA events)
    cores: int
    bf16_native: bool
    load_cpu_seconds: float | None = None  # the workers' CPU time per batch (no contention)
    freed_memory_kept: bool = False  # the script's environment has KEEP_FREED_MEMORY already

    def probed(self, name: str) -> float | None:
        value = (self.probe or {}).get(name)
        return value if isinstance(value, (int, float)) else None

    def threads_probe(self) -> dict[int, float]:
        times = (self.probe or {}).get("threads") or {}
        return {int(k): v for k, v in times.items() if isinstance(v, (int, float))}

    @property
    def torch_threads(self) -> int:
        return int((self.probe or {}).get("threads_now") or (self.model or {}).get(
            "torch_threads") or 1)


SCRIPT, SWITCH = "script", "switch"  # a change to the script; a switch to another loader


def findings_of(m: Measured) -> list[dict]:
    found = [rule(m) for rule in RULES]
    return ranked([f for f in found if f is not None and f["gain"] >= MIN_GAIN])


def ranked(found: list[dict]) -> list[dict]:
    """The script's own fixes by gain, then the switches by gain (see the module's doc)."""
    return sorted(found, key=lambda f: (f["kind"] != SCRIPT, -f["gain"]))


def _finding(name: str, title: str, evidence: list[str], change: str, now: float, new: float,
             how: str, site: str | None = None, settings: dict | None = None,
             kind: str = SCRIPT) -> dict:
    """`settings`: the change as values (workers, threads, batch_size, ...), for a program
    that applies it (bench/bench_doctor.py)."""
    return {"id": name, "title": title, "kind": kind, "evidence": evidence, "change": change,
            "gain": round(now / new, 3) if new > 0 else 1.0, "predicted_step_ms":
            round(1000 * new, 3), "estimate": how, "site": site, "settings": settings or {}}


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f} ms"


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole > 0 else "?"


# ------------------------------------------------------------------------- the data side

def _best_split(m: Measured, load: float, rest: float, compute_at) -> tuple | None:
    """(step, workers, threads, compute) of the split of the cores between loader workers and
    torch threads (workers + threads <= cores) with the shortest step, where step = max(the
    main thread's forward+backward at t threads + `rest`, `load` seconds a step / workers)."""
    best = None
    for t in sorted(m.threads_probe()) or [m.torch_threads]:
        for workers in range(1, m.cores - t + 1):
            compute = compute_at(t)
            new = max(compute + rest, load / workers)
            if best is None or new < best[0]:
                best = (new, workers, t, compute)
    return best


def no_workers(m: Measured) -> dict | None:
    s, loader = m.step, m.loader
    if loader is None or loader["num_workers"] != 0 or m.load_seconds is None \
            or s["wait"] < SOME_WAIT * s["dur"] or m.cores < 2:
        return None
    threads, probe = m.torch_threads, m.threads_probe()
    rest = s["optim"] + s["copy"] + s["other"]
    batches = max(1.0, s["batches"])
    best = _best_split(m, batches * m.load_seconds, rest, lambda t: s["fwd_bwd"] * (
        probe[t] / probe[threads] if t in probe and threads in probe else 1.0))
    if best is None:
        return None
    new, workers, t, compute = best
    change = f"DataLoader(..., num_workers={workers})"
    if t != threads:
        change += f"; torch.set_num_threads({t})"
    evidence = [f"num_workers=0: {_share(s['wait'], s['dur'])} of each {_ms(s['dur'])} step "
                f"waits for data; loading a batch takes {_ms(m.load_seconds)} in the "
                "training process",
                f"{m.cores} cores, {threads} torch threads"]
    if m.decode_share >= DECODE_HOT:
        evidence.append(f"PIL decode is {m.decode_share:.0%} of loading: if the run is still "
                        "input-bound with workers, `turbotrain prepare-dataset` + "
                        "`turbotrain.Loader` decode in C threads instead")
    how = (f"step = max(forward+backward at {t} thread(s) {_ms(compute)} (the loop's "
           f"{_ms(s['fwd_bwd'])} x the probe's {t}-thread/{threads}-thread ratio) + the rest "
           f"{_ms(rest)}, {batches:g} batch(es) x {_ms(m.load_seconds)} / {workers} "
           f"worker(s)) = {_ms(new)}, against {_ms(s['dur'])} now")
    return _finding("num_workers", "the DataLoader loads in the training process",
                    evidence, change, s["dur"], new, how, loader.get("site"),
                    {"workers": workers, "threads": t})


def oversubscribed(m: Measured) -> dict | None:
    s, loader = m.step, m.loader
    if loader is None or loader["num_workers"] == 0:
        return None
    workers, threads, probe = loader["num_workers"], m.torch_threads, m.threads_probe()
    if workers + threads <= m.cores or not probe:
        return None
    # the probe ran while the workers idled: forward+backward without the contention
    passes = max(1.0, s["backwards"])
    # loading a batch as it will cost with a core of its own: the workers' CPU time (their
    # wall time counts the waits for the cores they fought over, the mistake itself)
    load = max(1.0, s["batches"]) * (m.load_cpu_seconds or m.load_seconds or 0.0)
    rest = s["optim"] + s["copy"] + s["other"]
    best = _best_split(m, load, rest, lambda t: probe[t] * passes)
    if best is None:
        return None
    new, new_workers, t, compute = best
    change = f"torch.set_num_threads({t})"
    if new_workers != workers:
        change = f"DataLoader(..., num_workers={new_workers}); " + change
    alone = probe.get(threads)
    evidence = [f"{workers} loader worker(s) + {threads} torch threads on {m.cores} cores",
                f"forward+backward takes {_ms(s['fwd_bwd'])} a step in the loop"
                + (f" but {_ms(alone)} on a copy while the workers were idle: "
                   f"{s['fwd_bwd'] / max(alone, 1e-9):.1f}x slower from the contention"
                   if alone else "")]
    how = (f"step = max(forward+backward at {t} thread(s) measured alone {_ms(compute)} + "
           f"the rest {_ms(rest)}, loading {_ms(load)} a step"
           f"{' (CPU time of the workers)' if m.load_cpu_seconds else ''} / {new_workers} "
           "worker(s))"
           f" = {_ms(new)}, against {_ms(s['dur'])} now")
    return _finding("oversubscribed", "loader workers and torch threads share too few cores",
                    evidence, change, s["dur"], new, how, loader.get("site"),
                    {"workers": new_workers, "threads": t})


def pil_decode(m: Measured) -> dict | None:
    s, loader = m.step, m.loader
    if loader is None or loader["num_workers"] == 0 or m.decode_share < DECODE_HOT \
            or s["wait"] < INPUT_BOUND_WAIT * s["dur"]:
        return None
    new = s["dur"] - s["wait"]
    root = loader.get("root")
    out = "PREPARED"
    change = (f"turbotrain prepare-dataset {root or 'SOURCE'} {out}; then "
              f"turbotrain.Loader('{out}', batch_size={loader.get('batch_size')}) in place of "
              "the DataLoader")
    evidence = [f"PIL decode is {m.decode_share:.0%} of loading a batch "
                f"({_ms(m.load_seconds or 0)} a batch in {loader['num_workers']} worker(s))",
                f"{_share(s['wait'], s['dur'])} of each step waits for data"]
    if root:
        evidence.append(f"`turbotrain bench --data {out}` measures our pipelines' images/s "
                        "on the same images")
    how = (f"at most: the whole wait removed (Amdahl), {_ms(s['dur'])} -> {_ms(new)} a step")
    return _finding("pil_decode", "per-sample PIL decode is the hot spot", evidence, change,
                    s["dur"], new, how, loader.get("site"), {"loader": "turbotrain"}, SWITCH)


def pin_memory(m: Measured) -> dict | None:
    s, loader = m.step, m.loader
    pageable, pinned = m.probed("copy_pageable"), m.probed("copy_pinned")
    if loader is None or loader["pin_memory"] or not _on_cuda(m) or not pageable \
            or pinned is None or s["copy"] <= 0:
        return None
    copy = s["copy"] * pinned / pageable
    new = s["dur"] - s["copy"] + copy
    how = (f"the loop's copy {_ms(s['copy'])} x the probe's pinned/pageable copy time "
           f"({_ms(pinned)}/{_ms(pageable)}) = {_ms(copy)}")
    return _finding("pin_memory", "batches are copied to the GPU from pageable memory",
                    [f"pin_memory=False; copying takes {_share(s['copy'], s['dur'])} of the "
                     "step"],
                    "DataLoader(..., pin_memory=True); x = x.to('cuda', non_blocking=True)",
                    s["dur"], new, how, loader.get("site"), {"pin_memory": True})


# ------------------------------------------------------------------------- the model side

def _on_cuda(m: Measured) -> bool:
    return (m.model or {}).get("device", "").startswith("cuda")


def cpu_model(m: Measured) -> dict | None:
    s, model, on_cuda, base = m.step, m.model or {}, m.probed("on_cuda"), m.probed("base")
    if not model.get("cuda_available") or _on_cuda(m) or on_cuda is None or not base:
        return None
    copy = max(1.0, s["batches"]) * (m.probed("copy_pinned") or 0.0)
    compute = s["fwd_bwd"] * on_cuda / base
    new = s["dur"] - s["fwd_bwd"] + compute + copy
    how = (f"forward+backward {_ms(s['fwd_bwd'])} x the probe's GPU/CPU ratio "
           f"({_ms(on_cuda)}/{_ms(base)}) + the batch's pinned copy {_ms(copy)}")
    return _finding("cpu_model", "the model runs on the CPU while a GPU sits idle",
                    [f"parameters on {model.get('device')}, torch.cuda.is_available() is True"],
                    "model.to('cuda'); x, y = x.to('cuda', non_blocking=True), "
                    "y.to('cuda', non_blocking=True)", s["dur"], new, how,
                    settings={"device": "cuda"})


def _faster_compute(m: Measured, probe_name: str) -> tuple[float, str] | None:
    s, variant, base = m.step, m.probed(probe_name), m.probed("base")
    if variant is None or not base:
        return None
    compute = s["fwd_bwd"] * variant / base
    how = (f"forward+backward {_ms(s['fwd_bwd'])} x the probe's ratio "
           f"({_ms(variant)}/{_ms(base)}) = {_ms(compute)}; the rest of the step as measured")
    return s["dur"] - s["fwd_bwd"] + compute, how


def bf16(m: Measured) -> dict | None:
    faster = _faster_compute(m, "bf16")
    if faster is None:
        return None
    device = "cuda" if _on_cuda(m) else "cpu"
    native = ("this GPU does bf16 natively" if device == "cuda" else
              "this CPU does bf16 in hardware (avx512_bf16/amx)")
    return _finding("bf16", "fp32 where bf16 autocast is native",
                    [f"parameters {m.model.get('dtype')}, autocast off; {native}"],
                    f"with torch.autocast('{device}', dtype=torch.bfloat16): "
                    "loss = criterion(model(x), y)", m.step["dur"], *faster,
                    settings={"bf16": True})


def channels_last(m: Measured) -> dict | None:
    faster = _faster_compute(m, "channels_last")
    if faster is None:
        return None
    return _finding("channels_last", "a conv net in the NCHW memory format",
                    ["Conv2d weights are contiguous NCHW (not channels_last)"],
                    "model = model.to(memory_format=torch.channels_last); "
                    "x = x.to(memory_format=torch.channels_last)", m.step["dur"], *faster,
                    settings={"channels_last": True})


def larger_batch(m: Measured) -> dict | None:
    s, probe, base = m.step, m.probe or {}, m.probed("base")
    big = probe.get("larger_batch") or {}
    batch, fits = probe.get("batch") or 0, probe.get("fits_batch") or 0
    if not isinstance(big.get("seconds"), (int, float)) or not base or batch == 0 \
            or fits < FAR_BELOW * batch:
        return None
    base = big.get("base") if isinstance(big.get("base"), (int, float)) else base  # its pair
    k = big["batch"] / batch
    # per-sample parts (loading, copying) grow with the batch; the forward+backward as the
    # probe measured it; the optimizer and Python around the step stay one per step
    new_step = k * (s["wait"] + s["copy"]) + s["fwd_bwd"] * big["seconds"] / base \
        + s["optim"] + s["other"]
    same_images = new_step / k
    how = (f"a step of {big['batch']}: {k:g}x the loading and copying, forward+backward "
           f"{_ms(s['fwd_bwd'])} x the probe's {big['batch']}/{batch} ratio "
           f"({_ms(big['seconds'])}/{_ms(base)}), the optimizer and the rest once: "
           f"{_ms(new_step)} for {k:g}x the images")
    return _finding("batch_size", "the batch is far below what memory holds",
                    [f"batch {batch}; its activations took {probe['activation_bytes'] / 2**20:.1f}"
                     f" MiB, so about {fits} fit in half the free memory"],
                    f"{'DataLoader(..., ' if m.loader else '('}batch_size={big['batch']}) and "
                    f"scale the learning rate with it (x{k:g}, with a warm-up)", s["dur"], same_images, how,
                    (m.loader or {}).get("site"), {"batch_size": big["batch"]})


def syncs(m: Measured) -> dict | None:
    s = m.step
    if not _on_cuda(m) or s["syncs"] < 1:
        return None
    new = max(m.gpu_seconds or 0.0, s["dur"] - s["sync_s"])
    sites = sorted((m.syncs.get("sites") or {}).items(), key=lambda kv: -kv[1])[:3]
    how = (f"step = max(the GPU's span {_ms(m.gpu_seconds or 0)}, the step less the "
           f"{_ms(s['sync_s'])} the host blocked in them) = {_ms(new)}")
    return _finding("syncs", ".item()/.cpu() synchronise inside the step",
                    [f"{s['syncs']:.1f} synchronising call(s) a step, at "
                     + ", ".join(f"{site} ({n}x)" for site, n in sites)],
                    "keep the values on the GPU (e.g. running_loss += loss.detach()) and read "
                    "them once per log interval", s["dur"], new, how,
                    sites[0][0] if sites else None, {"item": False})


def ddp_no_sync(m: Measured) -> dict | None:
    s, model = m.step, m.model or {}
    if not model.get("ddp") or s["backwards"] <= 1 or m.syncs.get("no_sync_used"):
        return None
    base = m.probed("base")
    if not base:
        return None
    k = s["backwards"]
    per_backward = s["bwd"] / k
    forward = s["fwd"] / max(1.0, s["forwards"])
    all_reduce = max(0.0, per_backward - (base - forward))  # the loop's backward less a
    new = s["dur"] - (k - 1) * all_reduce                   # copy's without DDP
    how = (f"each backward {_ms(per_backward)} against {_ms(base - forward)} without DDP "
           f"(probe): {_ms(all_reduce)} of all-reduce, saved on {k - 1:g} of {k:g} "
           "micro-batches")
    return _finding("ddp_no_sync", "gradient accumulation all-reduces every micro-batch",
                    [f"{k:g} backward passes per optimizer step under DDP, no_sync() never "
                     "used"],
                    "with model.no_sync() if not last_micro_batch else nullcontext(): "
                    "loss.backward()", s["dur"], new, how, settings={"no_sync": True})


# ------------------------------------------------------------------------- the host side

# glibc's settings that `train` makes itself (step/host_memory.py), as a script's environment
KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES),
                     "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD_BYTES)}


def page_faults(m: Measured) -> dict | None:
    s, cost = m.step, m.probed("fault_seconds")
    faults = s.get("faults") or 0.0
    if not cost or faults <= 0:
        return None
    spent = faults * cost
    new = max(s["dur"] - spent, s["wait"])  # the faults are the process's own work, not the wait
    env = " ".join(f"{k}={v}" for k, v in KEEP_FREED_MEMORY.items())
    # an estimate, wrong either way by up to ~25 %: faults that torch's other threads take in
    # parallel cost the step less than one thread's fault each (a batch-128 MLP: 2.68x
    # predicted, 2.13x measured), and the cache misses after a fault cost it more than the
    # probe sees (batch 512: 1.64x predicted, 1.79x measured; bench_doctor.py)
    how = (f"the step less {faults:,.0f} faults x {1e6 * cost:.2f} us (the probe: a "
           f"fresh page written at one thread, against memory already mapped) = {_ms(new)}, "
           f"against {_ms(s['dur'])} now")
    evidence = [f"{faults:,.0f} minor page faults a step in the training process: memory "
                "mapped and zero-filled afresh at its first use",
                f"about {_ms(spent)} ({_share(spent, s['dur'])}) of each {_ms(s['dur'])} step"]
    allocator = "LD_PRELOAD a caching allocator (jemalloc, tcmalloc)"
    if m.freed_memory_kept:  # then the faults are blocks above glibc's 32 MiB cap
        evidence.append(f"glibc already keeps freed blocks of up to 32 MiB ({env}): these are "
                        "larger blocks, or memory the step grows into")
        return _finding("page_faults", "memory is page-faulted in afresh every step", evidence,
                        f"{allocator}, or a batch whose tensors stay below 32 MiB", s["dur"],
                        new, how)
    evidence[0] += " (glibc gives freed blocks back to the OS, the next step maps them again)"
    return _finding("page_faults", "freed memory is page-faulted in again every step",
                    evidence, f"{env} python ... (glibc then keeps freed blocks of up to 32 MiB "
                    f"for reuse, as `turbotrain train` does for itself), or {allocator}",
                    s["dur"], new, how, settings={"env": dict(KEEP_FREED_MEMORY)})


RULES = (no_workers, oversubscribed, pil_decode, pin_memory, cpu_model, bf16, channels_last,
         larger_batch, syncs, ddp_no_sync, page_faults)
