"""Everything a run needs, built once in order: the plan (plan/: every automatic choice), then
what it says: device, data, pipelines, model, optimizer, and, with `--resume`, the state they
had at the last checkpoint."""
from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from turbotrain.pipeline import build_pipeline
from turbotrain.pipeline.workers import after_pipeline
from turbotrain.printable import printable

from ..config.config import AUTO, TrainConfig
from ..config.config_files import save_yaml
from ..errors import TrainError
from ..models.models import Classifier, build_model, deterministic_global_pools
from ..plan import DatasetFacts, Machine, Observed, Plan, detect_machine, plan
from ..plan.resolution import schedule_of
from ..records import checkpoint as ckpt
from ..step import host_memory
from ..step.compile_sizes import compile_for_sizes
from ..step.cpu_conv_guard import guard_strided_convs
from ..step.determinism import fix_cublas_workspace
from ..step.device import ThreadPlan, apply_torch_threads, use_device
from ..step.distributed import (DistEnv, broadcast_object, convert_sync_batchnorm,
                                init_process_group, wrap_model)
from ..step.ema import ModelEMA
from ..step.loop import StepEngine, StepSettings, make_engine
from ..step.mixing import mixer_for
from ..step.schedule import LRSchedule
from ..weights.finetune import optimizer_groups, start_model, weights_facts
from . import batch_finder
from .data import open_splits
from .loader import Loader, open_planned, pipeline_options
from .resume_changes import carry_optimizer_settings, check_same_optimizer, check_target_stop
from .run_folder import prepare_run_dir


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


def build_run(config: TrainConfig, env: DistEnv, cleanup: contextlib.ExitStack,
              sources: dict[str, str] | None = None) -> Run:
    """Plans the run and carries the plan out (see `_plan_and_open`), then builds the model, the
    run folder and the training step. `cleanup` closes the pipelines when the run ends, or when
    building it fails half-way. `sources`: where each setting came from
    (config_files.config_and_sources), which the decision lines name."""
    config.validate()
    fix_cublas_workspace(config.deterministic)  # before the batch search's CUDA steps
    auto = config.resume == AUTO  # the plan replaces it with what auto decided
    planned, train_data, train_pipeline, val_pipeline = _plan_and_open(config, env, cleanup)
    config, device = planned.config, planned.device
    decisions = planned.lines_labelled(sources or {})

    def decide(what: str, value, reason: str):  # what building the model finds out
        decisions[what] = f"{value}: {reason}"
        return value

    _set_determinism(config, device)
    ckpt.seed_everything(config.seed)
    # The dataset's mean/std, or the starting weights' (finetune.py); --freeze-backbone. Built
    # before the run folder, so that weights that are missing or do not fit leave no folder.
    model = start_model(planned.spec, config, train_data, resuming=bool(config.resume),
                        decide=decide)
    config, run_dir, resume_state = _open_run_dir(config, env, cleanup, auto=auto,
                                                  model=model,
                                                  classes=tuple(train_data.class_names),
                                                  budget_sized=planned.budget_sized)
    fresh = resume_state is None and not config.from_weights
    train_model, ema = _place_model(model, planned, env, train_pipeline if fresh else None,
                                    decide)
    n = train_data.num_classes
    engine = _step_engine(model, train_model, ema, config, planned, env, num_classes=n,
                          decide=decide)
    run = Run(config=config, env=env, run_dir=run_dir, device=device,
              precision=config.precision, compiled=config.compile,
              channels_last=config.channels_last, threads=planned.threads,
              pipeline_name=config.pipeline, train_pipeline=train_pipeline,
              val_pipeline=val_pipeline, model=model, engine=engine, ema=ema,
              steps_per_epoch=planned.steps_per_epoch, total_steps=planned.total_steps,
              num_classes=n, decisions=decisions, resume_state=resume_state,
              classes=tuple(train_data.class_names))
    if resume_state is not None:
        restore_modules(run, resume_state)
    return run


