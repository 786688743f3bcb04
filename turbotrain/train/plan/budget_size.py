"""`--time-budget` with `--image-size` and `--model` auto on a CPU: the image size and model the
budget can train enough epochs of.

A budget too short for enough epochs of the usual choice (photos at 64 px: the airbench net)
ends with a model that has barely started; a smaller image or a smaller net that gets through
the data several times learns more in the same minutes. So, before the run, the candidates are
tried best first, and the first whose estimated epochs in the budget reach MIN_BUDGET_EPOCHS is
taken: the estimate is the budget times a measured per-core training rate, over the train
split's size. The epochs themselves are then sized from the run's own measured steps
(budget.py); this rule only picks what to train.

    budget_size(budget_s=80, train_count=3000, largest_side=64, cores=2, fast_bf16=True)
"""
from __future__ import annotations

from dataclasses import dataclass

from turbotrain.datasets.beton.layout import SMALL_IMAGE_MAX_SIDE

from .rules import Decision

# Epochs a budget must fit for a candidate: airbench at 64 px reached 99.6 % val accuracy at
# epoch 5 of the demo's photos, compact28 at 32 px 99.0 % at epoch 6 (issue 32).
MIN_BUDGET_EPOCHS = 6


@dataclass(frozen=True)
class Candidate:
    image_size: int
    model: str
    # Training images/s a core (batch 128, channels_last, SGD), 2 torch threads on the 2-core
    # dev box (AMD EPYC, avx512_bf16), halved: bf16 autocast on a CPU with native bf16, fp32.
    bf16_rate: float
    fp32_rate: float

    def rate(self, cores: int, fast_bf16: bool) -> float:
        return max(1, cores) * (self.bf16_rate if fast_bf16 else self.fp32_rate)


# Best first. Measured 2026-12-03 (img/s on 2 cores, bf16 / fp32): airbench 64 px 86 / 45,
# airbench 32 px 404 / 257, compact28 32 px 1,648 / 983.
CANDIDATES = (
    Candidate(64, "airbench", bf16_rate=43, fp32_rate=22),
    Candidate(32, "airbench", bf16_rate=200, fp32_rate=130),
    Candidate(32, "compact28", bf16_rate=820, fp32_rate=490),
)


def budget_size(*, budget_s: float, train_count: int, largest_side: int, cores: int,
                fast_bf16: bool) -> tuple[Decision, Decision] | None:
    """(image size, model) decisions for a budget, or None where the data leaves no choice
    (images of 32 px or less train at their own size)."""
    if 0 < largest_side <= SMALL_IMAGE_MAX_SIDE:
        return None
    fitting = [c for c in CANDIDATES if largest_side <= 0 or c.image_size <= largest_side]
    for candidate in fitting:
        epochs = budget_s * candidate.rate(cores, fast_bf16) / max(1, train_count)
        if epochs >= MIN_BUDGET_EPOCHS or candidate is fitting[-1]:
            why = (f"the {budget_s:g} s budget fits ~{epochs:.0f} epochs of {train_count:,} "
                   f"images at ~{candidate.rate(cores, fast_bf16):,.0f} img/s "
                   f"({'bf16' if fast_bf16 else 'fp32'}, {cores} cores)")
            if epochs < MIN_BUDGET_EPOCHS:
                why += f", fewer than {MIN_BUDGET_EPOCHS}: the smallest choice"
            elif candidate is not fitting[0]:
                why += f"; larger choices fit fewer than {MIN_BUDGET_EPOCHS}"
            return (Decision(candidate.image_size, f"{candidate.image_size} px for "
                             f"--time-budget: {why}"),
                    Decision(candidate.model, f"{candidate.model}: the --time-budget choice at "
                             f"{candidate.image_size} px"))
    return None
