"""The model registry, the small nets, the input stem and `--model auto`."""
from __future__ import annotations

import pytest
import torch

from tests import expect
from turbotrain.train.errors import TrainError
from turbotrain.train.models.models import (InputStem, build_model,
                                            deterministic_global_pools, get_model_spec, model_names)
from turbotrain.train.plan.rules import model as auto_model


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
        get_model_spec("bogus")
    message = str(exc.value)
    for name in ("resnet9", "airbench", "compact28", "resnet50", "timm:NAME"):
        assert name in message


@pytest.mark.parametrize("typed, meant", [("resnet181", "resnet18"), ("resnet7", "resnet9"),
                                          ("airbnch", "airbench"), ("Resnet50", "resnet50")])
def test_a_mistyped_model_gets_the_closest_names_not_the_list(typed, meant):
    """Issue 46: `--model resnet181` listed ~80 names with no did-you-mean."""
    with pytest.raises(TrainError) as exc:
        get_model_spec(typed)
    message = str(exc.value)
    assert "\n" not in message and len(message) < 160
    assert message.startswith(f"unknown model {typed!r}; did you mean {meant}")
    assert "timm:NAME" in message


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


@pytest.mark.parametrize("size, device, samples, expected", [
    (28, "cpu", 60_000, "compact28"), (32, "cpu", 50_000, "airbench"),
    (64, "cuda", 2_000, "airbench"), (128, "cpu", 2_000, "resnet18"),
    (224, "cuda", None, "resnet50"),  # size unknown: the large-data default
    (224, "cuda", 2_000, "resnet18"),  # issue 14: ResNet-50 from scratch reached 58 % here
    (224, "cuda", 99_999, "resnet18"), (224, "cuda", 100_000, "resnet50"),
    (224, "cuda", 1_281_167, "resnet50")])  # ImageNet
def test_auto_model(size, device, samples, expected):
    name, reason = auto_model(size, device, samples)
    assert name == expected and reason
    if samples is not None and size > 64 and device == "cuda":
        assert f"{samples:,}" in reason or name == "resnet50"


class _Photos:
    """What auto_image_size reads: the stored sizes and the split's length."""

    def __init__(self, count: int, side: int):
        self.heights = self.widths = [side] * count

    def __len__(self):
        return len(self.heights)


@pytest.mark.parametrize("count, side, device, expected", [
    (2_000, 256, "cuda", 64),  # a small photo set on a GPU trains small, like on a CPU
    (9_999, 500, "cuda", 64), (10_000, 500, "cuda", 224), (1_281_167, 500, "cuda", 224),
    (2_000, 256, "cpu", 64), (60_000, 28, "cuda", 28), (50_000, 32, "cpu", 32)])
def test_auto_image_size_counts_the_images_on_cuda(count, side, device, expected):
    from turbotrain.train.engine.data import auto_image_size
    size, reason = auto_image_size(_Photos(count, side), device)
    assert size == expected and reason


@pytest.mark.parametrize("size, device, samples, epochs, expected, halved", [
    (64, "cuda", 2_000, 10, 256, True),  # 512 = 30 steps: 34.8 %; 256 = 70 steps: 98.8 %
    (64, "cuda", 4_096, 10, 512, False), (64, "cuda", 50_000, 10, 512, False),
    (224, "cuda", 20_000, 1, 256, False), (224, "cuda", 10_000, 1, 128, True),
    (64, "cpu", 2_000, 10, 128, False), (64, "cpu", 96, 10, 32, True),  # never below 32
    (224, "cuda", None, None, 256, False)])
def test_auto_batch_leaves_a_small_set_enough_steps(size, device, samples, epochs, expected,
                                                    halved):
    from turbotrain.train.plan.rules import MIN_RUN_STEPS, auto_batch_size
    batch, reason = auto_batch_size(size, device, samples, epochs)
    assert batch == expected and ("halved" in reason) == halved
    if samples is not None and batch > 32:
        assert (samples // batch) * epochs >= MIN_RUN_STEPS


def test_the_halved_batch_reason_says_the_steps_and_when_they_are_still_too_few():
    from turbotrain.train.plan.rules import auto_batch_size
    _, enough = auto_batch_size(64, "cuda", 2_000, 10)
    assert enough.endswith("halved to 256 for a run that learns (>= 64 steps): 2,000 images x "
                           "10 epochs make 70 optimizer steps at 256 (30 at 512)"), enough
    # 96 images, 1 epoch: 3 steps even at the least batch; the reason says so and what helps
    # (it said "then make 3 optimizer steps (>= 64 learn; 128 would make 0)").
    _, short = auto_batch_size(16, "cpu", 96, 1)
    assert short.endswith("halved to 32, the least (BatchNorm's statistics get noisy below): "
                          "96 images x 1 epoch make 3 optimizer steps at 32 (0 at 128), fewer "
                          "than the 64 a run needs to learn: give more --epochs or data"), short


POOLED_NETS = ["compact28", "airbench", "resnet9", "resnet18"]


def _forward_backward(model, images):
    model.zero_grad(set_to_none=True)
    logits = model(images)
    logits.float().pow(2).sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                             if p.grad is not None}


