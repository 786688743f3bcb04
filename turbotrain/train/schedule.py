"""Optimizer, its parameter groups and the learning-rate schedule.

Norm weights and biases (every parameter with fewer than 2 dimensions) get no weight decay:
decaying a BatchNorm scale only changes the effective learning rate of the layer before it and
costs accuracy on short runs.
"""
from __future__ import annotations

import math

import torch
from torch import nn

REFERENCE_BATCH = 256  # learning rates are quoted per 256 images of global batch


def scaled_lr(base_lr_per_256: float, global_batch: int, optimizer: str) -> float:
    """SGD: linear scaling (Goyal et al. 2017). AdamW: square-root scaling, since its update size
    does not grow with the gradient's size the way SGD's does."""
    ratio = global_batch / REFERENCE_BATCH
    return base_lr_per_256 * (ratio if optimizer == "sgd" else math.sqrt(ratio))


ADAMW_LR_PER_256 = 1e-3
ADAMW_WEIGHT_DECAY = 0.05


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
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=True,
                               fused=fused or None)
    return torch.optim.AdamW(groups, lr=lr, betas=(momentum, 0.999), fused=fused or None)


class WarmupDecay:
    """LR multiplier at optimizer step `step`: linear warm-up from 1/warmup to 1, then decay to 0
    at `total` steps (cosine or linear). `onecycle` ramps up over the first 25% and down
    linearly to 0, the triangular schedule of the fast CIFAR recipes.

    A class, not a lambda, so LambdaLR's state_dict stores it and a resumed run gets it back.
    """

    def __init__(self, *, total: int, warmup: int, kind: str):
        if kind not in ("cosine", "linear", "onecycle"):
            raise ValueError(f"unknown schedule {kind!r}; choose one of: cosine, linear, onecycle")
        self.total = max(1, total)
        self.kind = kind
        self.warmup = max(1, round(0.25 * self.total)) if kind == "onecycle" else max(0, warmup)

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        span = max(1, self.total - self.warmup)
        progress = min(1.0, (step - self.warmup) / span)
        if self.kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - progress


def build_scheduler(optimizer: torch.optim.Optimizer, *, total: int, warmup: int,
                    kind: str) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupDecay(total=total, warmup=warmup,
                                                                    kind=kind))


def auto_warmup_steps(total_steps: int) -> int:
    """5% of the run, at least 1 and at most 2000 steps."""
    return int(min(2000, max(1, round(0.05 * total_steps))))
