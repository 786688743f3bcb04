"""Everything a run needs, built once in order: device, data, pipelines, model, optimizer,
and, with `--resume`, the state they had at the last checkpoint."""
from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from . import checkpoint as ckpt
from .config import TrainConfig, save_yaml
from .data import jpeg_fraction, open_pipeline, open_split, open_val_split
from .device import (ThreadPlan, apply_torch_threads, available_cores, choose_channels_last,
                     choose_compile, choose_device, choose_precision, make_grad_scaler,
                     plan_threads)
from .distributed import (DistEnv, broadcast_object, convert_sync_batchnorm,
                          init_process_group, wrap_model)
from .ema import ModelEMA
from .errors import TrainError
from .host_memory import keep_freed_memory
from .loop import StepEngine
from .models import Classifier, build_model
from .report import CURVES_NAME, METRICS_NAME, SUMMARY_NAME
from .resolve import default_run_dir, resolve_data_settings, resolve_schedule
from .schedule import build_optimizer, build_scheduler


@dataclass
class Run:
    config: TrainConfig  # every auto resolved
    env: DistEnv
    run_dir: Path
    device: torch.device
    precision: str
    compiled: bool
    channels_last: bool
    threads: ThreadPlan
    pipeline_name: str
    train_pipeline: object
    val_pipeline: object | None
    model: Classifier  # the plain module: checkpoints and evaluation use it
    engine: StepEngine
    ema: ModelEMA | None
    steps_per_epoch: int
    total_steps: int
    num_classes: int
    decisions: dict[str, str] = field(default_factory=dict)  # what -> "value: reason"
    resume_state: dict | None = None

    @property
    def global_batch(self) -> int:
        return self.config.batch_size * self.config.accum_steps * self.env.world_size


def build_run(config: TrainConfig, env: DistEnv, cleanup: contextlib.ExitStack) -> Run:
    """`cleanup` closes the pipelines when the run ends, or when building it fails half-way."""
    config.validate()
    decisions: dict[str, str] = {}

    def decide(what: str, value, reason: str):
        decisions[what] = f"{value}: {reason}"
        return value

    device_choice = choose_device(config.device, env.local_rank)
    device = decide("device", device_choice.value, device_choice.reason)
    init_process_group(env, device, config.dist_timeout)
    # Before the pipelines and the model allocate anything (pipeline worker processes fork later
    # and inherit it); host allocations are every step's on the CPU, the loader's on CUDA.
    kept, why = keep_freed_memory()
    decide("host_memory", "kept for reuse" if kept else "glibc defaults", why)

    train_data = open_split(config.data, "train")
    val_data, val_missing = open_val_split(config.data)
    if val_data is None:
        decisions["evaluation"] = f"none: {val_missing}"

    resolved = resolve_data_settings(config, train_data, device.type, env.world_size)
    config, spec = resolved.config, resolved.spec
    for key, reason in resolved.reasons.items():
        decide(key, getattr(config, key), reason)

    precision_choice = choose_precision(config.precision, device)
    precision = decide("precision", precision_choice.value, precision_choice.reason)
    compile_choice = choose_compile(config.compile, device)
    compiled = decide("compile", compile_choice.value, compile_choice.reason)
    cl_choice = choose_channels_last(config.channels_last, spec.conv)
    channels_last = decide("channels_last", cl_choice.value, cl_choice.reason)

    threads = plan_threads(device, cores=available_cores(env.local_world_size),
                           workers=config.workers, threads=config.threads,
                           jpeg_fraction=jpeg_fraction(train_data))
    options = dict(batch_size=config.batch_size, image_size=config.image_size, device=device,
                   seed=config.seed, rank=env.rank, world_size=env.world_size,
                   workers=threads.workers,
                   worker_mode=config.worker_mode)
    train_pipeline, pipeline_name, why = open_pipeline(config.pipeline, train_data, train=True,
                                                       **options)
    cleanup.callback(train_pipeline.close)
    decide("pipeline", pipeline_name, why)
    if config.threads is None:
        threads = threads_after_pipeline(threads, train_pipeline)
    decide("threads", f"{threads.workers} pipeline workers + {threads.torch_threads} torch "
           f"threads on {threads.cores} cores", threads.reason)
    apply_torch_threads(threads.torch_threads)
    val_pipeline = None
    if val_data is not None:
        val_pipeline, _, _ = open_pipeline(pipeline_name, val_data, train=False, **options)
        cleanup.callback(val_pipeline.close)

    steps_per_epoch = len(train_pipeline) // config.accum_steps
    if steps_per_epoch == 0:
        raise TrainError(f"the {pipeline_name} pipeline yields {len(train_pipeline)} batches per "
                         f"epoch, fewer than --accum-steps {config.accum_steps}")
    config, total_steps, schedule_reasons = resolve_schedule(config, steps_per_epoch)
    for key, reason in schedule_reasons.items():
        decide(key, getattr(config, key), reason)
    config = config.replace(pipeline=pipeline_name, precision=precision, compile=compiled,
                            channels_last=channels_last, device=device.type,
                            workers=threads.workers, threads=threads.torch_threads)

    run_dir = _prepare_run_dir(config, env)
    config = config.replace(out=str(run_dir))
    resume_state = ckpt.load_checkpoint(run_dir) if config.resume else None
    if resume_state is not None:
        _check_same_world_size(resume_state, env, run_dir)
    if env.is_main:
        save_yaml(config, run_dir / "config.yaml")

    _set_determinism(config, device)
    ckpt.seed_everything(config.seed)
    model = build_model(spec, train_data.num_classes, train_data.mean, train_data.std)
    if resume_state is None:
        _data_init(model, train_pipeline, config)
    model.to(device, memory_format=torch.channels_last if channels_last else
             torch.contiguous_format)
    if config.sync_bn:
        model, why = convert_sync_batchnorm(model, env, device)
        decide("sync_bn", env.enabled, why)
    train_model: nn.Module = model
    if compiled:
        train_model = torch.compile(train_model)
    train_model = wrap_model(train_model, env, device)
    # After DDP's broadcast of rank 0's weights: a data-dependent init (data_init) differs
    # across ranks, and every rank's EMA must start from the same weights.
    ema = ModelEMA(model, config.ema_decay) if config.ema else None

    optimizer = build_optimizer(model, name=config.optimizer, lr=config.lr,
                                weight_decay=config.weight_decay, momentum=config.momentum,
                                fused=device.type == "cuda")
    scheduler = build_scheduler(optimizer, total=total_steps, warmup=config.warmup_steps,
                                kind=config.schedule)
    scaler = make_grad_scaler(device, precision)
    engine = StepEngine(train_model, optimizer, scheduler, scaler, device=device,
                        precision=precision, accum_steps=config.accum_steps,
                        label_smoothing=config.label_smoothing, channels_last=channels_last,
                        ema=ema, ema_source=model)
    run = Run(config=config, env=env, run_dir=run_dir, device=device, precision=precision,
              compiled=compiled, channels_last=channels_last, threads=threads,
              pipeline_name=pipeline_name, train_pipeline=train_pipeline,
              val_pipeline=val_pipeline, model=model, engine=engine, ema=ema,
              steps_per_epoch=steps_per_epoch, total_steps=total_steps,
              num_classes=train_data.num_classes, decisions=decisions,
              resume_state=resume_state)
    if resume_state is not None:
        restore_modules(run, resume_state)
    return run


