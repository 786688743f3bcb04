"""`plan(config, facts, machine, observed) -> Plan`: every automatic choice of a run, made in one
pure function, each value with its reason.

No file, device or global is read or changed here: what the plan needs about the world comes in
as values (Machine, DatasetFacts, Observed), so a plan for another machine is computed the same
way (tests/train/plan/test_plan.py). What only a measurement can answer is an explicit input:

* the batch size (`--batch-size auto`): the plan says "search up to N, leaving R bytes for the
  resident store" (`Plan.batch_search`); builder.build_run runs batch_finder and plans again
  with the BatchFit in `Observed.batch_fit`, which the same rule turns into the batch;
* a pipeline that fails to open although it looked usable (`Observed.unopenable`): planning
  again skips it, in the same fallback order;
* the opened pipeline's batches per epoch and CPU workers (`Observed.pipeline`): the schedule's
  length and torch's share of the cores; before opening, the plan predicts both;
* the starting weights' card (`Observed.weights`, finetune.weights_facts) and, for
  `--resume auto`, what --out holds (`Observed.out_names`); the host allocator setting that
  `train` applied (`Observed.host_memory`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from turbotrain.pipeline.auto import first_usable, why_unavailable
from turbotrain.pipeline.registry import auto_order, capabilities
from turbotrain.pipeline.resident import budget_of
from turbotrain.pipeline.workers import ThreadPlan, after_pipeline, split_cores

# The plan imports leaf modules only (tests/train/plan/test_plan_imports.py): none of these
# imports anything that leads back here.
from ..config.config import AUTO, TrainConfig
from ..config.duration import BUDGET_MAX_EPOCHS
from ..config.model_args import canonical, parse_model_kwargs
from ..errors import TrainError
from ..models.models import get_model_spec
from turbotrain.pipeline import augment

from . import early_stop, eval_rules, recipe, resolution, rules
from .augment_rule import augmentation, work_bytes
from .budget_size import budget_size
from .decision import labelled
from .device_choice import device_choices, pick_channels_last, pick_device
from .facts import DatasetFacts, WeightsFacts
from .machine import Machine
from .rules import BatchSearch, Decision

# The order decisions are printed in at the start of a run.
ORDER = ("device", "resume", "host_memory", "evaluation", "early_stop", "image_size", "model",
         "model_kwargs", "progressive", "eval_res", "tta", "augment", "batch_size", "accum_steps",
         "lr", "weight_decay", "worker_mode", "precision", "compile", "compile_mode",
         "channels_last", "pipeline", "order", "threads", "warmup_steps", "warmup")
_NOT_LISTED = object()


@dataclass(frozen=True)
class OpenedPipeline:
    """What the opened train pipeline says about itself."""
    name: str
    batches: int  # len(pipeline): batches per epoch on this rank
    cpu_workers: int | None  # CPU workers busy beside the model (None: not declared)


@dataclass(frozen=True)
class Observed:
    """The plan's inputs that come from measuring or reading something (module docstring)."""
    weights: WeightsFacts | None = None
    out_names: object = _NOT_LISTED  # --out's names for --resume auto (None: no such folder)
    host_memory: tuple[bool, str] | None = None
    batch_fit: object = None  # batch_finder.BatchFit
    unopenable: tuple[tuple[str, str], ...] = ()  # (pipeline, why it failed to open)
    pipeline: OpenedPipeline | None = None

    def replace(self, **changes) -> Observed:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Plan:
    config: TrainConfig  # every auto resolved (RUNDIR/config.yaml); batch_size: see batch_search
    machine: Machine
    decisions: dict[str, Decision]  # in ORDER
    spec: object = None  # models.ModelSpec (None: planned without data)
    budget: ThreadPlan | None = None  # the split of the cores the pipeline is opened with
    threads: ThreadPlan | None = None  # ... and after it (a pipeline may leave cores to torch)
    batch_search: BatchSearch | None = None  # the batch still has to be measured
    steps_per_epoch: int | None = None
    total_steps: int | None = None
    # Settings --time-budget sizes once the run's pace is timed (`budget_sized`): their values
    # here are placeholders, which RUNDIR/config.yaml leaves out (config_files.save_yaml).
    budget_sized: tuple[str, ...] = ()

    def __getitem__(self, name: str) -> Decision:
        return self.decisions[name]

    def value(self, name: str, default=None):
        decision = self.decisions.get(name)
        return default if decision is None else decision.value

    @property
    def device(self) -> torch.device:
        return self.decisions["device"].value

    @property
    def compile_mode(self) -> str | None:
        return self.value("compile_mode")

    @property
    def lines(self) -> dict[str, str]:
        """What a run prints at start and keeps in summary.json: name -> "value: reason"."""
        return self.lines_labelled({})

    def lines_labelled(self, sources: dict[str, str]) -> dict[str, str]:
        """`lines`, each "asked for" naming where its setting came from (decision.labelled)."""
        return {name: d.line() for name, d in labelled(self.decisions, sources).items()
                if d.shown}


