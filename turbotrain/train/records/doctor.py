"""The bottleneck doctor: is a run waiting for data, for the host, or for the device — and
what to change.

`diagnose(facts)` is pure (numbers in, verdict out), so every rule is unit-tested; `facts_of_run`
gathers the numbers from a finished run. The verdict goes to the end of `train`'s output and to
summary.json under "diagnosis":

* input-bound: at least INPUT_BOUND of the step time waits for the next batch;
* host-bound (CUDA): the GPU finishes each step right after the host's last launch, i.e. the GPU
  waits for Python; on any device also when the loop's own overhead (outside data and compute)
  takes at least HOST_BOUND of the time;
* compute-bound: otherwise — the forward/backward/step is the limit;
* machine-busy: instead of compute- or host-bound, when the steps slowed with no data wait
  while other work loaded the machine (machine_load.py): a smaller model would not help.

The advice names pipelines by what they declared (pipeline/registry.py): the one that holds the
decoded split (resident), the one that decodes on the GPU (dali); worker advice is for
pipelines that have loader workers.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from turbotrain.datasets.beton.layout import SMALL_IMAGE_MAX_SIDE
from turbotrain.pipeline import PipelineOptions
from turbotrain.pipeline.auto import unavailable_reason
from turbotrain.pipeline.registry import capabilities, first_pipeline

from ..models.models import get_model_spec
from ..plan.facts import jpeg_fraction, largest_side
from ..plan.hardware import cpu_native_bf16
from ..step.device import device_memory_bytes, peak_device_memory_bytes
from .machine_load import LoadWindow, busy_machine, shared_throughout
from .verdict import HOST_ISSUE_BOUND, verdict_of

SOME_INPUT_WAIT = 0.05  # below this the loader is keeping up
MIN_TIMED_STEPS = 3
# Stored images this much larger (per side) than the training size: decode is spending most of
# its time on pixels that the crop then throws away.
OVERSIZED_SIDE = 1.5
GiB = 2 ** 30


@dataclass(frozen=True)
class Facts:
    device: str  # "cpu" or "cuda"
    timed_steps: int
    seconds: float  # timed wall seconds (warm-up excluded)
    data_wait: float  # seconds of it the device waited for batches
    compute: float  # seconds of forward/backward/optimizer step
    images_per_second: float | None
    pipeline: str
    workers: int
    torch_threads: int
    cores: int
    precision: str
    compiled: bool
    channels_last: bool
    batch_size: int
    image_size: int
    data: str = "OUT"
    host_issue_fraction: float | None = None  # CUDA: host launch time / GPU span of a step
    bf16_capable: bool = False
    conv_net: bool = True
    largest_side: int = 0  # of the stored images
    jpeg_fraction: float = 0.0
    dali_usable: bool = False  # the pipeline that decodes on the GPU would open
    resident_fits: bool = False  # ... and the one that holds the decoded split (it fits)
    peak_device_memory: int | None = None
    device_memory: int | None = None
    log_every: int = 20
    load_windows: tuple[LoadWindow, ...] = ()  # each log window's pace and the machine's load


@dataclass
class Diagnosis:
    verdict: str  # "input-bound", "compute-bound", "host-bound", "machine-busy" or "unknown"
    headline: str  # one line with the numbers behind the verdict
    numbers: dict = field(default_factory=dict)
    next_steps: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        out = [f"bottleneck: {self.headline}"]
        out += [f"  try: {step}" for step in self.next_steps]
        return out


def diagnose(f: Facts) -> Diagnosis:
    if f.timed_steps < MIN_TIMED_STEPS or f.seconds <= 0:
        return Diagnosis("unknown", f"only {f.timed_steps} timed step(s) after warm-up: too few "
                         "to tell", {"timed_steps": f.timed_steps},
                         ["train longer (at least 20 steps, e.g. --max-steps 50), or run "
                          f"`turbotrain tune --data {f.data}`"])
    wait = f.data_wait / f.seconds
    compute = min(1.0, f.compute / f.seconds)
    overhead = max(0.0, 1.0 - wait - compute)
    step_ms = 1000 * f.seconds / f.timed_steps
    numbers = {"data_wait_fraction": round(wait, 4), "compute_fraction": round(compute, 4),
               "overhead_fraction": round(overhead, 4), "step_ms": round(step_ms, 3),
               "data_wait_ms": round(1000 * f.data_wait / f.timed_steps, 3),
               "compute_ms": round(1000 * f.compute / f.timed_steps, 3),
               "timed_steps": f.timed_steps, "images_per_second": f.images_per_second,
               "host_issue_fraction": f.host_issue_fraction}
    rate = f"; {f.images_per_second:,.0f} images/s" if f.images_per_second else ""
    verdict = verdict_of(wait, compute, host_issue_fraction=f.host_issue_fraction)
    busy = busy_machine(list(f.load_windows), own_threads=f.torch_threads + f.workers)
    if verdict != "input-bound" and busy is not None:
        return _busy_diagnosis(f, busy, verdict, numbers)
    if verdict == "input-bound":
        return Diagnosis("input-bound", f"input-bound: {wait:.0%} of each step waits for data "
                         f"({numbers['data_wait_ms']:.1f} of {step_ms:.1f} ms){rate}",
                         numbers, _input_steps(f))
    if verdict == "host-bound" and f.host_issue_fraction is not None \
            and f.host_issue_fraction >= HOST_ISSUE_BOUND:
        return Diagnosis("host-bound", f"host-bound: the GPU finishes each step right after "
                         f"the host's last launch (launch time {f.host_issue_fraction:.0%} of "
                         f"the GPU time): it waits for Python{rate}", numbers, _host_steps(f))
    if verdict == "host-bound":
        return Diagnosis("host-bound", f"host/overhead-bound: {overhead:.0%} of each step is "
                         f"neither data wait nor compute (logging, synchronisation){rate}",
                         numbers, _host_steps(f))
    note = (f"; {wait:.0%} still waits for data" if wait >= SOME_INPUT_WAIT
            else ": the loader is not your problem")
    steps = _compute_steps(f, wait)
    shared = shared_throughout(list(f.load_windows), own_threads=f.torch_threads + f.workers,
                               cores=f.cores)
    if shared is not None:  # no quiet window to judge the model by: say so, not "go smaller"
        numbers["load_average"] = shared
        note += (f"; the machine was shared all run (load average {shared:.1f} on {f.cores} "
                 f"cores, {f.torch_threads + f.workers} threads of it this run's)")
        steps = [s for s in steps
                 if not s.startswith(("a smaller `--image-size`", "nothing obvious left"))]
        steps.insert(0, "measure on a quiet machine before changing the model: these step "
                     "times are the shared machine's, not the model's")
    return Diagnosis("compute-bound", f"compute-bound at {compute:.0%}{note}{rate}",
                     numbers, steps)


def _busy_diagnosis(f: Facts, busy, verdict: str, numbers: dict) -> Diagnosis:
    """The steps slowed while other work loaded the machine: the verdict says so, with what
    the run measured when the machine was quiet, instead of advice about the model."""
    load = (f"load average up to {busy.load:.1f} on {f.cores} cores, "
            f"{f.torch_threads + f.workers} threads of it this run's" if busy.load is not None
            else "")
    steal = (f"{busy.steal:.0%} of the CPU time stolen by the hypervisor"
             if busy.steal is not None and busy.steal >= 0.01 else "")
    why = "; ".join(part for part in (load, steal) if part)
    numbers = {**numbers, "quiet_step_ms": round(1000 * busy.quiet_step, 3),
               "busy_step_ms": round(1000 * busy.slow_step, 3),
               "busy_share": round(busy.slow_share, 4), "load_average": busy.load,
               "steal_fraction": busy.steal, "shares_verdict": verdict}
    headline = (f"machine busy: steps took {1000 * busy.slow_step:,.0f} ms for "
                f"{busy.slow_share:.0%} of the run against {1000 * busy.quiet_step:,.0f} ms "
                f"while it was quiet, with no data wait: other work held the cores ({why})")
    steps = [f"judge the run by its quiet pace ({1000 * busy.quiet_step:,.0f} ms a step) or "
             "rerun on a quiet machine before changing the model: a smaller one would not "
             "free the cores",
             "see what else runs (`uptime`, `top`), or give the run cores of its own "
             "(`taskset -c`, a scheduler's exclusive allocation)"]
    return Diagnosis("machine-busy", headline, numbers, steps)


def _holder() -> str | None:
    """The pipeline that holds the decoded split in memory (None: none is registered)."""
    return first_pipeline(lambda declared: declared.holds_decoded_split)


def _gpu_decoder() -> str | None:
    """The pipeline that decodes on the GPU (None: none is registered)."""
    return first_pipeline(lambda declared: declared.decodes_on_gpu)


def _input_steps(f: Facts) -> list[str]:
    steps = []
    store, gpu = _holder(), _gpu_decoder()
    if f.pipeline != store and f.resident_fits:
        steps.append(f"`--pipeline {store}`: the decoded split fits in memory, so nothing is "
                     "decoded after the first epoch")
    if f.device == "cuda" and f.dali_usable and f.pipeline != gpu and f.jpeg_fraction > 0.1:
        steps.append(f"`--pipeline {gpu}` (nvJPEG decodes on the GPU)")
    if f.jpeg_fraction > 0.1 and f.largest_side > OVERSIZED_SIDE * f.image_size:
        side = 32 * math.ceil(f.image_size / 0.875 / 32)  # the eval resize: 256 for 224
        steps.append(f"`prepare-dataset SOURCE OUT --max-side {side}`: stored images are up to "
                     f"{f.largest_side} px for {f.image_size} px training, and decode time grows "
                     "with the stored pixels")
    if not capabilities(f.pipeline).loads_in_process:  # it has loader workers to give cores
        if f.device == "cuda" and f.workers < f.cores - 1:
            steps.append(f"`--workers {f.cores - 1}` ({f.workers} of {f.cores} cores decode now)")
        elif f.device == "cpu" and f.torch_threads > 1:
            moved = f.torch_threads // 2
            steps.append(f"`--workers {f.workers + moved} --threads {f.torch_threads - moved}`: "
                         "give the loader cores the model is not using while it waits")
    if f.image_size > SMALL_IMAGE_MAX_SIDE:
        steps.append(f"a smaller `--image-size` (decode+crop cost grows with pixels; "
                     f"{f.image_size} px now)")
    steps.append(f"`turbotrain tune --data {f.data}` measures every pipeline x worker count here")
    return steps


def _compute_steps(f: Facts, wait: float) -> list[str]:
    steps = []
    if f.precision == "fp32" and f.bf16_capable:
        steps.append("`--precision bf16` (native bf16 here: half the bytes, faster matmuls)")
    elif f.precision == "fp32" and f.device == "cuda":
        steps.append("`--precision fp16` (tensor cores; a GradScaler is added)")
    if f.device == "cuda" and not f.compiled:
        steps.append("`--compile` (fused kernels; the compile warm-up is not timed)")
    if f.conv_net and not f.channels_last:
        steps.append("`--channels-last` (NHWC convolutions skip layout conversions)")
    if f.device == "cuda" and f.peak_device_memory and f.device_memory \
            and f.peak_device_memory < 0.5 * f.device_memory:
        steps.append(f"a larger `--batch-size` (peak {f.peak_device_memory / GiB:.1f} of "
                     f"{f.device_memory / GiB:.0f} GiB used; `--batch-size auto` with "
                     "`--global-batch-size` picks the largest that fits)")
    store = _holder()
    if f.device == "cpu" and f.pipeline != store and f.resident_fits \
            and f.torch_threads < f.cores:
        steps.append(f"`--pipeline {store}`: it needs no loader threads, so torch gets all "
                     f"{f.cores} cores ({f.torch_threads} now)")
    elif f.device == "cpu" and f.workers >= 2 and wait < SOME_INPUT_WAIT:
        moved = f.workers // 2
        steps.append(f"`--workers {f.workers - moved} --threads {f.torch_threads + moved}`: the "
                     "loader is idle, the model can use its cores")
    if f.device == "cpu" and f.image_size > SMALL_IMAGE_MAX_SIDE:
        steps.append(f"a smaller `--image-size` or a lighter `--model` ({f.image_size} px now): "
                     "on a CPU the FLOPs per image are the main lever")
    if not steps:
        steps.append("nothing obvious left: this run is as fast as the model allows here")
    return steps


def _host_steps(f: Facts) -> list[str]:
    steps = []
    if f.device == "cuda" and not f.compiled:
        steps.append("`--compile`: fewer, fused kernels mean fewer launches per step")
    steps.append(f"a larger `--batch-size` ({f.batch_size} now): the same launches then carry "
                 "more images")
    if f.log_every < 20:
        steps.append(f"`--log-every 50` (every log point synchronises; {f.log_every} now)")
    return steps


# ---------------------------------------------------------------------------- from a run

def facts_of_run(run, ledger, load_windows: list[LoadWindow] = ()) -> Facts:
    """`run`: builder.Run; `ledger`: its ledger.StepLedger, the same totals summary.json's
    throughput and data-wait fraction come from; `load_windows`: the monitor's LoadWatch's."""
    config, device = run.config, run.device
    dataset = getattr(run.train_pipeline, "dataset", None)
    if device.type == "cuda":
        import torch
        bf16 = torch.cuda.is_bf16_supported()
    else:
        bf16 = cpu_native_bf16()
    return Facts(
        device=device.type, timed_steps=ledger.steps, seconds=ledger.seconds,
        data_wait=ledger.data_wait, compute=ledger.compute,
        images_per_second=ledger.images_per_second,
        pipeline=run.pipeline_name, workers=run.threads.workers,
        torch_threads=run.threads.torch_threads, cores=run.threads.cores,
        precision=run.precision, compiled=run.compiled, channels_last=run.channels_last,
        batch_size=config.batch_size, image_size=config.image_size, data=str(config.data),
        host_issue_fraction=ledger.host_issue_fraction, bf16_capable=bf16,
        conv_net=get_model_spec(config.model).conv,
        largest_side=largest_side(dataset) if dataset is not None else 0,
        jpeg_fraction=jpeg_fraction(dataset) if dataset is not None else 0.0,
        dali_usable=_usable(_gpu_decoder(), dataset, run),
        resident_fits=dataset is not None and _usable(_holder(), dataset, run),
        peak_device_memory=peak_device_memory_bytes(device),
        device_memory=device_memory_bytes(device), log_every=config.log_every,
        load_windows=tuple(load_windows))


def _usable(name: str | None, dataset, run) -> bool:
    """Whether `--pipeline name` would open for this run (auto's own cheap checks)."""
    if name is None:
        return False
    options = PipelineOptions(train=True, batch_size=run.config.batch_size,
                              image_size=run.config.image_size, device=run.device)
    return unavailable_reason(name, dataset, options) is None