@pytest.mark.parametrize("name", POOLED_NETS)
def test_deterministic_global_pools_keep_values_gradients_and_keys(name):
    """--deterministic on CUDA swaps the adaptive global pools (no deterministic CUDA backward:
    issue 14's resume tests) for a full-kernel max-pool / a mean: same forward and backward."""
    import copy
    torch.manual_seed(0)
    model = build_model(get_model_spec(name), num_classes=5).train()
    swapped = copy.deepcopy(model)
    assert deterministic_global_pools(swapped) == 1
    assert not any(isinstance(m, (torch.nn.AdaptiveMaxPool2d, torch.nn.AdaptiveAvgPool2d))
                   for m in swapped.modules())
    assert list(swapped.state_dict()) == list(model.state_dict())  # checkpoints still load
    size = 28 if name == "compact28" else 32
    images = torch.randint(0, 256, (6, 3, size, size), dtype=torch.uint8)
    logits, grads = _forward_backward(model, images)
    logits2, grads2 = _forward_backward(swapped, images)
    exact = name != "resnet18"  # a max is exact; a mean may sum in another order
    torch.testing.assert_close(logits2, logits, rtol=0 if exact else 1e-6,
                               atol=0 if exact else 1e-6)
    assert grads2.keys() == grads.keys()
    for key in grads:
        torch.testing.assert_close(grads2[key], grads[key], rtol=0 if exact else 1e-5,
                                   atol=0 if exact else 1e-6)


@pytest.mark.cuda
@pytest.mark.parametrize("name", POOLED_NETS)
def test_deterministic_backward_on_cuda(name, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # as train --deterministic sets it
    model = build_model(get_model_spec(name), num_classes=5).cuda()
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8, device="cuda")
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError, match="adaptive_(max|avg)_pool2d_backward_cuda"):
            model(images).sum().backward()
        deterministic_global_pools(model)
        model.zero_grad()
        model(images).sum().backward()
    finally:
        torch.use_deterministic_algorithms(before)


# ---------------------------------------------------------------------------- timm's names

def test_timm_names_with_a_weights_tag_are_accepted():
    """timm.create_model takes `arch.tag` (the tag picks the weights and their config), which
    timm.list_models() does not list: `timm:resnet18.a1_in1k` builds as timm builds it."""
    expect.need("timm")
    spec = get_model_spec("timm:resnet18.a1_in1k")
    assert spec.name == "timm:resnet18.a1_in1k" and spec.family == "timm" and spec.conv
    net = build_model(spec, num_classes=3).net
    assert net.pretrained_cfg["tag"] == "a1_in1k" and net.fc.out_features == 3
    vit = get_model_spec("timm:vit_tiny_patch16_224.augreg_in21k_ft_in1k", image_size=32)
    assert not vit.conv and vit.kwargs == {"img_size": 32}


@pytest.mark.parametrize("name, says", [
    ("timm:resnet18.no_such_tag", "timm's resnet18 has no weights tag 'no_such_tag'; its tags: "
                                  "a1_in1k, a2_in1k"),
    ("timm:no_such_net", "timm has no model 'no_such_net'"),
    ("timm:no_such_net.a1_in1k", "timm has no model 'no_such_net'"),
    ("timm:timm/resnet18.a1_in1k", "Use 'hf-hub:timm/resnet18.a1_in1k'"),
    ("timm:local-dir:/no/such/folder", "no config.json in /no/such/folder"),
])
def test_names_timm_would_refuse_are_one_line(name, says):
    expect.need("timm")
    with pytest.raises(TrainError) as exc:
        get_model_spec(name)
    assert says in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_an_hf_hub_model_is_read_from_the_cache_only(tmp_path, monkeypatch):
    """`timm:hf-hub:ID` is a name timm takes; its config.json comes from the Hugging Face cache
    (the hub set offline: no download, no retries), and a missing one is one line."""
    expect.need("timm")
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    spec = get_model_spec("timm:hf-hub:timm/resnet18.a1_in1k")
    with pytest.raises(TrainError) as exc:
        build_model(spec, num_classes=2)
    assert str(exc.value).startswith("--model timm:hf-hub:timm/resnet18.a1_in1k: its config "
                                     "is not in the Hugging Face cache")
    assert "huggingface-cli download timm/resnet18.a1_in1k" in str(exc.value)
