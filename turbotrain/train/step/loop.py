"""The hot loop's two halves: one optimizer step over K micro-batches, and evaluation.

`make_engine` builds the step (optimizer, GradScaler, StepEngine) for every tool that runs one:
the trainer (builder.py), the batch finder's trial steps (batch_finder.py) and tune's rate
measurement (tune.py), so what they measure is the step a run takes (fp16's GradScaler, the
fused optimizer on CUDA, clipping and label smoothing included). How the step runs is one
`StepSettings`, made once from the plan (`StepSettings.of`) and passed whole.

Nothing here calls `.item()`: the loss is summed on the device and read at log points only, so
on CUDA the CPU can queue the next steps while the GPU works (one `.item()` per step stalls the
queue each step).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch
from torch import nn

from .device import autocast_context, make_grad_scaler
from .distributed import DistEnv, all_reduce_sum, sync_context
from .ema import ModelEMA
from .flip_tta import eval_logits
from .mixing import Mixer, soft_target_cross_entropy
from .schedule import PEAK_LR, LRSchedule, build_optimizer

TOP_K = 5  # val_top5: a hit when the label is among the 5 highest logits


@dataclass(frozen=True)
class StepSettings:
    """How one training step runs: the plan's resolved values, made once (`of`) and handed whole
    to the step engine, the batch search's trial steps and tune's measurement."""
    device: torch.device
    precision: str  # "bf16", "fp16" or "fp32": autocast and the GradScaler follow it
    channels_last: bool
    optimizer: str = "sgd"
    lr: float = 1e-3  # the peak LR (plan/recipe.py); the schedule scales it per step
    weight_decay: float = 0.0
    momentum: float = 0.9
    accum_steps: int = 1  # micro-batches per optimizer step
    label_smoothing: float = 0.0
    clip_grad: float = 0.0  # the global gradient norm's limit; 0: off

    @classmethod
    def of(cls, planned) -> StepSettings:
        """From a plan (plan.Plan): its device and its resolved config."""
        c = planned.config
        return cls(device=planned.device, precision=c.precision, channels_last=c.channels_last,
                   optimizer=c.optimizer, lr=c.lr, weight_decay=c.weight_decay,
                   momentum=c.momentum, accum_steps=c.accum_steps,
                   label_smoothing=c.label_smoothing, clip_grad=c.clip_grad)

    def replace(self, **changes) -> StepSettings:
        return dataclasses.replace(self, **changes)

    @property
    def memory_format(self) -> torch.memory_format:
        return torch.channels_last if self.channels_last else torch.contiguous_format


class StepEngine:
    """Forward and loss under autocast, backward through the GradScaler, optimizer step every
    `accum_steps` micro-batches with the loss scaled by 1/K, so K micro-batches of B add up to
    the gradient of one batch of K*B.

    Each optimizer step sets the groups' LRs from `schedule` and the step's number (None: the
    LRs stay as the optimizer has them). With a `mixer` (--mixup / --cutmix, mixing.py) each
    micro-batch is mixed by its position (epoch, micro-batch index) and trained on soft
    targets. With `clip_grad` > 0 the global gradient norm is clipped once per optimizer step,
    after the GradScaler unscaled the gradients; the norm stays on the device (`grad_norm`,
    read at log points)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler, settings: StepSettings, *,
                 schedule: LRSchedule | None = None, ema: ModelEMA | None = None,
                 ema_source: nn.Module | None = None, mixer: Mixer | None = None):
        self.model = model  # possibly compiled and/or DDP-wrapped
        self.optimizer = optimizer
        self.schedule = schedule
        self.scaler = scaler
        self.settings = settings
        self.criterion = nn.CrossEntropyLoss(label_smoothing=settings.label_smoothing)
        self.ema = ema
        self.ema_source = ema_source  # the plain module the EMA follows
        self.mixer = mixer
        self.grad_norm: torch.Tensor | None = None  # the last step's, before clipping
        # Top-1 hits on the training batches since the last read, summed on the device, and
        # the images they are out of (`take_accuracy_counts`, at log points): no host sync per
        # step (a tensor made from a host number on CUDA would be a blocking copy: the count
        # stays a Python int).
        self._hits: torch.Tensor | None = None
        self._images = 0

    def micro_step(self, images: torch.Tensor, labels: torch.Tensor, will_step: bool,
                   position: tuple[int, int] | None = None) -> torch.Tensor:
        """Forward + backward of one micro-batch; returns its (unscaled) loss / K, detached.
        `position`: (epoch, index of the micro-batch in it), which a mixer needs."""
        s, criterion, targets = self.settings, self.criterion, labels
        if self.mixer is not None:
            if position is None:
                raise ValueError("a StepEngine with a mixer needs each micro-batch's position")
            images, targets = self.mixer(images, labels, epoch=position[0], micro=position[1])
            criterion = soft_target_cross_entropy
        images = images.contiguous(memory_format=s.memory_format)  # no-op when it already is
        with sync_context(self.model, will_step):
            with autocast_context(s.device, s.precision):
                logits = self.model(images)
                loss = criterion(logits, targets) / s.accum_steps
            self.scaler.scale(loss).backward()
        self._count_hits(logits.detach(), labels)
        return loss.detach()

    def _count_hits(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Adds the micro-batch's top-1 hits (against each image's own label, mixed or not)
        and its size to the device-side counts: an argmax and a sum a micro-batch, queued
        like the step itself."""
        hits = (logits.argmax(dim=1) == labels).sum()
        self._hits = hits if self._hits is None else self._hits + hits
        self._images += labels.shape[0]

    def take_accuracy_counts(self) -> tuple[torch.Tensor | None, int]:
        """(top-1 hits as a device tensor or None, images) on the training batches since the
        last call; the counts start again from zero."""
        counts = self._hits, self._images
        self._hits, self._images = None, 0
        return counts

    def optimizer_step(self, step: int) -> None:
        """Steps the optimizer at the LRs of optimizer step `step` (the run's steps before
        this one: a resumed run passes its counter, and the schedule needs nothing else)."""
        if self.schedule is not None:
            self.schedule.apply(self.optimizer, step)
        clip = self.settings.clip_grad
        if clip > 0:
            self.scaler.unscale_(self.optimizer)  # a no-op unless fp16; step() then won't redo it
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            # No host sync: the norm and the clip factor stay tensors on the device.
            self.grad_norm = nn.utils.clip_grad_norm_(params, clip, foreach=True)
        self.scaler.step(self.optimizer)  # skips the step when fp16 gradients hold inf/nan
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.ema_source)

    def log_record(self) -> dict:
        """Read at log points (where the trainer syncs anyway): with --clip-grad, the last
        step's gradient norm before clipping."""
        return {} if self.grad_norm is None else {"grad_norm": float(self.grad_norm)}

    def lr(self, step: int) -> float:
        """The first group's LR at optimizer step `step` (the head's, the peak one, with
        --layer-decay)."""
        group = self.optimizer.param_groups[0]
        return group["lr"] if self.schedule is None else self.schedule.lr(step, group[PEAK_LR])