def _plan_and_open(config: TrainConfig, env: DistEnv, cleanup: contextlib.ExitStack):
    """The plan for this machine and data, carried out up to the pipelines: the device (made
    current; the process group), the batch search it asks for, the pipelines, torch's threads.
    Each measurement is planned again with (plan/core.py), so the returned plan holds every
    decision as made. Returns (plan, train split, train pipeline, val pipeline or None)."""
    machine = detect_machine(env, gpus=config.device != "cpu")
    observed = Observed(host_memory=host_memory.decision())  # applied by cli.run_train
    first = plan(config, None, machine, observed)  # the process group needs the device first
    device = first.device
    _print_warnings(first.decisions.values(), env)  # a setting asked for that is slow here
    use_device(device)
    init_process_group(env, device, config.dist_timeout)
    if config.resume == AUTO:  # rank 0 looks at --out, so that every rank takes one path
        listing = _listing(config.out) if env.is_main else None
        observed = observed.replace(out_names=broadcast_object(listing, env))
    cache = dict(cache_dir=config.cache_dir, cache_limit=config.cache_limit,  # a --data URL's
                 verify=config.verify_data)  # each local file's checksum (beton/shards.py)
    train_data, val_data, *val_missing = open_splits(config.data, **cache)
    facts = DatasetFacts.of(train_data, val_data, *val_missing)
    observed = observed.replace(weights=weights_facts(config))
    planned = plan(config, facts, machine, observed)
    # What the data adds (`--data DS/train.beton`: did you mean `--data DS`?).
    _print_warnings((d for k, d in planned.decisions.items() if k not in first.decisions), env)
    if planned.batch_search is not None:
        observed = observed.replace(batch_fit=_search_batch(planned, facts.num_classes, env))
    planned, train_pipeline, val_pipeline = _open_pipelines(
        config, facts, machine, observed, (train_data, val_data), env, cleanup)
    apply_torch_threads(planned.threads.torch_threads)
    return planned, train_data, train_pipeline, val_pipeline


def _print_warnings(decisions, env: DistEnv) -> None:
    """Each decision's warning on stderr, once per run (rank 0): it runs, but not as meant or
    slowly here."""
    for decision in decisions:
        if decision.warning and env.is_main:
            print(f"train: warning: {decision.warning}", file=sys.stderr, flush=True)


def _open_run_dir(config: TrainConfig, env: DistEnv, cleanup: contextlib.ExitStack, *,
                  auto: bool, model: Classifier, classes: tuple[str, ...],
                  budget_sized: tuple[str, ...] = ()) -> tuple[TrainConfig, Path, dict | None]:
    """The run folder (a new one, or --resume's; locked until `cleanup` runs: run_folder.py),
    the checkpoint state to continue from (checked against this launch before config.yaml is
    rewritten: a refused resume leaves the run as it was), and RUNDIR/config.yaml (the
    resolved settings, less the `budget_sized` ones: config_files.save_yaml)."""
    run_dir = prepare_run_dir(config, env, cleanup, auto=auto,
                              default=Path(default_run_dir(config)))
    config = config.replace(out=str(run_dir))
    resume_state = ckpt.load_checkpoint(run_dir) if config.resume else None
    if resume_state is not None:
        _check_same_world_size(resume_state, env, run_dir)
        _check_same_data(resume_state, config, model, classes, run_dir)
        check_same_optimizer(resume_state, config, run_dir)
        check_target_stop(resume_state, config, run_dir)
    if env.is_main:
        save_yaml(config, run_dir / "config.yaml", budget_sized=budget_sized)
    return config, run_dir, resume_state


def _search_batch(planned: Plan, num_classes: int, env: DistEnv) -> batch_finder.BatchFit:
    """The batch search the plan asks for (plan.BatchSearch): the largest micro-batch up to its
    limit whose training step fits beside the resident store (the smallest answer of all
    ranks, so that they train the same micro-batch)."""
    search = planned.batch_search
    return batch_finder.find_batch_size(
        lambda: build_model(planned.spec, num_classes), StepSettings.of(planned),
        image_size=planned.config.image_size, num_classes=num_classes, limit=search.limit,
        reserve_bytes=search.reserve_bytes, env=env)


def _open_pipelines(config: TrainConfig, facts: DatasetFacts, machine: Machine,
                    observed: Observed, splits: tuple, env: DistEnv,
                    cleanup: contextlib.ExitStack) -> tuple[Plan, Loader, Loader | None]:
    """Opens the planned train pipeline as a Loader (the object a user's own loop iterates;
    with `--pipeline auto`, one that fails to open is planned around: the next in the fallback
    order), then the val pipeline like it; returns the plan made with what the opened pipeline
    says (its batches, its CPU workers)."""
    train_data, val_data = splits
    planned, train_pipeline, _ = open_planned(config, facts, machine, observed, train_data,
                                              env, plan)
    cleanup.callback(train_pipeline.close)
    val_loader = None
    if val_data is not None:
        val_pipeline = build_pipeline(planned.value("pipeline"), val_data,
                                      pipeline_options(planned, env, train=False))
        cleanup.callback(val_pipeline.close)
        val_loader = Loader.opened(val_pipeline, planned, val_data)
    return planned, Loader.opened(train_pipeline, planned, train_data), val_loader


