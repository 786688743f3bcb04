"""Flip test-time augmentation: the one way every evaluation (training's, `eval`, `predict`)
turns a batch into logits, so that they cannot drift apart (plan/eval_rules.py says when)."""
from __future__ import annotations

import torch
from torch import nn


def eval_logits(model: nn.Module, images: torch.Tensor, *, tta: bool) -> torch.Tensor:
    """`model`'s logits of a (B, 3, H, W) batch; with `tta`, the mean of the logits of each
    image and of its horizontal mirror, in float32 (two forward passes of B images, not one of
    2B: the eval batch then needs no more memory than without TTA). Call it under the caller's
    no_grad and autocast."""
    logits = model(images)
    if not tta:
        return logits
    mirrored = model(images.flip(3))
    return (logits.float() + mirrored.float()) * 0.5