def plan(config: TrainConfig, facts: DatasetFacts | None, machine: Machine,
         observed: Observed = Observed()) -> Plan:
    """Every automatic setting of `config` resolved for `facts` on `machine` (module docstring).
    Without facts (no dataset), only the machine's decisions. Raises TrainError for settings
    that contradict each other or the data, PipelineError when no pipeline can run."""
    d: dict[str, Decision] = {}
    chosen = device_choices(machine, device=config.device, precision=config.precision,
                            compile=config.compile)
    device = _decide(d, "device", chosen.device).type
    config = _resume(d, config, observed)
    d["host_memory"] = _host_memory(machine, observed)
    precision = _decide(d, "precision", chosen.precision)
    compiled = _decide(d, "compile", chosen.compile)
    if chosen.compile_mode is not None:
        d["compile_mode"] = chosen.compile_mode
    config = config.replace(precision=precision, compile=compiled, device=device)
    if facts is None:
        return Plan(config, machine, _ordered(d))

    if facts.val_count is None:
        # Training on DS/train.beton is allowed (a split on purpose), but rarely meant when DS
        # has a val split: a warning, not an error (no flag turns evaluation off otherwise).
        d["evaluation"] = Decision("none", facts.val_missing,
                                   warning=facts.val_missing if facts.val_meant else "")
    epochs, stops = early_stop.run_length(config.epochs, config.early_stop,
                                          has_val=facts.val_count is not None,
                                          time_budget=config.time_budget,
                                          max_steps=config.max_steps)
    config = config.replace(epochs=epochs, early_stop=_decide(d, "early_stop", stops))
    weights = _weights(config, observed)
    config, spec = _model(d, config, facts, device, weights, machine)
    config = _progressive(d, config, facts, spec)
    config = _evaluation(d, config, facts, spec)
    d["augment"] = augmentation(config.augment_policy(), device)
    channels_last = _decide(d, "channels_last",
                            pick_channels_last(config.channels_last, spec.conv))
    need, room = _resident_room(config, facts, machine, d["device"].value)
    pipeline = _pipeline(d, config, machine, observed, need, room)
    config = config.replace(order=_order(d, config, facts, machine, pipeline))
    # A store of the decoded split is filled after the batch is chosen: a search leaves it room.
    holds = capabilities(pipeline).holds_decoded_split
    reserve = need if holds and need <= room[0] else 0
    if reserve and device == "cuda":  # and the work memory of its photo crops on the GPU
        reserve += facts.resident_crop_bytes(config.image_size)
    batch, search = _batch(d, config, facts, machine, spec, reserve, observed)
    config = _optimizer(d, config.replace(batch_size=batch), facts, machine, spec, weights)
    budget, threads = _threads(d, config, facts, machine, device, pipeline, observed)
    config, steps, total = _schedule(d, config, facts, machine, pipeline, observed)
    config = config.replace(pipeline=pipeline, channels_last=channels_last,
                            workers=threads.workers, threads=threads.torch_threads)
    return Plan(config, machine, _ordered(d), spec=spec, budget=budget, threads=threads,
                batch_search=search, steps_per_epoch=steps, total_steps=total,
                budget_sized=budget_sized(config, warmup_planned="warmup_steps" in d))


