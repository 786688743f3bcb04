"""Everything a run needs, built once in order: device, data, pipelines, model, optimizer,
and, with `--resume`, the state they had at the last checkpoint."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from turbotrain.datasets.untrusted import is_inside
from turbotrain.printable import printable

from . import checkpoint as ckpt
from .config import TrainConfig
from .config_files import save_yaml
from .data import jpeg_fraction, open_pipeline, open_split, open_val_split
from .device import (ThreadPlan, apply_torch_threads, available_cores, choose_channels_last,
                     choose_compile, choose_compile_mode, choose_device, choose_precision,
                     describe_gpu, make_grad_scaler, plan_threads)
from .distributed import (DistEnv, broadcast_object, convert_sync_batchnorm,
                          init_process_group, wrap_model)
from .ema import ModelEMA
from .errors import TrainError
from .finetune import from_weights, optimizer_groups, start_model
from .host_memory import keep_freed_memory
from .loop import StepEngine
from .mixing import mixer_for
from .models import Classifier, deterministic_global_pools
from .resolve import default_run_dir, resolve_data_settings, resolve_resume, resolve_schedule
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
    classes: tuple[str, ...] = ()  # the train split's class names (the weights files' card)
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
    if config.resume == "auto":  # rank 0 looks at --out, so that every rank takes one path
        listing = _listing(config.out) if env.is_main else None
        config, why = resolve_resume(config, broadcast_object(listing, env))
        decide("resume", config.resume, why)
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

    gpu = describe_gpu(device)  # None on the CPU; the CUDA reasons name the GPU
    precision_choice = choose_precision(config.precision, device, gpu)
    precision = decide("precision", precision_choice.value, precision_choice.reason)
    compile_choice = choose_compile(config.compile, device, gpu)
    compiled = decide("compile", compile_choice.value, compile_choice.reason)
    compile_mode = None
    if compiled:
        mode_choice = choose_compile_mode(device, gpu)
        compile_mode = decide("compile_mode", mode_choice.value, mode_choice.reason)
    cl_choice = choose_channels_last(config.channels_last, spec.conv)
    channels_last = decide("channels_last", cl_choice.value, cl_choice.reason)

    threads = plan_threads(device, cores=available_cores(env.local_world_size),
                           workers=config.workers, threads=config.threads,
                           jpeg_fraction=jpeg_fraction(train_data))
    options = dict(batch_size=config.batch_size, image_size=config.image_size, device=device,
                   seed=config.seed, rank=env.rank, world_size=env.world_size,
                   workers=threads.workers,
                   worker_mode=config.worker_mode, scale=config.scale, ratio=config.ratio)
    train_pipeline, pipeline_name, why = open_pipeline(config.pipeline, train_data, train=True,
                                                       **options)
    cleanup.callback(train_pipeline.close)
    decide("pipeline", pipeline_name, why)
    if config.threads is None:
        threads = threads_after_pipeline(threads, train_pipeline, device.type)
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

    _set_determinism(config, device)
    ckpt.seed_everything(config.seed)
    # The dataset's mean/std, or the starting weights' (finetune.py); --freeze-backbone. Built
    # before the run folder, so that weights that are missing or do not fit leave no folder.
    model = start_model(spec, config, train_data, resuming=bool(config.resume), decide=decide)

    run_dir = _prepare_run_dir(config, env)
    config = config.replace(out=str(run_dir))
    resume_state = ckpt.load_checkpoint(run_dir) if config.resume else None
    if resume_state is not None:
        _check_same_world_size(resume_state, env, run_dir)
    if env.is_main:
        save_yaml(config, run_dir / "config.yaml")

    if config.deterministic and device.type == "cuda":
        swapped = deterministic_global_pools(model)
        if swapped:
            decide("global_pools", f"{swapped} made deterministic", "--deterministic on CUDA: "
                   "adaptive pools have no deterministic backward there; same values")
    if resume_state is None and not from_weights(config):
        _data_init(model, train_pipeline, config)
    model.to(device, memory_format=torch.channels_last if channels_last else
             torch.contiguous_format)
    if config.sync_bn:
        model, why = convert_sync_batchnorm(model, env, device)
        decide("sync_bn", env.enabled, why)
    train_model: nn.Module = model
    if compiled:
        train_model = torch.compile(train_model, mode=compile_mode)
    train_model = wrap_model(train_model, env, device)
    # After DDP's broadcast of rank 0's weights: a data-dependent init (data_init) differs
    # across ranks, and every rank's EMA must start from the same weights.
    ema = ModelEMA(model, config.ema_decay) if config.ema else None

    optimizer = build_optimizer(model, name=config.optimizer, lr=config.lr,
                                weight_decay=config.weight_decay, momentum=config.momentum,
                                fused=device.type == "cuda",
                                groups=optimizer_groups(model, config,
                                                        num_classes=train_data.num_classes,
                                                        lr=config.lr,
                                                        weight_decay=config.weight_decay,
                                                        decide=decide))
    scheduler = build_scheduler(optimizer, total=total_steps, warmup=config.warmup_steps,
                                kind=config.schedule)
    scaler = make_grad_scaler(device, precision)
    engine = StepEngine(train_model, optimizer, scheduler, scaler, device=device,
                        precision=precision, accum_steps=config.accum_steps,
                        label_smoothing=config.label_smoothing, channels_last=channels_last,
                        ema=ema, ema_source=model, clip_grad=config.clip_grad,
                        mixer=mixer_for(config, num_classes=train_data.num_classes,
                                        rank=env.rank))
    run = Run(config=config, env=env, run_dir=run_dir, device=device, precision=precision,
              compiled=compiled, channels_last=channels_last, threads=threads,
              pipeline_name=pipeline_name, train_pipeline=train_pipeline,
              val_pipeline=val_pipeline, model=model, engine=engine, ema=ema,
              steps_per_epoch=steps_per_epoch, total_steps=total_steps,
              num_classes=train_data.num_classes, decisions=decisions,
              resume_state=resume_state, classes=tuple(train_data.class_names))
    if resume_state is not None:
        restore_modules(run, resume_state)
    return run


def threads_after_pipeline(plan: ThreadPlan, pipeline, device_type: str = "cpu") -> ThreadPlan:
    """A pipeline that loads in the training process (resident: uint8 already on the device)
    reports `cpu_workers = 0`; its cores then go to torch."""
    used = getattr(pipeline, "cpu_workers", None)
    if used is None or used >= plan.workers:
        return plan
    threads = max(1, plan.cores - used)
    if device_type == "cuda":
        name = getattr(pipeline, "name", "")
        return ThreadPlan(plan.cores, used, threads,
                          f"CUDA: the {name} pipeline uses {used} CPU worker(s) (its batches "
                          f"are made on the GPU), so torch keeps all {threads} cores; they "
                          "only launch kernels")
    return ThreadPlan(plan.cores, used, threads,
                      f"the pipeline uses {used} worker(s): torch gets the other cores")


def _prepare_run_dir(config: TrainConfig, env: DistEnv) -> Path:
    """The run folder, created. Rank 0 alone decides (it creates the folder) and every rank gets
    its answer, the folder or the one-line refusal, so all use the same folder or fail alike."""
    outcome: tuple[str, str] = ("error", "")
    if env.is_main:
        try:
            outcome = ("folder", str(_choose_run_dir(config)))
        except TrainError as exc:
            outcome = ("error", str(exc))
    kind, value = broadcast_object(outcome, env)
    if kind == "error":
        raise TrainError(value)
    return Path(value)


def _choose_run_dir(config: TrainConfig) -> Path:
    """Nothing is ever deleted: a new run takes a missing or empty folder (the automatic name
    gets -2, -3, ... when taken), --resume continues the run in --out."""
    if not config.out:
        return _create_numbered(Path(default_run_dir(config)))
    run_dir = Path(config.out)
    if config.resume:
        if not os.path.lexists(ckpt.checkpoint_path(run_dir)):  # load_checkpoint checks it
            raise TrainError(f"--resume: no checkpoint in {run_dir} to continue from")
        _refuse_links_out_of(run_dir)
        return run_dir
    if run_dir.is_dir():
        try:
            names = sorted(os.listdir(run_dir))
        except OSError as exc:
            raise TrainError(f"--out {run_dir}: cannot list it ({exc.strerror})") from None
        if names:
            raise TrainError(f"--out {run_dir} is not empty (holds {_some_names(run_dir, names)})"
                             "; pass --resume to continue the run in it, or choose another --out")
        return run_dir
    try:
        run_dir.mkdir(parents=True)
    except FileExistsError:
        raise TrainError(f"--out {run_dir} exists and is not a folder; choose another "
                         "--out") from None
    except OSError as exc:
        raise TrainError(f"--out {run_dir}: cannot create it ({exc.strerror})") from None
    return run_dir


def _listing(folder: str | None) -> list[str] | None:
    """The names in `folder`, or None when it is not a folder we can list (missing: a new run;
    anything else: _choose_run_dir says what is wrong)."""
    try:
        return sorted(os.listdir(folder)) if folder else None
    except OSError:
        return None


def _create_numbered(base: Path, attempts: int = 1000) -> Path:
    """base, or base-2, base-3, ...: the first that did not exist. mkdir is atomic, so of two
    runs started in the same second (the name has a 1 s resolution), each gets its own."""
    for n in range(1, attempts + 1):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            continue
        except OSError as exc:
            raise TrainError(f"cannot create the run folder {path} ({exc.strerror}); choose "
                             "one with --out") from None
        return path
    raise TrainError(f"{base} and {attempts - 1} numbered variants already exist; choose a "
                     "run folder with --out")


def _some_names(folder: Path, names: list[str], shown: int = 3) -> str:
    listed = [printable(name) + ("/" if (folder / name).is_dir() else "")
              for name in names[:shown]]
    return ", ".join(listed + (["..."] if len(names) > shown else []))


def _refuse_links_out_of(run_dir: Path) -> None:
    """--resume writes into a folder it did not necessarily create: a symlink there (say
    metrics.jsonl -> ~/.bashrc) would make it write outside the folder, so none may lead out."""
    try:
        names = sorted(os.listdir(run_dir))
    except OSError as exc:
        raise TrainError(f"--resume: cannot list {run_dir} ({exc.strerror})") from None
    for name in names:
        path = run_dir / name
        if path.is_symlink() and not is_inside(path, run_dir):
            raise TrainError(f"--resume: {run_dir / printable(name)} is a symlink to "
                             f"{printable(os.path.realpath(path))}, outside the run folder; "
                             "refusing to write through it")


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
    """Model, optimizer, scheduler, scaler and EMA as they were at the checkpoint; a state that
    does not fit them is one TrainError line."""
    try:
        run.model.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise TrainError(f"--resume: the checkpoint does not fit model {run.config.model} "
                         f"({str(exc).splitlines()[0]})") from None
    engine = run.engine
    try:
        engine.optimizer.load_state_dict(state["optimizer"])
        _check_optimizer_state(engine.optimizer)
        # The schedule's shape comes from the current settings (a resumed run may add epochs);
        # only its position comes from the checkpoint.
        live = engine.scheduler.state_dict()
        scheduler_state = _like(state["scheduler"], live, "scheduler")
        scheduler_state["lr_lambdas"] = [None] * len(engine.scheduler.lr_lambdas)
        engine.scheduler.load_state_dict(scheduler_state)
        engine.scaler.load_state_dict(state["scaler"])
        if run.ema is not None and state.get("ema") is not None:
            run.ema.load_state_dict(state["ema"])
    except ckpt.RESTORE_ERRORS as exc:
        raise ckpt.damaged(ckpt.checkpoint_path(run.run_dir), exc) from None


def _check_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """load_state_dict takes any tensors; one of another shape would fail at the first step."""
    for param, values in optimizer.state.items():
        for name, value in values.items():
            if isinstance(value, torch.Tensor) and value.dim() and value.shape != param.shape:
                raise ValueError(f"optimizer {name} of shape {tuple(value.shape)} for a "
                                 f"parameter of shape {tuple(param.shape)}")


def _like(saved: dict, live: dict, what: str) -> dict:
    """saved's entries that `live` (a fresh state_dict) also has, each checked to be of the same
    kind: a scheduler's load_state_dict copies whatever it is given onto the object."""
    kept = {}
    for key, value in live.items():
        if key in saved:  # one missing (from an older torch) keeps its fresh value
            if not _same_kind(saved[key], value):
                raise TypeError(f"{what} {key!r} is {saved[key]!r:.60}")
            kept[key] = saved[key]
    return kept


def _same_kind(saved, live) -> bool:
    number = (int, float)
    if isinstance(live, number):
        return isinstance(saved, number)
    if isinstance(live, list):
        return (isinstance(saved, list) and len(saved) == len(live)
                and all(_same_kind(a, b) for a, b in zip(saved, live)))
    return isinstance(saved, type(live))
