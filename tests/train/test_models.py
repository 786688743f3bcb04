"""The model registry, the small nets, the input stem and `--model auto`."""
from __future__ import annotations

import pytest
import torch

from turbotrain.train.errors import TrainError
from turbotrain.train.models import (InputStem, auto_model, build_model, get_model_spec,
                                     model_names)


@pytest.mark.parametrize("name", model_names())
def test_each_registered_net_classifies_uint8_channels_last(name):
    model = build_model(get_model_spec(name), num_classes=7, mean=(10.0,) * 3, std=(50.0,) * 3)
    size = 28 if name == "compact28" else 32
    images = torch.randint(0, 256, (4, 3, size, size), dtype=torch.uint8)
    model = model.to(memory_format=torch.channels_last)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(images.contiguous(memory_format=torch.channels_last))
    assert logits.shape == (4, 7) and torch.isfinite(logits.float()).all()
    logits.float().sum().backward()


def test_torchvision_model_by_name_with_zero_init_residual():
    model = build_model(get_model_spec("resnet18"), num_classes=5)
    assert model.net.fc.out_features == 5
    assert float(model.net.layer1[0].bn2.weight.detach().abs().sum()) == 0.0


def test_unknown_model_lists_choices():
    with pytest.raises(TrainError) as exc:
        get_model_spec("resnet7")
    message = str(exc.value)
    for name in ("resnet9", "airbench", "compact28", "resnet50", "timm:NAME"):
        assert name in message


def test_input_stem_normalises_with_dataset_stats():
    stem = InputStem(mean=(100.0, 50.0, 0.0), std=(10.0, 5.0, 1.0))
    images = torch.tensor([110, 40, 3], dtype=torch.uint8).view(1, 3, 1, 1)
    assert stem(images).flatten().tolist() == pytest.approx([1.0, -2.0, 3.0])
    assert set(dict(stem.named_buffers())) == {"scale", "shift"}  # saved with the model


def test_airbench_whitening_makes_patch_channels_decorrelated():
    model = build_model(get_model_spec("airbench"), num_classes=10)
    torch.manual_seed(0)
    base = torch.rand(64, 1, 16, 16) * 200
    images = (base + torch.rand(64, 3, 16, 16) * 40).to(torch.uint8)  # strongly correlated RGB
    assert model.data_init(images)
    out = model.net.whiten(model.stem(images))[:, :12]  # the 12 eigen-directions
    flat = out.permute(0, 2, 3, 1).reshape(-1, 12)
    cov = torch.cov(flat.T)
    assert torch.allclose(cov.diagonal(), torch.ones(12), atol=0.05)
    assert (cov - torch.diag(cov.diagonal())).abs().max() < 0.05
    assert not model.net.whiten.weight.requires_grad  # frozen, as in airbench


@pytest.mark.parametrize("size, device, expected", [
    (28, "cpu", "compact28"), (32, "cpu", "airbench"), (64, "cuda", "airbench"),
    (128, "cpu", "resnet18"), (224, "cuda", "resnet50")])
def test_auto_model(size, device, expected):
    name, reason = auto_model(size, device)
    assert name == expected and reason