def plan_loader(config: TrainConfig, facts: DatasetFacts, machine: Machine,
                observed: Observed = Observed()) -> Plan:
    """The decisions a `Loader` (train/engine/loader.py) is opened with, by the rules `plan`
    applies: device, image size, augmentation, pipeline, order, worker mode and the split of
    the cores. A loader has no model, optimizer or schedule, so those rules are not asked
    (`batch_size` must be set)."""
    d: dict[str, Decision] = {}
    device = _decide(d, "device", pick_device(config.device, machine.gpus, machine.local_rank))
    size = config.image_size
    if size is None:
        size = _decide(d, "image_size", rules.image_size(facts.largest_side, facts.train_count,
                                                         device.type))
    if config.progressive and config.min_res is not None and config.min_res > size:
        raise TrainError(f"min_res {config.min_res} is above the image size {size}")
    config = config.replace(device=device.type, image_size=size)
    d["augment"] = augmentation(config.augment_policy(), device.type)
    need, room = _resident_room(config, facts, machine, device)
    pipeline = _pipeline(d, config, machine, observed, need, room)
    config = config.replace(order=_order(d, config, facts, machine, pipeline))
    mode = _worker_mode(d, config)
    budget, threads = _threads(d, config, facts, machine, device.type, pipeline, observed)
    config = config.replace(pipeline=pipeline, worker_mode=mode, workers=threads.workers,
                            threads=threads.torch_threads)
    return Plan(config, machine, _ordered(d), budget=budget, threads=threads)


def _resident_room(config: TrainConfig, facts: DatasetFacts, machine: Machine,
                   device: torch.device) -> tuple[int, tuple[int, str]]:
    """(the resident store's bytes at the image size, its memory budget on `device`)."""
    gpu = machine.gpu if device.type == "cuda" else None
    return (facts.resident_bytes(config.image_size),
            budget_of(gpu.free if gpu is not None else machine.ram_bytes, device))


def _worker_mode(d: dict, config: TrainConfig) -> str:
    if config.worker_mode != AUTO:
        return config.worker_mode
    return _decide(d, "worker_mode", rules.worker_mode())


def _order(d: dict, config: TrainConfig, facts: DatasetFacts, machine: Machine,
           pipeline: str) -> str:
    return _decide(d, "order", rules.order(
        config.order, pipeline=pipeline,
        reads_during_epoch=capabilities(pipeline).reads_during_epoch,
        stored_bytes=facts.stored_bytes,
        ram_bytes=machine.ram_bytes, cache_limit=facts.cache_limit,
        same_label_neighbours=facts.same_label_neighbours))


def _decide(d: dict, name: str, decision: Decision):
    d[name] = decision
    return decision.value


def _ordered(d: dict[str, Decision]) -> dict[str, Decision]:
    return {name: d[name] for name in ORDER if name in d}


def _resume(d: dict, config: TrainConfig, observed: Observed) -> TrainConfig:
    if config.resume != AUTO:
        return config
    if observed.out_names is _NOT_LISTED:  # info, tune: not started, --out not looked at
        d["resume"] = Decision(AUTO, "decided at start from what --out holds")
        return config
    d["resume"] = rules.resume(config.out, observed.out_names, rules.CHECKPOINT_NAME)
    return config.replace(resume=d["resume"].value)


def _host_memory(machine: Machine, observed: Observed) -> Decision:
    if observed.host_memory is not None:
        kept, why = observed.host_memory
        return Decision("kept for reuse" if kept else "glibc defaults", why)
    if machine.platform.startswith("linux"):
        return Decision("kept for reuse", "glibc keeps freed blocks up to 32 MiB for reuse "
                        "(host_memory.py): measured 1.4x faster CPU steps")
    return Decision("glibc defaults", f"{machine.platform}: glibc's mallopt is Linux-only")


