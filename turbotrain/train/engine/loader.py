"""`Loader`: turbotrain's pipelines in your own training loop, and the object `train` iterates.

    from turbotrain import Loader
    loader = Loader("OUT", split="train", batch_size=256, image_size=224, device="cuda")
    for epoch in range(epochs):
        loader.set_epoch(epoch)     # optional: without it each pass is the next epoch
        for images, labels in loader: ...

A Loader is planned by the rules `train` uses (plan.plan_loader: device, image size, pipeline,
order, workers and threads; each with its reason in `decisions`), opens that pipeline (`auto`
moves on to the next in its fallback order when one fails to open, as `train` does) and hands
out its batches: uint8 `(B, 3, S, S)` channels_last and int64 labels on the device; with
`normalize=True`, `(x - mean) / std` in `dtype`, computed on the device with the dataset's
mean/std by the model stem's own formula (models.InputStem), so the bus still carries uint8.

Its position is the batches it has *handed out*: a pipeline that decodes ahead has read further,
and a resumed epoch must continue after the last batch the loop saw (`state_dict`).

Passes and epochs, as a DataLoader user expects them (`Loader.__iter__` states the rule): every
`iter()` starts a pass at the first batch of its epoch; a pass is the next epoch unless
`set_epoch` chose one since the last pass, or `load_state_dict` put the Loader mid-epoch.
"""
from __future__ import annotations

import os
from typing import Iterator

import torch

from turbotrain import augment_policy
from turbotrain.datasets import open_dataset
from turbotrain.pipeline import (PipelineError, PipelineOptions, PipelineUnavailable,
                                 build_pipeline, pipeline_names)

from ..config.config import AUTO, TrainConfig
from ..models.models import InputStem
from ..plan import (DatasetFacts, Decision, Machine, Observed, OpenedPipeline, Plan,
                    detect_machine, plan_loader)
from ..plan.resolution import schedule_of
from ..step.distributed import DistEnv, dist_env_from_environ

NORMALIZED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ORDERS = (AUTO, "random", "quasi-random")


class LoaderError(ValueError):
    """A bad Loader argument or saved state; str(e) is one line naming it."""


def open_planned(config: TrainConfig, facts: DatasetFacts, machine: Machine, observed: Observed,
                 dataset, env: DistEnv, planner, *, train: bool = True,
                 drop_last: bool | None = None) -> tuple[Plan, object, Observed]:
    """The planned pipeline over `dataset`: (the plan made with what the opened pipeline says,
    the pipeline, `observed` with the pipelines that failed to open and the opened one).
    `train`, `drop_last`: as PipelineOptions.

    With `--pipeline auto`, one that fails to open (PipelineUnavailable) is planned around:
    `planner(config, facts, machine, observed)` is asked again with it in
    `observed.unopenable`, and so picks the next in the fallback order."""
    while True:
        planned = planner(config, facts, machine, observed)
        name = planned.value("pipeline")
        try:
            pipeline = build_pipeline(name, dataset, pipeline_options(
                planned, env, train=train, drop_last=drop_last))
        except PipelineUnavailable as exc:
            if config.pipeline != AUTO:
                raise
            observed = observed.replace(unopenable=(*observed.unopenable, (name, str(exc))))
            continue
        # Planned again with what the opened pipeline says (its batches, its CPU workers):
        # the schedule's length and torch's share of the cores depend on it.
        observed = observed.replace(pipeline=OpenedPipeline(
            pipeline.name, len(pipeline), getattr(pipeline, "cpu_workers", None)))
        return planner(config, facts, machine, observed), pipeline, observed


