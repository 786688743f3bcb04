"""Optimizer, its parameter groups and the learning-rate schedule.

Norm weights and biases (every parameter with fewer than 2 dimensions) get no weight decay:
decaying a BatchNorm scale only changes the effective learning rate of the layer before it and
costs accuracy on short runs.

The peak learning rate, the warm-up length and the weight decay are the plan's (plan/recipe.py);
this module applies them. The learning rate is a pure function of the optimizer step (`lr_at`, like nanoGPT's get_lr):
the training step sets each parameter group's LR from it (`LRSchedule.apply`), so there is no
scheduler state to save, restore or patch on resume; the step count is the run's own counter.
Each group's peak is its "lr" when the optimizer was built, kept in the group as "initial_lr"
(torch's schedulers' key, so checkpoints written with a LambdaLR resume with the same peaks).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

SCHEDULES = ("cosine", "linear", "onecycle")
# The parameter-group key holding a group's peak LR (per-group scales of --layer-decay and the
# fine-tuning groups included): the same key torch's LR schedulers use.
PEAK_LR = "initial_lr"


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, *, name: str, lr: float, weight_decay: float,
                    momentum: float, fused: bool = False,
                    groups: list[dict] | None = None) -> torch.optim.Optimizer:
    """`fused` (the trainer sets it on CUDA): the whole update is one kernel per parameter
    group instead of foreach's several (SGD: momentum, Nesterov, decay, step; AdamW more), and
    a GradScaler's inf check happens inside it, without a host sync. Off on the CPU, where the
    plain loop is what the CPU timings in the docs were measured with. `groups`: parameter
    groups of their own (--layer-decay's, each with its "lr"), instead of `param_groups`."""
    groups = param_groups(model, weight_decay) if groups is None else groups
    if name == "sgd":
        optimizer = torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=True,
                                    fused=fused or None)
    else:
        optimizer = torch.optim.AdamW(groups, lr=lr, betas=(momentum, 0.999),
                                      fused=fused or None)
    for group in optimizer.param_groups:  # each group's peak, for LRSchedule.apply
        group.setdefault(PEAK_LR, group["lr"])
    return optimizer


def lr_at(step: int, *, total: int, warmup: int, kind: str, peak: float = 1.0,
          anchor: tuple[int, float] = (0, 0.0)) -> float:
    """The learning rate of optimizer step `step` (0 = the first): linear warm-up from
    peak/warmup to peak over `warmup` steps, then a decay to 0 at `total` steps, cosine or
    linear. `onecycle` ignores `warmup`: it ramps up over the first 25% and down linearly to 0,
    the triangular schedule of the fast CIFAR recipes. With peak 1, the multiplier.

    `anchor` (step, progress): the decay was `progress` of the way at `step` when the run's
    length changed (`LRSchedule.resized`); from there it goes on to 1 at `total`, so the LR
    is continuous at the change and still ends at 0 on the run's last step."""
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule {kind!r}; choose one of: {', '.join(SCHEDULES)}")
    total = max(1, total)
    warmup = _ramp(total, warmup, kind)
    if step < warmup:
        return peak * ((step + 1) / warmup)
    progress = _decay_progress(step, total, warmup, anchor)
    if kind == "cosine":
        return peak * (0.5 * (1.0 + math.cos(math.pi * progress)))
    return peak * (1.0 - progress)


def _ramp(total: int, warmup: int, kind: str) -> int:
    return max(1, round(0.25 * total)) if kind == "onecycle" else max(0, warmup)


def _decay_progress(step: int, total: int, warmup: int, anchor: tuple[int, float]) -> float:
    """0 at the warm-up's end, 1 at `total`; after an anchor, linear from it to 1."""
    if step < warmup:
        return 0.0
    anchor_step, anchor_progress = anchor
    if warmup < anchor_step <= step:
        left = (1.0 - anchor_progress) / max(1, total - anchor_step)
        return min(1.0, anchor_progress + (step - anchor_step) * left)
    return min(1.0, (step - warmup) / max(1, total - warmup))


@dataclass(frozen=True)
class LRSchedule:
    """The run's schedule: `lr_at` with its settings bound."""
    total: int
    warmup: int
    kind: str
    anchor: tuple[int, float] = (0, 0.0)

    def __post_init__(self):
        lr_at(0, total=self.total, warmup=self.warmup, kind=self.kind)  # checks `kind`

    def lr(self, step: int, peak: float = 1.0) -> float:
        return lr_at(step, total=self.total, warmup=self.warmup, kind=self.kind, peak=peak,
                     anchor=self.anchor)

    def resized(self, total: int, at_step: int) -> LRSchedule:
        """The same schedule for a run now `total` steps long, changed at step `at_step`: the
        warm-up (if not over) is kept, the rest of the decay stretched or shrunk to end at
        `total`, so the LR does not jump at `at_step`. A onecycle schedule's 25 % ramp is
        fixed at its present length (it is a linear schedule with that warm-up)."""
        warmup = _ramp(max(1, self.total), self.warmup, self.kind)
        kind = "linear" if self.kind == "onecycle" else self.kind
        if at_step <= warmup:
            return LRSchedule(total=total, warmup=warmup, kind=kind)
        progress = _decay_progress(at_step, max(1, self.total), warmup, self.anchor)
        return LRSchedule(total=total, warmup=warmup, kind=kind, anchor=(at_step, progress))

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        """Sets every parameter group's LR for optimizer step `step`, from its own peak."""
        for group in optimizer.param_groups:
            group["lr"] = self.lr(step, group[PEAK_LR])

