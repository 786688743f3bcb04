"""After the timed window, the hook measures on a copy of the model and the last batch what
each change would do to forward+backward: other torch thread counts, a larger batch, bf16
autocast, channels_last, the GPU, a pinned copy; and what a page fault costs here. The copy
keeps the script's model, optimizer and RNG streams as they were (the RNG states are restored),
so the run goes on unchanged.
Each variant: untimed passes, then the fastest of at least PROBE_REPEATS, interleaved (a
variant that fails, e.g. out of memory, is recorded as its error), more rounds for short passes
(PROBE_SECONDS of each, at most MAX_ROUNDS). The fastest, not the median: a shared or virtual
machine only ever slows a pass, and on a 2-core VM single passes of the same variant varied by
1.4x (195 and 136 ms), enough to turn a measured 2.5x bf16 gain into a predicted 1.5x. More
rounds for short passes at one thread count: there the slowdowns come in spells longer than a
pass (a 0.8 ms MLP pass took 3.0-3.2 ms for 5 rounds running, which made the fastest of 5 of a
128-sample batch against an 8-sample one 1.16x where it is 2.1x, and the predicted gain of a
larger batch 45 % too high). The current thread count is the base variant itself, not probed twice (the two
copies differed by 13 % in one run: noise the advice then read as a thread-count effect).
"""
from __future__ import annotations

import copy
import os
import statistics

from .doctor_hook import CONFIG, PROBE_REPEATS, _first_tensor, _minor_faults, _now

# The first two passes of a new shape or dtype are untimed: oneDNN creates its primitives
# and the allocator grows (the first took 50x the third on a 600-parameter conv net).
UNTIMED = 2
PROBE_SECONDS = 0.5  # a variant's passes repeat until they took this long in all ...
MAX_ROUNDS = 200  # ... or this many rounds: a 1 ms pass, 0.2 s a variant ...
PROBE_BUDGET = 2.0  # ... or all variants' passes this long (a short base beside a long variant)
MAX_BATCH_FACTOR = 16  # a larger batch is probed at most 16x the script's ...
MAX_PROBE_BATCH = 512  # ... and 512 samples: past that, per-step overheads are amortised
MEMORY_SHARE = 0.5  # a batch "fits" when its activations take at most half the free memory
# 16,384 pages of 4 KiB: a few ms of faults, long against the clock's resolution
FAULT_PROBE_BYTES = 64 * 2**20
FAULT_PROBE_REPEATS = 5


def run_probes(clock) -> None:
    import torch
    root, x = clock.last_root, clock.last_input
    model_on = getattr(root, "module", root)
    clock.probing = True
    rng = torch.get_rng_state()
    threads = torch.get_num_threads()
    record = {"kind": "probe", "threads_now": threads, "batch": int(x.shape[0]) if x.dim() else 1}
    # the loop's own autocast (the probe runs outside it, in the optimizer's hook)
    loop_autocast = clock.facts.get("autocast_dtype") if clock.facts.get("autocast") else None
    try:
        model = copy.deepcopy(model_on).train()
        # every variant timed in turn, round after round, so a machine whose speed drifts
        # (other work starting) moves all of them alike
        variants = {"base": (model, x, loop_autocast, threads)}
        counts = _thread_counts(threads) if x.device.type == "cpu" else []
        for count in counts:
            if count != threads:  # the current count is "base"
                variants[f"threads:{count}"] = (model, x, loop_autocast, count)
        if loop_autocast is None and _wants_bf16(model, x):
            variants["bf16"] = (model, x, "bfloat16", threads)
        if _wants_channels_last(model, x):
            variants["channels_last"] = (
                copy.deepcopy(model).to(memory_format=torch.channels_last),
                x.contiguous(memory_format=torch.channels_last), loop_autocast, threads)
        times = _interleaved(variants)
        record["base"] = times.pop("base")
        threads_times = {k.split(":")[1]: times.pop(k) for k in list(times)
                         if k.startswith("threads:")}
        if threads in counts:
            threads_times[str(threads)] = record["base"]
        if threads_times:
            record["threads"] = threads_times
        record.update(times)
        record.update(_batch_probe(model, x, clock.activation_bytes, loop_autocast, threads))
        record.update(_fault_probe())
        if x.device.type == "cpu" and torch.cuda.is_available():
            record["on_cuda"] = _time(copy.deepcopy(model).cuda(), x.cuda())
        if torch.cuda.is_available():
            record.update(_copy_probe(x.cpu()))
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            free, total = torch.cuda.mem_get_info()
            record["cuda_memory"] = {"free": free, "total": total,
                                     "peak": torch.cuda.max_memory_allocated()}
    except Exception as e:  # noqa: BLE001: a probe that fails must not end the script
        record["error"] = repr(e)[:300]
    finally:
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)
        clock.probing = False
    clock.recorder.write(record)