def _place_model(model: Classifier, planned: Plan, env: DistEnv, init_pipeline, decide
                 ) -> tuple[nn.Module, ModelEMA | None]:
    """The model on its device as the plan says (memory format, SyncBatchNorm, compile, DDP);
    returns the module to train and the EMA. `init_pipeline`: a batch for nets that set
    weights from data (fresh runs only)."""
    config, device = planned.config, planned.device
    if config.deterministic and device.type == "cuda":
        swapped = deterministic_global_pools(model)
        if swapped:
            decide("global_pools", f"{swapped} made deterministic", "--deterministic on CUDA: "
                   "adaptive pools have no deterministic backward there; same values")
    if init_pipeline is not None:
        _data_init(model, init_pipeline, config)
    model.to(device, memory_format=torch.channels_last if config.channels_last else
             torch.contiguous_format)
    if device.type == "cpu" and config.precision != "fp32":
        guard_strided_convs(model)  # oneDNN's bf16 backward on a 1x1 input: cpu_conv_guard.py
    if config.sync_bn:
        model, why = convert_sync_batchnorm(model, env, device)
        decide("sync_bn", env.enabled, why)
    train_model = wrap_model(model, env, device)
    if config.compile:
        # DDP first, then torch.compile, as PyTorch's DDP notes say ("TorchDynamo
        # DDPOptimizer", docs/source/notes/ddp.rst: `ddp_model = DDP(model); ddp_model =
        # torch.compile(ddp_model)`): Dynamo then splits the compiled graph at DDP's gradient
        # buckets, so each bucket's all-reduce overlaps the rest of the backward. Compiled the
        # other way round, DDP sees one opaque backward and all-reduces after it. Not timed
        # here yet: bench/gpu_check.py --all checks the order on the GPU.
        schedule = schedule_of(config)  # progressive resizing: one static graph per size
        sizes = set(schedule.sizes(config.epochs)) if schedule is not None else None
        train_model = compile_for_sizes(train_model, mode=planned.compile_mode, sizes=sizes)
    # After DDP's broadcast of rank 0's weights: a data-dependent init (data_init) differs
    # across ranks, and every rank's EMA must start from the same weights.
    return train_model, ModelEMA(model, config.ema_decay) if config.ema else None


def _step_engine(model: Classifier, train_model: nn.Module, ema: ModelEMA | None,
                 config: TrainConfig, planned: Plan, env: DistEnv, *, num_classes: int,
                 decide) -> StepEngine:
    groups = optimizer_groups(model, config, num_classes=num_classes, lr=config.lr,
                              weight_decay=config.weight_decay, decide=decide)
    schedule = LRSchedule(total=planned.total_steps, warmup=config.warmup_steps,
                          kind=config.schedule)
    return make_engine(model, StepSettings.of(planned), groups=groups, schedule=schedule,
                       train_model=train_model, ema=ema,
                       mixer=mixer_for(config, num_classes=num_classes, rank=env.rank))


def threads_after_pipeline(plan: ThreadPlan, pipeline, device_type: str = "cpu") -> ThreadPlan:
    """pipeline/workers.after_pipeline for an opened pipeline (its `cpu_workers`)."""
    return after_pipeline(plan, getattr(pipeline, "cpu_workers", None),
                          getattr(pipeline, "name", ""), device_type)


def default_run_dir(config: TrainConfig) -> str:
    name = Path(config.data.rstrip("/")).name or "data"
    model = re.sub(r"[^\w.-]+", "-", config.model)  # timm:hf-hub:timm/x: one folder name
    return str(Path("runs") / f"{name}-{model}-{time.strftime('%Y%m%d-%H%M%S')}")


def _listing(folder: str | None) -> list[str] | None:
    """The names in `folder`, or None when it is not a folder we can list (missing: a new run;
    anything else: run_folder.py says what is wrong)."""
    try:
        return sorted(os.listdir(folder)) if folder else None
    except OSError:
        return None


def _check_same_world_size(state: dict, env: DistEnv, run_dir: Path) -> None:
    """The shards, the global batch (hence the LR and the schedule) and the position inside
    the epoch all depend on the number of processes: a run continues only with the same."""
    saved = state.get("world_size", 1)  # checkpoints from before it was recorded: one process
    if saved != env.world_size:
        launch = ("plain `train`" if saved == 1 else
                  f"torchrun with {saved} processes in all (--nnodes x --nproc-per-node)")
        raise TrainError(f"--resume: {run_dir} was trained by {saved} process(es) and this "
                         f"launch has {env.world_size}; continue it with {launch}")


