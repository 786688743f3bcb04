"""Small, fast nets for small images; each registers itself in models.py's registry.

Their inputs are already normalised float (the input stem does uint8 -> float); every one ends in
a global pool, so any image size works, though each is shaped for the size in its docstring.
"""
from __future__ import annotations

import torch
from torch import nn

from .registry import register_model


def conv_bn_relu(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
                         nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


def conv_pool_bn_relu(c_in: int, c_out: int) -> nn.Sequential:
    """A conv, then a 2x2 max-pool, then BatchNorm and ReLU on the pooled map."""
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.MaxPool2d(2),
                         nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


class Residual(nn.Module):
    def __init__(self, body: nn.Module):
        super().__init__()
        self.body = body

    def forward(self, x):
        return x + self.body(x)


class Scale(nn.Module):
    """Multiplies the logits by a constant: a cheap stand-in for a tuned output-layer LR."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


def _kaiming_convs(net: nn.Module) -> None:
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")


@register_model("resnet9", sgd_lr=0.4, weight_decay=5e-4)
def resnet9(num_classes: int) -> nn.Module:
    """The DAWNBench/Myrtle CIFAR ResNet-9 (32 px): 94% on CIFAR-10 in 24 epochs.

    ~0.38 GMAC per 32 px image. The final x0.125 keeps the logits small at the start so the
    high SGD learning rate does not blow up the head.
    """
    net = nn.Sequential(
        conv_bn_relu(3, 64),
        conv_bn_relu(64, 128), nn.MaxPool2d(2),
        Residual(nn.Sequential(conv_bn_relu(128, 128), conv_bn_relu(128, 128))),
        conv_bn_relu(128, 256), nn.MaxPool2d(2),
        conv_bn_relu(256, 512), nn.MaxPool2d(2),
        Residual(nn.Sequential(conv_bn_relu(512, 512), conv_bn_relu(512, 512))),
        nn.AdaptiveMaxPool2d(1), nn.Flatten(),
        nn.Linear(512, num_classes, bias=False), Scale(0.125))
    _kaiming_convs(net)
    return net


class ConvGroup(nn.Sequential):
    """airbench's block: conv, pool, BN, GELU, conv, BN, GELU (pooling before the BN is cheaper:
    the BN and GELU then touch a quarter of the pixels)."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__(
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.MaxPool2d(2),
            nn.BatchNorm2d(c_out), nn.GELU(),
            nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out), nn.GELU())
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                # Identity-initialised on the first c_in filters (airbench): the block starts
                # close to a pass-through, which trains faster from the first steps.
                nn.init.dirac_(m.weight.data[: m.weight.size(1)])


class AirbenchNet(nn.Module):
    """airbench94-style CIFAR net (32 px): 2x2 patch-whitening stem + three ConvGroups.

    ~0.15 GMAC per 32 px image, 2.6x fewer than ResNet-9. The whitening stem is initialised
    from the data (`data_init`) and then frozen, as in airbench; that alone saves epochs.
    """

    def __init__(self, num_classes: int, widths=(64, 256, 256)):
        super().__init__()
        self.whiten = nn.Conv2d(3, 24, kernel_size=2, padding=0, bias=True)
        self.whiten.weight.requires_grad_(False)
        self.body = nn.Sequential(
            nn.GELU(),
            ConvGroup(24, widths[0]), ConvGroup(widths[0], widths[1]),
            ConvGroup(widths[1], widths[2]),
            nn.AdaptiveMaxPool2d(1), nn.Flatten(),
            nn.Linear(widths[2], num_classes, bias=False), Scale(1 / 9))

    def forward(self, x):
        return self.body(self.whiten(x))

    @torch.no_grad()
    def data_init(self, images: torch.Tensor, eps: float = 5e-4) -> None:
        """Sets the stem to whiten 2x2 patches of `images` (normalised float, N,3,H,W): the
        12 eigenvectors of the patch covariance, scaled by 1/sqrt(eigenvalue), and their
        negatives (the GELU after it keeps both signs useful)."""
        patches = images.float().unfold(2, 2, 1).unfold(3, 2, 1)  # N,3,H-1,W-1,2,2
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, 12)
        patches = patches - patches.mean(dim=0)
        cov = patches.T @ patches / len(patches)
        eigenvalues, eigenvectors = torch.linalg.eigh(cov)
        filters = (eigenvectors.T / torch.sqrt(eigenvalues + eps)[:, None]).reshape(12, 3, 2, 2)
        weight = torch.cat([filters, -filters]).flip(0)  # largest eigenvalue first
        self.whiten.weight.copy_(weight.to(self.whiten.weight))


@register_model("airbench", sgd_lr=0.8, weight_decay=5e-4)
def airbench(num_classes: int) -> nn.Module:
    return AirbenchNet(num_classes)


@register_model("compact28", sgd_lr=0.4, weight_decay=5e-4)
def compact28(num_classes: int) -> nn.Module:
    """A compact conv net for 28x28 images (MNIST, Fashion-MNIST): ~18 MMAC per image (ResNet-18
    at 64 px: ~150). With the default recipe it reaches 90.6-91.0% on Fashion-MNIST in 2 epochs
    (4 seeds), ~26 s on the 2-core dev box in bf16.

    Each pooled stage pools right after its conv, before BatchNorm and ReLU (airbench's order):
    the norm and activation then run on a quarter of the pixels. At 28x28 those memory-bound
    passes cost as much as the convs; this order trains at 4,375 images/s against 4,066 for
    conv-BN-ReLU-pool, and the 16-channel first conv (24 before) brings it to 5,239 (bf16,
    channels_last, batch 128, 2 threads), with the same accuracy at 2 and 3 epochs.
    """
    net = nn.Sequential(
        conv_bn_relu(3, 16), conv_pool_bn_relu(16, 32),  # 14x14
        conv_bn_relu(32, 64), conv_pool_bn_relu(64, 64),  # 7x7
        conv_bn_relu(64, 128),
        nn.AdaptiveMaxPool2d(1), nn.Flatten(),
        nn.Linear(128, num_classes, bias=False), Scale(0.25))
    _kaiming_convs(net)
    return net
