"""BlurPool (models/blurpool.py, --blurpool): where it is applied, that every replaced layer
keeps its output shape, that the state dict is unchanged, and that a weights file rebuilds it."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from turbotrain.train.config.config import TrainConfig
from turbotrain.train.errors import TrainError
from turbotrain.train.models.blurpool import (BlurConv2d, BlurMaxPool2d, _blur_filter,
                                              apply_blurpool)
from turbotrain.train.models.models import build_model, get_model_spec
from turbotrain.train.plan import PRESETS, plan
from turbotrain.train.weights.weights import ModelCard, load_classifier, save_weights

from ..plan.test_plan import PHOTOS


def _blurred(net):
    return [m for m in net.modules() if isinstance(m, (BlurConv2d, BlurMaxPool2d))]


@pytest.mark.parametrize("name, size, count", [
    # resnet18/50: 3 stride-2 convs of a stage's first block + 3 downsample 1x1 + the stem's
    # max-pool; the 3-channel stem conv is left alone. Our nets downsample by max-pools only.
    ("resnet18", 64, 7), ("resnet50", 64, 7), ("compact28", 28, 2), ("airbench", 32, 3),
    ("resnet9", 32, 3)])
def test_blurpool_is_applied_where_it_applies_and_keeps_shapes_and_keys(name, size, count):
    torch.manual_seed(0)
    plain = build_model(get_model_spec(name), 10)
    blurred = build_model(get_model_spec(name, blurpool=True), 10)
    assert len(_blurred(blurred)) == count and not _blurred(plain)
    assert {k: v.shape for k, v in plain.state_dict().items()} == \
        {k: v.shape for k, v in blurred.state_dict().items()}
    images = torch.randint(0, 256, (2, 3, size, size), dtype=torch.uint8)
    assert blurred.eval()(images).shape == (2, 10)


@pytest.mark.parametrize("pool, side", [(nn.MaxPool2d(2), 28), (nn.MaxPool2d(2), 7),
                                        (nn.MaxPool2d(3, 2, 1), 56), (nn.MaxPool2d(3, 2, 1), 9)])
def test_blur_max_pool_has_the_pools_output_size(pool, side):
    x = torch.randn(2, 16, side, side)
    blurred = BlurMaxPool2d(pool)(x)
    assert blurred.shape == pool(x).shape
    # A stride-1 max, then the blur subsampling by the pool's stride.
    maxed = nn.functional.max_pool2d(x, pool.kernel_size, stride=1, padding=pool.padding)
    want = nn.functional.conv2d(maxed, _blur_filter(16), stride=pool.stride, padding=1,
                                groups=16)
    torch.testing.assert_close(blurred, want)


@pytest.mark.parametrize("stride, kernel, side", [(2, 3, 16), (2, 1, 15), (2, 3, 7)])
def test_blur_conv_has_the_convs_output_and_blurs_first(stride, kernel, side):
    conv = nn.Conv2d(16, 8, kernel, stride=stride, padding=kernel // 2, bias=False)
    wrapped = BlurConv2d.of(conv)
    assert wrapped.weight is conv.weight
    x = torch.randn(1, 16, side, side)
    assert wrapped(x).shape == conv(x).shape
    blurred = nn.functional.conv2d(x, _blur_filter(16), padding=1, groups=16)
    torch.testing.assert_close(wrapped(x), conv(blurred))
    assert not torch.allclose(wrapped(x), conv(x))


def test_the_blur_is_a_normalised_low_pass():
    weight = _blur_filter(4)
    assert weight.shape == (4, 1, 3, 3)
    torch.testing.assert_close(weight.sum(dim=(1, 2, 3)), torch.ones(4))
    flat = torch.full((1, 4, 6, 6), 3.0)  # a constant map stays constant inside the border
    inside = nn.functional.conv2d(flat, weight, padding=1, groups=4)[..., 1:-1, 1:-1]
    torch.testing.assert_close(inside, torch.full_like(inside, 3.0))


def test_small_and_unstrided_layers_are_left_alone():
    net = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2), nn.Conv2d(16, 16, 3, stride=1),
                        nn.MaxPool2d(3, stride=1))
    assert apply_blurpool(net) == 0


def test_a_model_without_anything_to_blur_is_refused_in_one_line():
    with pytest.raises(TrainError, match="--blurpool: model vit_b_16 has no strided conv") as e:
        get_model_spec("vit_b_16", blurpool=True)
    assert "\n" not in str(e.value)


def test_a_weights_file_rebuilds_blurpool_from_its_card(tmp_path):
    torch.manual_seed(0)
    model = build_model(get_model_spec("compact28", blurpool=True), 3).eval()
    card = ModelCard(model="compact28", classes=("a", "b", "c"), image_size=28,
                     mean=(1.0, 2.0, 3.0), std=(4.0, 5.0, 6.0), eval_size=28, tta=True,
                     blurpool=True)
    save_weights(tmp_path / "w.safetensors", model, card)
    loaded, read = load_classifier(tmp_path / "w.safetensors")
    assert (read.blurpool, read.tta, read.eval_size) == (True, True, 28)
    assert len(_blurred(loaded)) == 2
    images = torch.randint(0, 256, (2, 3, 28, 28), dtype=torch.uint8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), model(images))


def test_the_plan_builds_the_run_with_blurpool_only_when_asked():
    for asked, count in ((True, 7), (False, 0)):
        p = plan(TrainConfig(data="DATA", model="resnet18", blurpool=asked), PHOTOS,
                 PRESETS["h200"])
        assert len(_blurred(p.spec.build(10))) == count


@pytest.mark.cuda
def test_blurpool_resnet18_compiles_and_trains_a_step_on_cuda():
    """The trainer's CUDA path: channels_last, bf16 autocast, torch.compile; the compiled
    net's logits match the eager net's, and a backward reaches the blurred convs' weights."""
    torch.manual_seed(0)
    model = build_model(get_model_spec("resnet18", blurpool=True), 10).cuda()
    model = model.to(memory_format=torch.channels_last)
    compiled = torch.compile(model)
    images = torch.randint(0, 256, (8, 3, 128, 128), dtype=torch.uint8, device="cuda")
    images = images.contiguous(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        eager = model.eval()(images)
        fast = compiled(images)
        torch.testing.assert_close(fast.float(), eager.float(), atol=0.05, rtol=0.05)
        model.train()
        compiled(images).float().sum().backward()
    blurred = [m for m in model.modules() if isinstance(m, BlurConv2d)]
    assert blurred and all(m.weight.grad is not None for m in blurred)