def _weights(config: TrainConfig, observed: Observed) -> WeightsFacts | None:
    if config.resume is True or not config.from_weights:
        return None
    weights = observed.weights
    if weights is not None and weights.error:
        raise TrainError(weights.error)
    return weights


def _model(d: dict, config: TrainConfig, facts: DatasetFacts, device: str,
           weights: WeightsFacts | None, machine: Machine):
    """Image size, model and its arguments: asked for, else what the starting weights imply,
    else what a --time-budget on a CPU can train enough epochs of, else the rules for the data
    and the device."""
    hint = weights or WeightsFacts()
    size = config.image_size if config.image_size is not None else config.max_res
    if size is None and hint.image_size is not None:
        size = _decide(d, "image_size", Decision(
            hint.image_size, f"{hint.image_size} px, the size the --init-from weights learnt at"))
    name = config.model
    if size is None and name == AUTO and config.time_budget is not None and device == "cpu":
        picked = budget_size(budget_s=config.time_budget, train_count=facts.train_count,
                             largest_side=facts.largest_side, cores=machine.cores_per_rank,
                             fast_bf16=machine.cpu_bf16 and config.precision == "bf16")
        if picked is not None:
            size = _decide(d, "image_size", picked[0])
            name = _decide(d, "model", picked[1])
    if size is None:
        size = _decide(d, "image_size", rules.image_size(facts.largest_side, facts.train_count,
                                                         device))
    if name == AUTO and hint.model is not None:
        name = _decide(d, "model", Decision(hint.model, hint.reason))
    if name == AUTO:
        name = _decide(d, "model", Decision(*rules.model(size, device, facts.train_count)))
    if config.model_kwargs is not None:
        kwargs = parse_model_kwargs(config.model_kwargs)
    else:  # a run of the same model keeps the card's constructor arguments
        kwargs = hint.model_kwargs if hint.model == name and hint.model_kwargs else {}
        if kwargs:
            d["model_kwargs"] = Decision(canonical(kwargs), "the --init-from weights' "
                                         "model_kwargs")
    spec = get_model_spec(name, model_kwargs=kwargs, image_size=size, blurpool=config.blurpool)
    return config.replace(image_size=size, model=spec.name, model_kwargs=canonical(kwargs)), spec


def _progressive(d: dict, config: TrainConfig, facts: DatasetFacts, spec) -> TrainConfig:
    """Progressive resizing (plan/resolution.py): the schedule's settings resolved in the
    config (config.yaml reruns and resumes the same schedule), or progressive off."""
    decision = _decide(d, "progressive", resolution.progressive(
        config.progressive, image_size=config.image_size, epochs=config.epochs,
        small_images=facts.small, fixed_input=not spec.conv or "img_size" in spec.kwargs,
        min_res=config.min_res, res_ramp=config.res_ramp,
        epochs_measured=config.time_budget is not None and config.epochs >= BUDGET_MAX_EPOCHS))
    # max_res stays as given: the final size is image_size, one fact.
    if decision == resolution.OFF:
        return config.replace(progressive=False)
    return config.replace(progressive=True, min_res=decision.min_res,
                          res_ramp=(decision.start_ramp, decision.end_ramp))


def _evaluation(d: dict, config: TrainConfig, facts: DatasetFacts, spec) -> TrainConfig:
    """The evaluation resolution and flip TTA (eval_rules.py). The final training size is
    `config.image_size`, the size the run ends at."""
    family = augment.PAD_CROP if facts.small else augment.RESIZED_CROP
    any_size = spec.any_size
    size = _decide(d, "eval_res", eval_rules.eval_resolution(
        config.eval_res, train_size=config.image_size, small=facts.small, any_size=any_size))
    if size != config.image_size and not any_size:
        raise TrainError(f"--eval-res {size}: model {spec.name} is built for "
                         f"{config.image_size} px inputs; leave --eval-res out")
    tta = _decide(d, "tta", eval_rules.flip_tta(config.tta, train_family=family,
                                                 image_size=config.image_size))
    return config.replace(eval_res=size, tta=tta)