def make_engine(model: nn.Module, settings: StepSettings, *, groups: list[dict] | None = None,
                schedule: LRSchedule | None = None, train_model: nn.Module | None = None,
                ema: ModelEMA | None = None, mixer: Mixer | None = None) -> StepEngine:
    """The training step as a run takes it: the settings' optimizer over `model`'s parameters
    (or `groups`), fused on CUDA, a GradScaler that is live under fp16 only, and the StepEngine.
    `model`: the plain module the optimizer (and the EMA) follow; `train_model`: what runs the
    forward pass (compiled and/or DDP-wrapped), `model` itself by default."""
    s = settings
    opt = build_optimizer(model, name=s.optimizer, lr=s.lr, weight_decay=s.weight_decay,
                          momentum=s.momentum, fused=s.device.type == "cuda", groups=groups)
    return StepEngine(model if train_model is None else train_model, opt,
                      make_grad_scaler(s.device, s.precision), s, schedule=schedule, ema=ema,
                      ema_source=model, mixer=mixer)


@torch.no_grad()
def evaluate(model: nn.Module, pipeline, *, device: torch.device, precision: str,
             channels_last: bool, env: DistEnv, tta: bool = False) -> dict:
    """Accuracy, top-5 accuracy and mean cross-entropy (no label smoothing) over the whole
    split, summed across ranks; every count stays on the device until the one read at the end.
    `tta`: each image's logits averaged with its mirror's (flip_tta.py).
    With 5 classes or fewer `val_top5` is None: the five best guesses hold every class, so any
    model would score 100%. `pipeline` is rewound to its first batch before and after."""
    was_training = model.training
    model.eval()
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    # loss sum, correct, count, correct in the top 5
    totals = torch.zeros(4, dtype=torch.float64, device=device)
    start = time.perf_counter()
    classes = 0
    initial = pipeline.state_dict()
    try:
        for images, labels in pipeline:
            images = images.contiguous(memory_format=memory_format)
            with autocast_context(device, precision):
                logits = eval_logits(model, images, tta=tta)
            loss = nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
            totals[0] += loss
            totals[1] += (logits.argmax(dim=1) == labels).sum()
            totals[2] += labels.numel()
            classes = logits.shape[1]
            top = logits.topk(min(TOP_K, classes), dim=1).indices
            totals[3] += (top == labels[:, None]).any(dim=1).sum()
    finally:
        pipeline.load_state_dict(initial)
        model.train(was_training)
    loss_sum, correct, count, correct5 = all_reduce_sum(totals, env).tolist()
    count = max(count, 1.0)
    return {"val_loss": loss_sum / count, "val_accuracy": correct / count,
            "val_top5": correct5 / count if classes > TOP_K else None,
            "val_images": int(count),
            "eval_seconds": time.perf_counter() - start}


def parameters_finite(model: nn.Module) -> bool:
    params = [p.detach() for p in model.parameters()]
    if not params:
        return True
    norms = torch._foreach_norm(params)
    return bool(torch.isfinite(torch.stack(norms)).all())
