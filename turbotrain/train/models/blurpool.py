"""BlurPool (Zhang 2019, "Making convolutional networks shift-invariant again"): low-pass
filter a map before it is subsampled, so that a one-pixel shift of the input no longer flips
what a stride-2 layer keeps. FFCV's ImageNet recipes wrap every strided conv of a ResNet
(`BlurPoolConv2d`: a fixed depthwise [1 2 1] x [1 2 1] / 16 blur, then the conv), and
Composer's Mild recipe also turns max-pools into a stride-1 max followed by a stride-2 blur;
both report +0.5-1 pt of ImageNet top-1 for ~5 % more compute.

`apply_blurpool(net)` does both, in place:

* every `nn.Conv2d` with a stride above 1 and at least MIN_CHANNELS input channels becomes a
  `BlurConv2d` (the RGB stem is left alone, as FFCV does: blurring the raw image only loses
  detail);
* every `nn.MaxPool2d` with a stride above 1 becomes a `BlurMaxPool2d` (our own nets downsample
  this way and have no strided conv; torchvision's ResNets have one after the stem).

Neither replacement adds a weight: the blur filter is a non-persistent buffer, so a BlurPool
model's state dict has the same keys and shapes as the plain one. That is why the weights card
records `blurpool`: the same tensors compute something else without it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MIN_CHANNELS = 16  # FFCV's rule: `mod.in_channels >= 16` (not the 3-channel stem)


def _blur_filter(channels: int) -> torch.Tensor:
    """(channels, 1, 3, 3): the binomial [1 2 1] x [1 2 1] / 16 low-pass, one per channel."""
    row = torch.tensor([1.0, 2.0, 1.0])
    kernel = torch.outer(row, row) / 16.0
    return kernel.expand(channels, 1, 3, 3).contiguous()


def blur(x: torch.Tensor, weight: torch.Tensor, stride: int = 1) -> torch.Tensor:
    """A depthwise blur of `x` by `weight` (_blur_filter), zero-padded to keep the size at
    stride 1 (FFCV's padding)."""
    return F.conv2d(x, weight.to(x.dtype), stride=stride, padding=1, groups=x.shape[1])


class BlurConv2d(nn.Conv2d):
    """A strided conv that blurs its input first (FFCV's BlurPoolConv2d), with the conv's own
    parameters, so its state dict is the conv's."""

    @classmethod
    def of(cls, conv: nn.Conv2d) -> BlurConv2d:
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                  padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
                  bias=conv.bias is not None, padding_mode=conv.padding_mode,
                  device=conv.weight.device, dtype=conv.weight.dtype)
        new.weight = conv.weight
        if conv.bias is not None:
            new.bias = conv.bias
        return new

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("blur_filter", _blur_filter(self.in_channels).to(
            self.weight.device), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(blur(x, self.blur_filter))


class BlurMaxPool2d(nn.Module):
    """MaxPool2d(k, stride s) as a stride-1 max-pool, then a blur subsampling by s (Zhang's
    MaxBlurPool; Composer's BlurMaxPool2d). Same output size as the pool it replaces for the
    pools our nets and torchvision's ResNets use (k=2 s=2 p=0; k=3 s=2 p=1)."""

    def __init__(self, pool: nn.MaxPool2d):
        super().__init__()
        self.kernel_size, self.stride = pool.kernel_size, pool.stride
        self.padding, self.dilation = pool.padding, pool.dilation
        self.ceil_mode = pool.ceil_mode
        # One channel's filter, a buffer so that it moves with the module: the pool does not
        # know its channel count, and building the filter in forward would copy it from the
        # host at every step on CUDA. Expanded per call (a view, no copy).
        self.register_buffer("blur_filter", _blur_filter(1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(x, self.kernel_size, stride=1, padding=self.padding,
                         dilation=self.dilation, ceil_mode=self.ceil_mode)
        channels = x.shape[1]
        return blur(x, self.blur_filter.expand(channels, 1, 3, 3), stride=self.stride)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


def _strided(stride) -> bool:
    return max(stride if isinstance(stride, tuple) else (stride,)) > 1


def apply_blurpool(net: nn.Module) -> int:
    """Replaces, in place, the strided convs (>= MIN_CHANNELS inputs) and strided max-pools of
    `net` by their BlurPool versions; returns how many."""
    count = 0
    for parent in list(net.modules()):
        for name, child in list(parent.named_children()):
            if (type(child) is nn.Conv2d and _strided(child.stride)
                    and child.in_channels >= MIN_CHANNELS):
                setattr(parent, name, BlurConv2d.of(child))
                count += 1
            elif type(child) is nn.MaxPool2d and _strided(child.stride or child.kernel_size):
                setattr(parent, name, BlurMaxPool2d(child))
                count += 1
    return count
