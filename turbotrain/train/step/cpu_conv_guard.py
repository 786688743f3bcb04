"""A strided convolution whose input is one pixel wide runs in fp32 under CPU autocast.

oneDNN's bf16 weight gradient of a stride-2 3x3 convolution on a 1x1 input (torch 2.14.1,
a CPU with avx512_bf16) is garbage: measured on the dev box, 3 in 4 such backward passes gave
a weight gradient off by more than 5 % of its largest entry, 1 in 5 a nan/inf (it reads
memory it never wrote: the same inputs give other values in another process). With
`ONEDNN_MAX_CPU_ISA=AVX512_CORE` (no bf16 instructions), with a 2x2 input or stride 1, every
gradient was right. ResNets meet that shape at 16 px and below (layer4's first conv sees
1x1), where one step of a fine-tune turned the weights nan 1 run in 6.

Only those convolutions leave autocast: one pixel each, their cost is nothing beside the
rest of the net. The module stays an nn.Conv2d (a subclass) with the same parameters and
state_dict keys, so checkpoints, EMA copies and exports see a plain Conv2d.
"""
from __future__ import annotations

import torch
from torch import nn


class OnePixelSafeConv2d(nn.Conv2d):
    """nn.Conv2d, but in fp32 when CPU autocast is on and the input is one pixel wide or
    high and the stride is above 1 (the oneDNN bf16 backward above)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and min(x.shape[-2:]) == 1 and \
                torch.is_autocast_enabled("cpu"):
            with torch.autocast("cpu", enabled=False):
                return super().forward(x.float())
        return super().forward(x)


def guard_strided_convs(model: nn.Module) -> int:
    """Makes each plain strided nn.Conv2d in `model` a OnePixelSafeConv2d, in place; returns
    how many. Subclasses of Conv2d (timm's padding-same convs) keep their own forward."""
    count = 0
    for module in model.modules():
        if type(module) is nn.Conv2d and max(module.stride) > 1:
            module.__class__ = OnePixelSafeConv2d
            count += 1
    return count