def pipeline_options(planned: Plan, env: DistEnv, *, train: bool = True,
                     drop_last: bool | None = None) -> PipelineOptions:
    """The pipeline's settings as the plan gives them, made once and passed whole; `train`
    (and `drop_last`) say which split's: shuffled and augmented, or in order; the evaluation
    split's images come at the plan's evaluation resolution (plan/eval_rules.py)."""
    c = planned.config
    size = c.image_size if train or c.eval_res is None else c.eval_res
    # Progressive resizing sizes the training epochs only; evaluation is at its own size.
    schedule = schedule_of(c) if train else None
    return PipelineOptions(train=train, drop_last=drop_last, batch_size=c.batch_size,
                           image_size=size, device=planned.device, seed=c.seed,
                           rank=env.rank, world_size=env.world_size,
                           workers=planned.budget.workers, worker_mode=c.worker_mode,
                           scale=c.scale, ratio=c.ratio, order=c.order,
                           order_window=c.order_window, resolution=schedule,
                           augment=c.augment_policy() if train else None)


class Loader:
    """Batches of one prepared split for this rank (the module docstring shows the loop).

    data: prepare-dataset's OUT folder, one .beton file, or a URL (s3://...).
    pipeline: "auto" (the plan's choice, with its reason in `decisions["pipeline"]`) or one of
    `turbotrain.pipeline.pipeline_names()`. train: shuffled, augmented, full batches (default:
    split == "train"); else in order, centre-cropped, the last batch kept. rank/world_size:
    from the torch.distributed process group when there is one. min_res, res_ramp: progressive
    resizing (give both: the training batches of epochs before res_ramp[0] are min_res px,
    ramping to image_size at res_ramp[1]; `set_epoch` picks the size). The other arguments are
    the `train` flags of the same names."""

    def __init__(self, data, split: str = "train", *, batch_size: int = 256,
                 image_size: int | None = None, device=None, pipeline: str = AUTO,
                 normalize: bool = False, dtype: torch.dtype | None = None,
                 train: bool | None = None, drop_last: bool | None = None, seed: int = 0,
                 workers: int | None = None, threads: int | None = None,
                 worker_mode: str = AUTO, order: str = AUTO, order_window: int = 4,
                 scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3),
                 rank: int | None = None, world_size: int | None = None,
                 cache_dir: str | None = None, cache_limit: str | None = None,
                 min_res: int | None = None, res_ramp: tuple[float, float] | None = None,
                 aa: str | None = None, color_jitter: float = 0.0, reprob: float = 0.0,
                 remode: str = "pixel", recount: int = 1):
        _check_arguments(locals())
        env = _process_env(rank, world_size)
        training = split == "train" if train is None else train
        # Evaluation batches are never augmented: a val Loader's plan says augment off.
        augment = (dict(aa=aa, color_jitter=color_jitter, reprob=reprob, remode=remode,
                        recount=recount) if training else {})
        config = TrainConfig(data=os.fspath(data), pipeline=pipeline, image_size=image_size,
                             progressive=min_res is not None or None, min_res=min_res,
                             res_ramp=None if res_ramp is None else tuple(res_ramp),
                             batch_size=batch_size, device=_device_request(device),
                             seed=seed, workers=workers, threads=threads,
                             worker_mode=worker_mode, order=order, order_window=order_window,
                             scale=tuple(scale), ratio=tuple(ratio), cache_dir=cache_dir,
                             cache_limit=cache_limit, **augment)
        dataset = open_dataset(config.data, split=split, cache_dir=cache_dir,
                               cache_limit=cache_limit)
        facts = DatasetFacts.of(dataset)
        machine = detect_machine(env, gpus=config.device != "cpu")
        planned, opened, _ = open_planned(
            config, facts, machine, Observed(), dataset, env, _loader_planner(device),
            train=training, drop_last=drop_last)
        self._attach(opened, planned, dataset, normalize=normalize, dtype=dtype)

    @classmethod
    def opened(cls, pipeline, planned: Plan, dataset) -> Loader:
        """A Loader over a pipeline `train` opened from its full plan (builder.py)."""
        loader = cls.__new__(cls)
        loader._attach(pipeline, planned, dataset, normalize=False, dtype=None)
        return loader

    def _attach(self, pipeline, planned: Plan, dataset, *, normalize: bool,
                dtype: torch.dtype | None) -> None:
        self.pipeline = pipeline
        self.plan = planned
        self.dataset = dataset
        self.decisions: dict[str, str] = planned.lines  # what -> "value: reason"
        self.device: torch.device = planned.device
        self.batch_size: int = planned.config.batch_size
        self.image_size: int = planned.config.image_size
        self.normalize = normalize
        self.dtype = (dtype or torch.float32) if normalize else torch.uint8
        self._stem = (InputStem(dataset.mean, dataset.std).to(self.device) if normalize
                      else None)
        self._handed = 0  # batches of the current epoch handed out (the position saved)
        self._closed = False
        # What the next pass is (__iter__): set by set_epoch, load_state_dict and passes.
        self._passed = False  # a pass of the current epoch has started
        self._epoch_given = False  # set_epoch since the last pass
        self._restored = False  # load_state_dict since the last pass
        self._pass: Iterator | None = None  # the current pass's iterator

    # -- what the plan decided, readable on the object
    @property
    def pipeline_name(self) -> str:
        return self.pipeline.name

    @property
    def workers(self) -> int:
        return self.plan.threads.workers

    @property
    def torch_threads(self) -> int:
        """torch's share of this rank's cores beside the pipeline: pass it to
        torch.set_num_threads on CPU (two torch threads competing with decode work were
        measured to slow a step 30x)."""
        return self.plan.threads.torch_threads

    @property
    def cpu_workers(self) -> int | None:
        return getattr(self.pipeline, "cpu_workers", None)

    @property
    def name(self) -> str:
        return self.pipeline.name

    @property
    def num_classes(self) -> int:
        return self.dataset.num_classes

    @property
    def class_names(self) -> list[str]:
        """The class of each label, in label order (prepare-dataset's folder names; "0",
        "1", ... for a bare .beton written without names)."""
        return list(self.dataset.class_names)

    @property
    def classes(self) -> list[str]:
        """class_names under the name `open_dataset`'s split (and torchvision's ImageFolder)
        give it."""
        return self.class_names

    @property
    def epoch(self) -> int:
        """The epoch of the current pass (before the first: the one it will be)."""
        return self.pipeline.epoch

    # -- the pipeline contract (pipeline/base.py), counted in handed-out batches
    def __len__(self) -> int:
        return len(self.pipeline)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """A pass over one epoch, as a DataLoader user expects (a peek with
        `next(iter(loader))` does not shorten the next `for`, and passes without `set_epoch`
        reshuffle and re-augment):

        * it starts at the epoch's first batch, except right after `load_state_dict`, where it
          continues after the last batch handed out when the state was saved;
        * its epoch is the one `set_epoch` gave since the last pass; without one, the epoch
          after the last pass's (the first pass: epoch 0; after a restored epoch that was
          complete, the next one);
        * starting a pass ends the previous pass's iterator."""
        if self._closed:
            raise LoaderError("this Loader is closed; make a new one")
        self._end_pass()
        epoch, index = self._pass_start()
        if (epoch, index) != (self.pipeline.epoch, self.pipeline.batch_index):
            self.pipeline.load_state_dict({**self.pipeline.state_dict(), "epoch": epoch,
                                           "batch_index": index})
        self._handed = index
        self._restored = self._epoch_given = False
        self._passed = True
        self._pass = self._batches()
        return self._pass

    def _pass_start(self) -> tuple[int, int]:
        """(epoch, first batch) of the pass iter() starts: the rule in its docstring, a
        function of the position and of what was called since the last pass."""
        epoch = self.pipeline.epoch
        if self._restored and (self._handed < len(self) or self._epoch_given):
            return epoch, self._handed
        if self._passed and not self._epoch_given:
            return epoch + 1, 0
        return epoch, 0

    def _batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batches = iter(self.pipeline)
        try:
            for images, labels in batches:
                self._handed += 1
                yield (self._stem(images).to(self.dtype) if self._stem is not None
                       else images), labels
        finally:
            # Closed now, not when collected: its threads would still move the position.
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def _end_pass(self) -> None:
        if self._pass is not None:
            self._pass.close()
            self._pass = None

    def set_epoch(self, epoch: int) -> None:
        """The next pass is `epoch` (its order and augmentation, and its image size under
        progressive resizing), from its first batch; right after `load_state_dict` of the
        same epoch, from the restored position. Passes after it without set_epoch go on
        counting from it."""
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise LoaderError(f"set_epoch(epoch={epoch!r}): needs an integer >= 0")
        # The position is kept for the restored epoch, and for a pass of it still running.
        running = self._pass is not None and self._pass.gi_frame is not None
        if epoch != self.pipeline.epoch or not (self._restored or running):
            self._restored = False
            self._handed = 0
        self._epoch_given = True
        self.pipeline.set_epoch(epoch)

    def size_at(self, epoch: int) -> int:
        """The side in px of `epoch`'s batches: the image size, or under progressive
        resizing (train --min-res, --res-ramp) the schedule's for that epoch."""
        return self.pipeline.size_at(epoch)

    def state_dict(self) -> dict:
        """The position: the epoch and the batches of it handed out so far."""
        return {**self.pipeline.state_dict(), "epoch": self.pipeline.epoch,
                "batch_index": self._handed}

    def load_state_dict(self, state: dict) -> None:
        """The next pass continues after the last batch handed out when `state` was saved
        (the next epoch's first when that epoch was complete; `set_epoch` of the saved epoch
        keeps the position, of another drops it)."""
        epoch, index = _checked_position(state, len(self))
        self._end_pass()
        self.pipeline.load_state_dict({**state, "epoch": epoch, "batch_index": index})
        self._handed = index
        self._restored, self._passed, self._epoch_given = True, True, False

    def close(self) -> None:
        """Stops the pipeline's threads or processes; safe to call twice."""
        if not self._closed:
            self._closed = True
            self._end_pass()
            self.pipeline.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Loader({self.pipeline_name}, {len(self.dataset)} images, batch "
                f"{self.batch_size}, {self.image_size} px, {self.device}, "
                f"{'normalized ' + str(self.dtype) if self.normalize else 'uint8'})")