def _pipeline(d: dict, config: TrainConfig, machine: Machine, observed: Observed, need: int,
              budget: tuple[int, str]) -> str:
    """Asked for, else the first usable in auto's order on this machine (`need`: the resident
    store's bytes, `budget`: its memory budget there), skipping any that failed to open
    (PipelineError when none is left)."""
    if config.pipeline != AUTO:
        return _decide(d, "pipeline", Decision(config.pipeline, "asked for"))
    device = d["device"].value
    failed = dict(observed.unopenable)
    verdicts = {name: failed.get(name) or why_unavailable(
        name, registered=machine.pipelines, installed=machine.installed,
        device_type=device.type, resident_need=need, budget=budget) for name in auto_order()}
    return _decide(d, "pipeline", Decision(*first_usable(verdicts, resident_need=need,
                                                         device=device)))


def _batch(d: dict, config: TrainConfig, facts: DatasetFacts, machine: Machine, spec,
           reserve: int, observed: Observed) -> tuple[int, BatchSearch | None]:
    """(the micro-batch, the search still to run): asked for; else the device's preferred batch
    (or this rank's share of --global-batch-size), lowered to what fits, which only a search
    can tell: until `observed.batch_fit` holds its answer, the plan assumes the bound."""
    if config.batch_size is not None:
        return config.batch_size, None
    search = rules.batch_search(
        preferred=rules.auto_batch_size(config.image_size, config.device,
                                        facts.train_count // machine.world_size, config.epochs),
        global_batch=config.global_batch_size, world_size=machine.world_size,
        count=facts.train_count, reserve_bytes=reserve)
    if config.device.startswith("cuda") and config.augment_policy().enabled:
        # the augmentation stage's work memory at the largest batch the search may keep
        search = dataclasses.replace(search, reserve_bytes=search.reserve_bytes + work_bytes(
            search.bound, config.image_size))
    if observed.batch_fit is None:
        d["batch_size"] = Decision(search, f"{search.why}; the largest that fits is measured "
                                   "at start (batch_finder)")
        return search.bound, search
    fitted = rules.batch_from_fit(search, observed.batch_fit, count=facts.train_count,
                                  model=spec.name, image_size=config.image_size)
    if config.compile:  # batch_finder's trial steps are eager: say the run's are not
        fitted = Decision(fitted.value, f"{fitted.reason}; trial steps eager, the run's "
                          "compiled (torch.compile: not what was measured)")
    return _decide(d, "batch_size", fitted), None


def _optimizer(d: dict, config: TrainConfig, facts: DatasetFacts, machine: Machine, spec,
               weights: WeightsFacts | None) -> TrainConfig:
    """Accumulation, the checks against the split's size, LR, weight decay, worker mode."""
    world, batch = machine.world_size, config.batch_size
    accum = config.accum_steps
    if config.global_batch_size is not None:
        accum = _decide(d, "accum_steps", rules.accum_for_global_batch(
            config.global_batch_size, config.accum_steps, batch, world))
    rules.check_batch_fits_split(batch, accum, world, facts.train_count)
    lr = config.lr
    if lr is None:
        factor = recipe.lr_factor(weights, freeze_backbone=config.freeze_backbone,
                                  num_classes=facts.num_classes, class_names=facts.class_names)
        lr = _decide(d, "lr", recipe.learning_rate(config.optimizer, spec,
                                                   batch * world * accum, factor))
    decay = config.weight_decay
    if decay is None:
        decay = _decide(d, "weight_decay", recipe.weight_decay(config.optimizer, spec))
    mode = _worker_mode(d, config)
    return config.replace(accum_steps=accum, lr=lr, weight_decay=decay, worker_mode=mode)


def _threads(d: dict, config: TrainConfig, facts: DatasetFacts, machine: Machine, device: str,
             pipeline: str, observed: Observed) -> tuple[ThreadPlan, ThreadPlan]:
    """(the budget the pipeline is opened with, the split after it): the one worker policy
    (pipeline/workers.py) for this rank's share of the cores."""
    budget = split_cores(device, cores=machine.cores_per_rank, workers=config.workers,
                         threads=config.threads, jpeg_fraction=facts.jpeg_fraction)
    threads = budget
    opened = observed.pipeline
    # Before opening: a pipeline that makes its batches in the training process leaves
    # torch every core (its `cpu_workers` is 0: resident.py says why).
    used = (opened.cpu_workers if opened is not None else
            0 if capabilities(pipeline).loads_in_process else None)
    if config.threads is None:
        threads = after_pipeline(budget, used, pipeline, device)
    elif used is not None and used < budget.workers:  # both asked for: torch's stays
        threads = dataclasses.replace(budget, workers=used)
    if config.workers is not None and used is not None and used < config.workers:
        # Said, not silent: the workers asked for are not where the user thinks they are.
        threads = dataclasses.replace(threads, reason=(
            f"--workers {config.workers} are used only while the {pipeline} pipeline loads "
            f"(it makes its batches in the training process, between steps); no worker runs "
            f"beside the model, so torch has {threads.torch_threads} of {threads.cores} cores"))
    d["threads"] = Decision(f"{threads.workers} pipeline workers + {threads.torch_threads} "
                            f"torch threads on {threads.cores} cores", threads.reason)
    return budget, threads


def budget_sized(config: TrainConfig, *, warmup_planned: bool) -> tuple[str, ...]:
    """The settings a --time-budget run sizes after timing its first steps (run_length.py),
    whose planned values are placeholders: the epochs when --epochs was not given (the
    BUDGET_MAX_EPOCHS cap) and an automatic warm-up (5 % of that cap's steps). A rerun
    from config.yaml must size them again: saved, the placeholder warm-up would read as one
    asked for, and a 3-epoch run would rerun with a 2,000-step warm-up (issue 46)."""
    if config.time_budget is None:
        return ()
    return ((("epochs",) if config.epochs >= BUDGET_MAX_EPOCHS else ())
            + (("warmup_steps",) if warmup_planned else ()))


def _schedule(d: dict, config: TrainConfig, facts: DatasetFacts, machine: Machine,
              pipeline: str, observed: Observed) -> tuple[TrainConfig, int, int]:
    """Steps per epoch (the opened pipeline's batches, else predicted: this rank's share of the
    split in whole batches), the run's length and the warm-up."""
    if observed.pipeline is not None:
        batches = observed.pipeline.batches
    else:
        batches = (facts.train_count // machine.world_size) // config.batch_size
    steps = batches // config.accum_steps
    if steps == 0:
        raise TrainError(f"the {pipeline} pipeline yields {batches} batches per epoch, fewer "
                         f"than --accum-steps {config.accum_steps}")
    total = config.epochs * steps
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    warmup = config.warmup_steps
    if config.warmup_epochs is not None:  # saved as the steps: config.yaml has one warm-up
        warmup = round(config.warmup_epochs * steps)
        d["warmup"] = Decision(f"{warmup} steps", f"--warmup-epochs {config.warmup_epochs:g} x "
                               f"{steps} steps per epoch")
    elif warmup is None:
        planned = recipe.warmup_steps(total, from_weights=config.from_weights)
        if config.time_budget is not None:  # run_length.RunLength.apply fits it again
            planned = Decision(planned.value, f"{planned.reason} for now: fitted to the run's "
                               "length once --time-budget sizes it")
        warmup = _decide(d, "warmup_steps", planned)
    return config.replace(warmup_steps=warmup, warmup_epochs=None), steps, total
