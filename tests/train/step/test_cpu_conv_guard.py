"""Strided convolutions on a one-pixel input leave CPU autocast (cpu_conv_guard.py): their
weight gradient is then right on every try, where oneDNN's bf16 kernel gave garbage 3 in 4."""
from __future__ import annotations

import torch
import torchvision
from torch import nn

from turbotrain.train.step.cpu_conv_guard import OnePixelSafeConv2d, guard_strided_convs


def _weight_grad(conv: nn.Conv2d, x: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    conv.weight.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = conv(x)
    y.float().backward(grad_out)
    return conv.weight.grad


def test_a_one_pixel_strided_conv_gets_the_right_weight_gradient():
    torch.manual_seed(0)
    conv = nn.Conv2d(256, 512, 3, 2, 1, bias=False).to(memory_format=torch.channels_last)
    assert guard_strided_convs(conv) == 1
    for _ in range(20):  # unguarded: 15 of 20 wrong, 4 non-finite (avx512_bf16 dev box)
        x = torch.randn(16, 256, 1, 1).contiguous(memory_format=torch.channels_last)
        grad_out = torch.randn(16, 512, 1, 1)
        got = _weight_grad(conv, x, grad_out)
        expected = torch.nn.grad.conv2d_weight(x, conv.weight.shape, grad_out, 2, 1)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_larger_inputs_stay_in_autocast():
    conv = nn.Conv2d(8, 8, 3, 2, 1)
    guard_strided_convs(conv)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert conv(torch.randn(2, 8, 4, 4)).dtype == torch.bfloat16
        assert conv(torch.randn(2, 8, 1, 1)).dtype == torch.float32
    assert conv(torch.randn(2, 8, 1, 1)).dtype == torch.float32  # no autocast: as nn.Conv2d


def test_only_plain_strided_convs_are_guarded_and_the_weights_look_the_same():
    net = torchvision.models.resnet18(num_classes=10)
    keys = list(net.state_dict())
    strided = [n for n, m in net.named_modules() if isinstance(m, nn.Conv2d) and m.stride[0] > 1]
    assert guard_strided_convs(net) == len(strided) == 7  # the stem, 3 x (conv1 + downsample)
    assert {n for n, m in net.named_modules() if type(m) is OnePixelSafeConv2d} == set(strided)
    assert list(net.state_dict()) == keys and all(isinstance(m, nn.Conv2d) for m in
                                                  (net.conv1, net.layer4[0].conv1))
    assert type(net.layer1[0].conv1) is nn.Conv2d  # stride 1: untouched