def _loader_planner(device):
    """plan_loader, keeping an explicit `cuda:N` (the rules plan `cuda` as this rank's GPU)."""
    asked = torch.device(device) if device not in (None, AUTO) else None

    def planner(config, facts, machine, observed):
        planned = plan_loader(config, facts, machine, observed)
        if asked is not None and asked.type == "cuda" and asked.index is not None:
            planned.decisions["device"] = Decision(asked, "asked for")
        return planned
    return planner


def _process_env(rank: int | None, world_size: int | None) -> DistEnv:
    """This process's place: the torch.distributed group's rank and size when there is one
    (torchrun's LOCAL_RANK for the GPU and the cores), else the arguments, else one process."""
    import torch.distributed as dist
    env = dist_env_from_environ()
    if dist.is_available() and dist.is_initialized():
        group_rank, group_size = dist.get_rank(), dist.get_world_size()
        for name, given, actual in (("rank", rank, group_rank),
                                    ("world_size", world_size, group_size)):
            if given is not None and given != actual:
                raise LoaderError(f"Loader({name}={given}): the torch.distributed process "
                                  f"group says {actual}; leave {name} out")
        return DistEnv(group_rank, group_size, env.local_rank, env.local_world_size)
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise LoaderError(f"Loader(rank={rank}, world_size={world_size}): needs "
                          "0 <= rank < world_size")
    local = env.local_world_size if env.world_size == world_size else 1
    return DistEnv(rank, world_size, env.local_rank if local > 1 else 0, local)


