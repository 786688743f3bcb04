"""--clip-grad (StepEngine.optimizer_step): the global gradient norm is clipped once per optimizer
step, after the GradScaler unscales, and K accumulated micro-batches clip like one big batch."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from turbotrain.train.models.models import Classifier
from turbotrain.train.step.loop import StepEngine, StepSettings

CPU = torch.device("cpu")


def make_engine(*, clip: float, accum: int = 1, precision: str = "fp32", std: float = 60.0,
                scaler: torch.amp.GradScaler | None = None) -> StepEngine:
    """Plain SGD (the update is -lr x gradient) on a net without BatchNorm, so K micro-batches
    of B give exactly the gradient of one batch of K x B. A small `std` in the input stem makes
    the inputs, hence the gradients, huge."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                        nn.Flatten(), nn.Linear(8 * 16, 5))
    model = Classifier(net, mean=(120.0,) * 3, std=(std,) * 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scaler = scaler or torch.amp.GradScaler("cpu", enabled=False)
    settings = StepSettings(device=CPU, precision=precision, channels_last=False,
                            accum_steps=accum, label_smoothing=0.1, clip_grad=clip)
    return StepEngine(model, optimizer, scaler, settings)


def batch(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 256, (n, 3, 12, 12), dtype=torch.uint8, generator=g),
            torch.randint(0, 5, (n,), generator=g))


def update(engine: StepEngine, images, labels) -> torch.Tensor:
    """One optimizer step over `images` in K micro-batches; the flat weight change."""
    before = torch.cat([p.detach().flatten().clone() for p in engine.model.parameters()])
    k = engine.settings.accum_steps
    for i, (x, y) in enumerate(zip(images.chunk(k), labels.chunk(k))):
        engine.micro_step(x, y, will_step=i == k - 1)
    engine.optimizer_step(0)
    after = torch.cat([p.detach().flatten() for p in engine.model.parameters()])
    return after - before


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_clipping_bounds_a_huge_update(precision):
    images, labels = batch()
    free = make_engine(clip=0.0, std=1e-3, precision=precision)
    free_update = update(free, images, labels)
    assert free.grad_norm is None and free.log_record() == {}  # off: nothing computed
    clipped = make_engine(clip=1.0, std=1e-3, precision=precision)
    clipped_update = update(clipped, images, labels)
    norm = clipped.grad_norm.item()
    lr = 0.5
    assert norm > 1e3 and free_update.norm() == pytest.approx(lr * norm, rel=1e-3)
    assert clipped_update.norm().item() == pytest.approx(lr * 1.0, rel=1e-4)  # lr x max norm
    torch.testing.assert_close(clipped_update, free_update / norm, rtol=1e-3, atol=1e-6)
    assert clipped.log_record() == {"grad_norm": pytest.approx(norm)}


def test_a_norm_above_the_gradient_leaves_the_update_unchanged():
    images, labels = batch()
    free_update = update(make_engine(clip=0.0), images, labels)
    loose = make_engine(clip=1e30)
    assert torch.equal(update(loose, images, labels), free_update)
    assert 0 < loose.grad_norm.item() < 1e30


def test_clipping_sees_unscaled_gradients():
    """fp16's GradScaler multiplies the loss by 2**12 here: unscale_ before the clip, or the
    norm would be 4096 times too large and every step clipped far too hard."""
    images, labels = batch()
    plain = make_engine(clip=0.05)
    plain_update = update(plain, images, labels)
    scaled = make_engine(clip=0.05, scaler=torch.amp.GradScaler("cpu", init_scale=2.0 ** 12))
    torch.testing.assert_close(update(scaled, images, labels), plain_update)
    torch.testing.assert_close(scaled.grad_norm, plain.grad_norm)


def test_accumulation_with_clipping_matches_the_big_batch():
    images, labels = batch()
    big = make_engine(clip=0.05)
    big_update = update(big, images, labels)
    accumulated = make_engine(clip=0.05, accum=4)
    accumulated_update = update(accumulated, images, labels)
    assert big.grad_norm.item() > 0.05 * 4  # clipping is active
    torch.testing.assert_close(accumulated.grad_norm, big.grad_norm, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(accumulated_update, big_update, rtol=1e-5, atol=1e-7)
    # Clipped once, on the summed gradient (not per micro-batch): the step is lr x max norm.
    assert accumulated_update.norm().item() == pytest.approx(0.5 * 0.05, rel=1e-4)
