"""The optimisation recipe's rules: the peak learning rate, the warm-up and the weight decay, each
beside the measurement behind it. Pure functions of the plan's facts, like rules.py: plan/core.py
asks them once, and the step engine only applies the values (schedule.py's `lr_at`).

The whole answer to "how is the LR chosen?":

    lr = model's SGD rate per 256 images (ModelSpec.sgd_lr, tuned with each net) x global/256
         (AdamW: ADAMW_LR_PER_256 x sqrt(global/256))
         x the fine-tuning factor (`lr_factor`: 1, or 0.1 when the weights know these classes)
    warm-up = 5% of the run (at most 2,000 steps), or 2% when starting from weights
    --layer-decay then scales each depth's rate (finetune.optimizer_groups), from this peak.
"""
from __future__ import annotations

import math

from .facts import WeightsFacts
from .rules import Decision

REFERENCE_BATCH = 256  # learning rates are quoted per 256 images of global batch
ADAMW_LR_PER_256 = 1e-3
ADAMW_WEIGHT_DECAY = 0.05

# The fine-tuning recipe, measured on Fashion-MNIST on the 2-core dev box: compact28 trained on
# 5,000 images of classes 0-4 (tops: 1 epoch, 83% val; 3 epochs, 89%), then trained on 1,000
# images of classes 5-9 (shoes, bags, shirts: a fresh head) at batch 64, val accuracy after
# 15/30/45/60 steps (1,000 val images):
#   from scratch (0.1)                       58 / 76 / 87 / 92 %
#   from the 3-epoch run, lr x0.1 (0.01)     65 / 71 / 78 / 80 %
#                         lr x0.3            69 / 80 / 88 / 89 %
#                         lr x1 (0.1)        81 / 92 / 93 / 93 %
#   from the 1-epoch run, x0.1 uniform       58 / 68 / 76 / 76 %
#                         head x1, rest x0.1 62 / 85 / 88 / 88 %
#                         x1                 83 / 91 / 93 / 93 %
# So on new classes the usual 0.1x (tuned for ImageNet weights on similar photos) starts slower
# than training from scratch: the features must change, as Li et al. (ICLR 2020, "Rethinking
# the hyperparameters for fine-tuning") found for targets unlike the source. On the same
# classes (continuing the 3-epoch run on its own data for 78 steps) x0.1, x0.3 and x1 all end
# at 89.2-89.7% from 89.0%: no loss from small steps, which keep the start intact.
NEW_TASK_LR_FACTOR = 1.0
SAME_TASK_LR_FACTOR = 0.1
# 5% (from scratch) protects random weights from the first large steps; weights that already
# work need less. On the new-class runs above (x1), 1 warm-up step (2% of 60) against 3 (5%):
# 83/91/93/93 against 82/90/93/93 % (1-epoch source), 81/92/93/93 against 80/92/93/93 %
# (3-epoch source): never worse, up to 2 points better early.
SCRATCH_WARMUP_FRACTION = 0.05
MAX_SCRATCH_WARMUP_STEPS = 2000
FINETUNE_WARMUP_FRACTION = 0.02  # of the run's steps, at least 1


def scaled_lr(base_lr_per_256: float, global_batch: int, optimizer: str) -> float:
    """SGD: linear scaling (Goyal et al. 2017). AdamW: square-root scaling, since its update size
    does not grow with the gradient's size the way SGD's does."""
    ratio = global_batch / REFERENCE_BATCH
    return base_lr_per_256 * (ratio if optimizer == "sgd" else math.sqrt(ratio))


def lr_factor(weights: WeightsFacts | None, *, freeze_backbone: bool, num_classes: int,
              class_names) -> tuple[float, str]:
    """(factor on the automatic LR, reason suffix) for a run that starts from `weights` (None:
    random weights, or a resumed run, whose checkpoint holds its resolved LR)."""
    if weights is None:
        return 1.0, ""
    if freeze_backbone:
        return 1.0, "; --freeze-backbone: a fresh head learns alone, at the from-scratch rate"
    count, names = weights.source_classes, weights.source_names
    if count == num_classes and (names is None or tuple(names) == tuple(class_names)):
        return SAME_TASK_LR_FACTOR, (f", x{SAME_TASK_LR_FACTOR}: the starting weights were "
                                     "trained on these classes; small steps keep what they know")
    why = ("the starting weights learnt other classes" if count is not None else
           "the starting weights name no classes (a plain state_dict): taken as new ones")
    return NEW_TASK_LR_FACTOR, (f"; the from-scratch rate: {why}, so their features must move "
                                "too (measured faster than x0.1 on new classes: plan/recipe.py)")


def learning_rate(optimizer: str, spec, global_batch: int, factor: tuple[float, str]
                  ) -> Decision:
    """The peak LR: per 256 images, scaled with the global batch, times `lr_factor`'s factor."""
    if optimizer == "sgd":
        lr = scaled_lr(spec.sgd_lr, global_batch, "sgd")
        why = f"{spec.name}'s {spec.sgd_lr} per 256 images x {global_batch}/256"
    else:
        lr = scaled_lr(ADAMW_LR_PER_256, global_batch, "adamw")
        why = f"AdamW {ADAMW_LR_PER_256} per 256 images x sqrt({global_batch}/256)"
    scale, more = factor
    if scale != 1.0:
        lr = float(f"{lr * scale:.6g}")  # 0.0025, not 0.0025000000000000005
    return Decision(lr, why + more)


def weight_decay(optimizer: str, spec) -> Decision:
    """SGD: the model's own decay (ModelSpec.weight_decay); AdamW: the usual 0.05."""
    if optimizer == "sgd":
        return Decision(spec.weight_decay, f"{spec.name}'s SGD decay")
    return Decision(ADAMW_WEIGHT_DECAY, "AdamW's usual 0.05")


def scratch_warmup_steps(total_steps: int) -> int:
    """5% of the run, at least 1 and at most 2000 steps."""
    return int(min(MAX_SCRATCH_WARMUP_STEPS,
                   max(1, round(SCRATCH_WARMUP_FRACTION * total_steps))))


def warmup_steps(total: int, *, from_weights: bool) -> Decision:
    """--warmup-steps auto: 5% of the run from random weights, 2% from weights that work."""
    if not from_weights:
        return Decision(scratch_warmup_steps(total), f"5% of the {total} steps")
    steps = max(1, round(FINETUNE_WARMUP_FRACTION * total))
    return Decision(steps, f"{FINETUNE_WARMUP_FRACTION:.0%} of the {total} steps: starting from "
                    "weights needs a shorter warm-up than 5%")