def _device_request(device) -> str:
    """The plan's device request ("auto", "cpu", "cuda") for `device=`."""
    if device is None or device == AUTO:
        return AUTO
    return torch.device(device).type


def _check_arguments(args: dict) -> None:
    """One LoaderError line naming the first bad argument."""
    def fail(name, why):
        raise LoaderError(f"Loader({name}={args[name]!r}): {why}")

    def whole(name, low, optional=False):
        value = args[name]
        if value is None and optional:
            return
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            fail(name, f"needs an integer >= {low}" + (" or None" if optional else ""))

    if not isinstance(args["data"], (str, os.PathLike)):
        fail("data", "needs a path or URL of a prepared dataset (prepare-dataset's OUT)")
    if not isinstance(args["split"], str) or not args["split"]:
        fail("split", "needs a split name such as 'train' or 'val'")
    whole("batch_size", 1)
    whole("image_size", 8, optional=True)
    whole("min_res", 8, optional=True)
    if (args["min_res"] is None) != (args["res_ramp"] is None):
        fail("min_res" if args["min_res"] is None else "res_ramp",
             "progressive resizing needs both min_res and res_ramp=(START, END)")
    ramp = args["res_ramp"]
    if ramp is not None and not (isinstance(ramp, (tuple, list)) and len(ramp) == 2
                                 and all(isinstance(v, (int, float)) for v in ramp)
                                 and 0 <= ramp[0] <= ramp[1]):
        fail("res_ramp", "needs two epochs (START, END) with 0 <= START <= END")
    whole("seed", 0)
    whole("workers", 0, optional=True)
    whole("threads", 1, optional=True)
    whole("order_window", 1)
    whole("rank", 0, optional=True)
    whole("world_size", 1, optional=True)
    device = args["device"]
    if device not in (None, AUTO):
        try:
            kind = torch.device(device).type
        except (RuntimeError, TypeError):
            kind = None
        if kind not in ("cpu", "cuda"):
            fail("device", "needs 'cpu', 'cuda', 'cuda:N', 'auto' or a torch.device")
    names = (AUTO, *pipeline_names())
    if args["pipeline"] not in names:
        fail("pipeline", f"choose one of: {', '.join(names)}")
    for name in ("normalize",):
        if not isinstance(args[name], bool):
            fail(name, "needs True or False")
    for name in ("train", "drop_last"):
        if args[name] is not None and not isinstance(args[name], bool):
            fail(name, "needs True, False or None")
    if args["dtype"] is not None:
        if not args["normalize"]:
            fail("dtype", "applies to normalized images: pass normalize=True too (the default "
                 "hands out uint8)")
        if args["dtype"] not in NORMALIZED_DTYPES:
            fail("dtype", "needs torch.float32, torch.float16 or torch.bfloat16")
    if args["worker_mode"] not in (AUTO, "threads", "processes"):
        fail("worker_mode", "choose one of: auto, threads, processes")
    if args["order"] not in ORDERS:
        fail("order", f"choose one of: {', '.join(ORDERS)}")
    try:
        augment_policy.policy(args["aa"], reprob=args["reprob"], remode=args["remode"],
                              recount=args["recount"], color_jitter=args["color_jitter"])
    except augment_policy.AugmentError as exc:
        raise LoaderError(f"Loader({exc.setting}={exc.value!r}): {exc.why}") from None
    for name in ("scale", "ratio"):
        pair = args[name]
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair)):
            fail(name, "needs two numbers (LO, HI)")


def _checked_position(state, batches: int) -> tuple[int, int]:
    """(epoch, batch index) of a saved state, or one LoaderError line."""
    if not isinstance(state, dict):
        raise LoaderError(f"load_state_dict: needs the dict state_dict() returned, not "
                          f"{type(state).__name__}")
    values = []
    for key in ("epoch", "batch_index"):
        value = state.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise LoaderError(f"load_state_dict: {key!r} must be an integer >= 0 (got "
                              f"{value!r:.40})")
        values.append(value)
    if values[1] > batches:
        raise LoaderError(f"load_state_dict: batch_index {values[1]} is past this Loader's "
                          f"{batches} batches per epoch (saved with another batch size or "
                          "world size?)")
    return values[0], values[1]


__all__ = ["Loader", "LoaderError", "PipelineError"]
