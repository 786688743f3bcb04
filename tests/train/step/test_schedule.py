"""Parameter groups, warm-up + decay, and the EMA (the LR and warm-up rules: test_recipe.py)."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from turbotrain.train.step.ema import ModelEMA
from turbotrain.train.step.schedule import (PEAK_LR, SCHEDULES, LRSchedule, build_optimizer, lr_at,
                                            param_groups)


def test_no_weight_decay_on_norms_and_biases():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    decay, no_decay = param_groups(model, 5e-4)
    assert decay["weight_decay"] == 5e-4 and no_decay["weight_decay"] == 0.0
    assert {p.ndim for p in decay["params"]} == {2, 4}  # conv and linear weights
    assert len(no_decay["params"]) == 4  # conv bias, BN weight and bias, linear bias
    optimizer = build_optimizer(model, name="sgd", lr=0.1, weight_decay=5e-4, momentum=0.9)
    assert optimizer.defaults["nesterov"] is True


@pytest.mark.parametrize("kind", ["cosine", "linear"])
def test_warmup_then_decay_to_zero(kind):
    factors = [lr_at(step, total=100, warmup=10, kind=kind) for step in range(101)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert all(a <= b for a, b in zip(factors[:10], factors[1:10]))  # rising
    assert all(a >= b for a, b in zip(factors[10:], factors[11:]))  # falling
    assert factors[100] == pytest.approx(0.0, abs=1e-9)
    if kind == "cosine":
        assert factors[55] == pytest.approx(0.5)


def test_onecycle_peaks_at_a_quarter():
    factors = [lr_at(step, total=100, warmup=0, kind="onecycle") for step in range(100)]
    assert max(range(100), key=factors.__getitem__) == 24


def test_an_unknown_schedule_lists_the_choices():
    with pytest.raises(ValueError, match="choose one of: cosine, linear, onecycle"):
        LRSchedule(total=10, warmup=1, kind="step")


class _LambdaLRMultiplier:
    """The multiplier the trainer gave torch's LambdaLR until the schedule became a function of
    the step (issue 15), kept verbatim as the reference the new one must repeat exactly."""

    def __init__(self, *, total: int, warmup: int, kind: str):
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


def _scaled_groups(model: nn.Module) -> list[dict]:
    """Groups with their own LRs, as --layer-decay and the fine-tuning recipe make them."""
    return [{"params": [model.weight], "lr": 0.4}, {"params": [model.bias], "lr": 0.4 * 0.65**3}]


@pytest.mark.parametrize("kind, total, warmup", list(itertools.product(
    SCHEDULES, (1, 7, 100, 937), (0, 1, 5, 50, 2000))))
def test_the_same_lrs_as_the_lambdalr_it_replaced(kind, total, warmup):
    """Every group's LR at every step, to the bit, as LambdaLR stepped after each optimizer step
    gave it: resumed runs and the documented results stay the same."""
    old_model, new_model = nn.Linear(3, 2), nn.Linear(3, 2)
    old = torch.optim.SGD(_scaled_groups(old_model), lr=0.4, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        old, _LambdaLRMultiplier(total=total, warmup=warmup, kind=kind))
    new = build_optimizer(new_model, name="sgd", lr=0.4, weight_decay=0.0, momentum=0.9,
                          groups=_scaled_groups(new_model))
    schedule = LRSchedule(total=total, warmup=warmup, kind=kind)
    for step in range(total + 3):
        schedule.apply(new, step)
        assert [g["lr"] for g in new.param_groups] == [g["lr"] for g in old.param_groups], step
        old.step()
        scheduler.step()
    assert [g[PEAK_LR] for g in new.param_groups] == [0.4, 0.4 * 0.65**3]



def test_ema_follows_the_weights_with_a_ramped_decay():
    model = nn.Linear(2, 1, bias=False)
    nn.init.zeros_(model.weight)
    ema = ModelEMA(model, decay=0.99)
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema.update(model)  # decay min(0.99, 2/11): moves most of the way at once
    assert float(ema.module.weight[0, 0]) == pytest.approx(1 - 2 / 11)
    state = ema.state_dict()
    other = ModelEMA(model, decay=0.5)
    other.load_state_dict(state)
    assert other.updates == 1 and other.decay == 0.99


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_fused_optimizer_makes_the_same_update(name):
    """The trainer asks for fused optimizers on CUDA (one kernel per update, no host sync for a
    GradScaler's inf check); they must step like the plain ones (checked on the CPU here)."""
    torch.manual_seed(0)
    models = [torch.nn.Linear(6, 3) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    optimizers = [build_optimizer(m, name=name, lr=0.1, weight_decay=1e-2, momentum=0.9,
                                  fused=fused) for m, fused in zip(models, (False, True))]
    assert optimizers[1].defaults["fused"] is True and not optimizers[0].defaults["fused"]
    inputs = torch.randn(4, 6)
    for _ in range(3):
        for model, optimizer in zip(models, optimizers):
            model(inputs).square().sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kind", SCHEDULES)
@pytest.mark.parametrize("new_total", [600, 1000, 1400])
@pytest.mark.parametrize("at_step", [30, 400])
def test_a_resized_schedule_is_continuous_and_ends_at_its_new_length(kind, new_total, at_step):
    """--time-budget resizes a run mid-way: the LR must not jump at the change, and the decay
    must still reach its end on the run's new last step (not be cut off or overshoot)."""
    before = LRSchedule(total=1000, warmup=50, kind=kind)
    after = before.resized(new_total, at_step)
    assert after.lr(at_step) == pytest.approx(before.lr(at_step), rel=1e-9)
    assert abs(after.lr(at_step + 1) - after.lr(at_step)) <= 1 / 50 + 1e-9  # a warm-up step
    assert after.lr(new_total) == 0.0 and after.lr(new_total - 1) < 0.01
    lrs = [after.lr(s) for s in range(max(at_step, 260), new_total + 1)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))  # past the peak: only down
    # A second resize goes on from the first one's curve, again without a jump.
    again = after.resized(new_total + 100, at_step + 100)
    assert again.lr(at_step + 100) == pytest.approx(after.lr(at_step + 100), rel=1e-9)
    assert again.lr(new_total + 100) == 0.0


def test_resizing_during_the_warmup_keeps_the_warmup():
    before = LRSchedule(total=1000, warmup=50, kind="cosine")
    after = before.resized(2000, 20)
    assert after.warmup == 50 and after.anchor == (0, 0.0)
    assert [after.lr(s) for s in range(50)] == [before.lr(s) for s in range(50)]