def _pass(model, x, autocast: str | None) -> float:
    """Seconds of one forward + backward (a mean of the output as the loss), the forward
    under autocast to `autocast` (a dtype's name) or none."""
    import torch
    cuda = x.device.type == "cuda"
    context = (torch.autocast(x.device.type, dtype=getattr(torch, autocast)) if autocast
               else torch.autocast(x.device.type, enabled=False))
    model.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    started = _now()
    with context:
        out = _first_tensor(model(x))
    out.float().mean().backward()
    if cuda:
        torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    return _now() - started


def _interleaved(variants: dict) -> dict:
    """name -> fastest seconds (or {"error": ...}) of (model, x, autocast, threads) variants:
    UNTIMED passes each, then rounds of one pass each, in turn, until each has PROBE_REPEATS
    passes and PROBE_SECONDS of them (or MAX_ROUNDS, or PROBE_BUDGET in all). Variants at
    different thread counts get PROBE_REPEATS rounds only: torch's thread count switched
    hundreds of times made a DDP rank abort at its exit ("terminate called without an active
    exception", 1 run in 3)."""
    import torch
    seconds: dict = {name: [] for name in variants}
    failed: dict = {}
    one_count = len({threads for *_, threads in variants.values()}) == 1
    for round_ in range(UNTIMED + (MAX_ROUNDS if one_count else PROBE_REPEATS)):
        for name, (model, x, autocast, threads) in variants.items():
            if name in failed:
                continue
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            try:
                took = _pass(model, x, autocast)
            except (RuntimeError, MemoryError) as e:  # out of memory, an op without bf16
                failed[name] = {"error": str(e).splitlines()[0][:200]}
                continue
            if round_ >= UNTIMED:
                seconds[name].append(took)
        if _enough(seconds, failed):
            break
    return {name: failed.get(name) or min(seconds[name]) for name in variants}


def _enough(seconds: dict, failed: dict) -> bool:
    timed = [times for name, times in seconds.items() if name not in failed]
    if not all(len(t) >= PROBE_REPEATS for t in timed):
        return False
    return all(sum(t) >= PROBE_SECONDS for t in timed) or \
        sum(map(sum, timed)) >= PROBE_BUDGET


def _time(model, x, autocast: str | None = None) -> float | dict:
    """Fastest seconds of forward + backward, this variant alone."""
    import torch
    return _interleaved({"it": (model, x, autocast, torch.get_num_threads())})["it"]