def threads_after_pipeline(plan: ThreadPlan, pipeline) -> ThreadPlan:
    """A pipeline that loads in the training process (resident: uint8 already on the device)
    reports `cpu_workers = 0`; its cores then go to torch."""
    used = getattr(pipeline, "cpu_workers", None)
    if used is None or used >= plan.workers:
        return plan
    threads = max(1, plan.cores - used)
    return ThreadPlan(plan.cores, used, threads,
                      f"the pipeline uses {used} worker(s): torch gets the other cores")


def _prepare_run_dir(config: TrainConfig, env: DistEnv) -> Path:
    run_dir = Path(broadcast_object(config.out or default_run_dir(config), env))
    has_checkpoint = ckpt.checkpoint_path(run_dir).is_file()
    if config.resume:
        if not has_checkpoint:
            raise TrainError(f"--resume: no checkpoint in {run_dir} to continue from")
        return run_dir
    if has_checkpoint:
        raise TrainError(f"{run_dir} already holds a run (checkpoint.pt); pass --resume to "
                         "continue it, or choose another --out")
    if env.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        for name in (METRICS_NAME, SUMMARY_NAME, CURVES_NAME):
            (run_dir / name).unlink(missing_ok=True)
        shutil.rmtree(run_dir / "tensorboard", ignore_errors=True)
    return run_dir


def _check_same_world_size(state: dict, env: DistEnv, run_dir: Path) -> None:
    """The shards, the global batch (hence the LR and the schedule) and the position inside
    the epoch all depend on the number of processes: a run continues only with the same."""
    saved = state.get("world_size", 1)  # checkpoints from before it was recorded: one process
    if saved != env.world_size:
        launch = ("plain `train`" if saved == 1 else
                  f"torchrun with {saved} processes in all (--nnodes x --nproc-per-node)")
        raise TrainError(f"--resume: {run_dir} was trained by {saved} process(es) and this "
                         f"launch has {env.world_size}; continue it with {launch}")


def _set_determinism(config: TrainConfig, device: torch.device) -> None:
    if config.deterministic:
        # cuBLAS needs a fixed workspace to be deterministic; it reads this at CUDA init.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    if device.type == "cuda":
        # Fixed shapes (drop_last) make cuDNN's one-off autotune pay back from the first epoch.
        torch.backends.cudnn.benchmark = not config.deterministic
        torch.set_float32_matmul_precision("high")  # TF32 for fp32 runs on Ampere and later


def _data_init(model: Classifier, pipeline, config: TrainConfig) -> None:
    """Nets that set weights from data (airbench's whitening) see one training batch; the
    pipeline is then rewound so training still starts at batch 0."""
    if not hasattr(model.net, "data_init"):
        return
    pipeline.set_epoch(0)
    start = pipeline.state_dict()
    iterator = iter(pipeline)
    images, _ = next(iterator)
    del iterator
    pipeline.load_state_dict(start)
    model.data_init(images.to("cpu"))


def restore_modules(run: Run, state: dict) -> None:
    """Model, optimizer, scheduler, scaler and EMA as they were at the checkpoint."""
    try:
        run.model.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise TrainError(f"--resume: the checkpoint does not fit model {run.config.model} "
                         f"({str(exc).splitlines()[0]})") from None
    engine = run.engine
    engine.optimizer.load_state_dict(state["optimizer"])
    scheduler_state = dict(state["scheduler"])
    # The schedule's shape comes from the current settings (a resumed run may add epochs);
    # only its position comes from the checkpoint.
    scheduler_state["lr_lambdas"] = [None] * len(engine.scheduler.lr_lambdas)
    engine.scheduler.load_state_dict(scheduler_state)
    engine.scaler.load_state_dict(state["scaler"])
    if run.ema is not None and state.get("ema") is not None:
        run.ema.load_state_dict(state["ema"])