def _check_same_data(state: dict, config: TrainConfig, model: Classifier,
                     classes: tuple[str, ...], run_dir: Path) -> None:
    """A run continues only on data with the classes it was trained on, and with its model:
    another dataset's classes do not fit the model's head or, as many of them, would be learnt
    under the old ones' labels. A checkpoint from before classes were saved is checked by the
    shapes of its tensors."""
    saved = state.get("classes")
    trained_on = printable(state["config"].get("data", "its dataset"))
    if saved is not None and list(saved) != list(classes):
        raise TrainError(f"--resume: {run_dir} was trained on {trained_on} ({_classes(saved)}),"
                         f" not on --data {printable(config.data)} ({_classes(classes)}); "
                         f"resume with --data {trained_on} (or a copy with the same classes), "
                         f"or start a new run from its weights: --out NEWDIR --init-from "
                         f"{run_dir}")
    misfit = _misfit(model, state["model"]) if isinstance(state["model"], dict) else None
    if misfit is not None:
        raise _does_not_fit(config, run_dir, trained_on, len(classes), misfit)


def _does_not_fit(config: TrainConfig, run_dir: Path, trained_on: str, num_classes: int,
                  misfit: str) -> TrainError:
    return TrainError(f"--resume: the checkpoint does not fit model {config.model} with the "
                      f"{num_classes} classes of --data {printable(config.data)} ({misfit}); "
                      f"{run_dir} was trained on {trained_on}: resume with --data "
                      f"{trained_on} and its --model, or start a new run with another --out")


def _classes(names) -> str:
    shown = ", ".join(printable(name)[:40] for name in list(names)[:4])
    more = f", ... ({len(names)} in all)" if len(names) > 4 else ""
    return f"{len(names)} class{'es' if len(names) != 1 else ''}: {shown}{more}"


def _set_determinism(config: TrainConfig, device: torch.device) -> None:
    # (cuBLAS's workspace was fixed before any CUDA call: fix_cublas_workspace in build_run.)
    # Set both ways: the flag is process-wide, and a --deterministic run in this process (a
    # test, a notebook) must not leave the next run deterministic, with its new tensors filled
    # with NaN (torch.utils.deterministic.fill_uninitialized_memory).
    torch.use_deterministic_algorithms(config.deterministic)
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
    """Model, optimizer, scaler and EMA as they were at the checkpoint; a state that
    does not fit them is one TrainError line."""
    try:
        run.model.load_state_dict(state["model"])
    except RuntimeError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        raise _does_not_fit(run.config, run.run_dir,
                            printable(state["config"].get("data", "its dataset")),
                            run.num_classes, lines[-1][:160] if lines else type(exc).__name__
                            ) from None
    engine = run.engine
    try:
        engine.optimizer.load_state_dict(state["optimizer"])
        _check_optimizer_state(engine.optimizer)
        carry_optimizer_settings(engine.optimizer, state, run.config)
        # No scheduler state: the LR is a function of the step counter (schedule.lr_at), with
        # each group's peak in the optimizer state; an older checkpoint's "scheduler" is unread.
        engine.scaler.load_state_dict(state["scaler"])
        if run.ema is not None and state.get("ema") is not None:
            run.ema.load_state_dict(state["ema"])
    except ckpt.RESTORE_ERRORS as exc:
        raise ckpt.damaged(ckpt.checkpoint_path(run.run_dir), exc) from None


def _misfit(model: nn.Module, saved: dict) -> str | None:
    """The first tensor of the checkpoint's `saved` model state that does not fit `model`, in
    a few words (load_state_dict's message starts with a line that names none); None if all
    fit."""
    current = model.state_dict()
    for name, value in saved.items():
        if name in current and isinstance(value, torch.Tensor) and \
                value.shape != current[name].shape:
            return (f"{printable(name)[:80]} is {list(value.shape)} in the checkpoint, "
                    f"{list(current[name].shape)} here")
    missing = [name for name in current if name not in saved]
    return f"the checkpoint has no {printable(missing[0])[:80]}" if missing else None


def _check_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """load_state_dict takes any tensors; one of another shape would fail at the first step."""
    for param, values in optimizer.state.items():
        for name, value in values.items():
            if isinstance(value, torch.Tensor) and value.dim() and value.shape != param.shape:
                raise ValueError(f"optimizer {name} of shape {tuple(value.shape)} for a "
                                 f"parameter of shape {tuple(param.shape)}")