def _thread_counts(threads: int) -> list[int]:
    cores = CONFIG.get("cores") or len(os.sched_getaffinity(0))
    return sorted({1, max(1, threads // 2), threads, cores} & set(range(1, cores + 1)))


def _batch_probe(model, x, activation_bytes: int, autocast: str | None, threads: int) -> dict:
    """The largest batch up to MAX_BATCH_FACTOR x that the free memory holds (activations
    measured in the first forward, x3 for their gradients and the backward's temporaries),
    timed on the batch repeated."""
    batch = int(x.shape[0]) if x.dim() else 0
    if batch == 0 or activation_bytes <= 0:
        return {}
    free = _free_memory(x.device)
    per_batch = 3 * activation_bytes
    fits = int(MEMORY_SHARE * free // per_batch) * batch if free else batch
    factor = 1
    while factor * 2 <= MAX_BATCH_FACTOR and batch * factor * 2 <= min(fits, MAX_PROBE_BATCH):
        factor *= 2
    out = {"activation_bytes": activation_bytes, "free_memory": free,
           "fits_batch": fits}
    if factor > 1:
        big = x.repeat(factor, *([1] * (x.dim() - 1)))
        times = _interleaved({"base": (model, x, autocast, threads),
                              "big": (model, big, autocast, threads)})
        out["larger_batch"] = {"batch": batch * factor, "seconds": times["big"],
                               "base": times["base"]}
    return out


def _fault_probe() -> dict:
    """Seconds a minor page fault costs this process: a fresh anonymous mapping written and
    given back, less the same writes again once mapped, per fault counted, at one torch thread;
    the fastest of FAULT_PROBE_REPEATS (as the passes: a busy machine only slows it). A mapping
    of its own, not a tensor from the allocator: once a process keeps freed memory (as `train`
    makes it), a 64 MiB tensor came back already mapped, no fault was counted and the probe had
    no answer (1 CI run of 3). A step's faults come mostly one at a time: on the 2-core VM they
    cost 1.27-1.37 us each (a step's time with and without them, against its fault count); this
    probe gives 1.43-1.5 us at one thread (0.6 at two, where the writes fault in parallel)."""
    import mmap

    import torch
    if _minor_faults() == 0:  # not measurable on this platform
        return {}
    torch.set_num_threads(1)
    costs = []
    for _ in range(FAULT_PROBE_REPEATS):
        # private, as malloc maps a large block (a shared one faulted 1.7x slower here)
        region = mmap.mmap(-1, FAULT_PROBE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        pages = torch.frombuffer(region, dtype=torch.uint8)
        faults, started = _minor_faults(), _now()
        pages.fill_(1)
        fresh_seconds, faults = _now() - started, _minor_faults() - faults
        started = _now()
        pages.fill_(2)
        warm_seconds = _now() - started
        started = _now()
        del pages  # the buffer's export, before the mapping can close
        region.close()
        fresh_seconds += _now() - started  # given back, as a freed block is
        if faults > 0:
            costs.append(max(0.0, fresh_seconds - warm_seconds) / faults)
    return {"fault_seconds": min(costs)} if costs else {}


def _free_memory(device) -> int:
    if device.type == "cuda":
        import torch
        return torch.cuda.mem_get_info(device)[0]
    try:  # MemAvailable: free memory plus the page cache the kernel would give back
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _wants_bf16(model, x) -> bool:
    import torch
    parameter = next(model.parameters())
    if x.device.type == "cpu":
        native = bool(CONFIG.get("bf16_native"))
    else:
        native = torch.cuda.is_bf16_supported()
    return native and parameter.dtype == torch.float32


def _wants_channels_last(model, x) -> bool:
    import torch
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    return bool(convs) and x.dim() == 4 and not convs[0].weight.is_contiguous(
        memory_format=torch.channels_last)


def _copy_probe(x) -> dict:
    """Seconds to copy the batch to the GPU from pageable and from pinned memory."""
    import torch
    out = {}
    for name, source in (("copy_pageable", x), ("copy_pinned", x.pin_memory())):
        seconds = []
        for repeat in range(PROBE_REPEATS + 1):
            torch.cuda.synchronize()
            started = _now()
            source.to("cuda", non_blocking=True)
            torch.cuda.synchronize()
            if repeat:
                seconds.append(_now() - started)
        out[name] = statistics.median(seconds)
    return out
