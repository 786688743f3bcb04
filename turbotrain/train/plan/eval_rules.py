"""How a run evaluates: the test-time resolution and flip test-time augmentation, as pure rules.

Test-time resolution (Touvron et al. 2019, "Fixing the train-test resolution discrepancy"):
RandomResizedCrop trains on boxes of 8-100 % of the image's area scaled up to the training size,
so objects look larger in training than in a centre crop at that same size. Evaluating at a
higher resolution makes them look as large again. The anchors evaluate at 1.27-1.33x the final
training size: FFCV's ImageNet configs train up to 192 px and evaluate 256 px crops (1.33x),
Composer's Mild ResNet-50 trains at 176 and evaluates 224 px crops of images resized to 232
(1.27x), as torchvision's recent recipes do (176 -> 224); timm's 224 -> 288 (1.29x) is also
FixRes' best ResNet-50 test size for 224 px training. EVAL_RES_FACTOR takes 1.3, rounded to a
multiple of EVAL_RES_STEP: 112 -> 144, 128 -> 160, 160 -> 208, 176 -> 224, 192 -> 256,
224 -> 288. Every size keeps the eval crop's rule (augment.eval_rule: the shorter side resized
to size / 0.875, the centre size x size), as FFCV's CenterCropRGBImageDecoder(ratio=224/256).

Small images (pad-crop training, CIFAR/MNIST-style) keep the training size: pad-and-crop shifts
the picture by at most 2 px and never zooms, so objects are the same size in training and in
evaluation (no discrepancy to correct), and their evaluation shows the whole picture resized to
the training size: a larger input would only upsample 28-32 px pictures, changing the scale the
net learnt for no new detail. A model built for one input size (a ViT's patch grid and position
embeddings) keeps it too.

Flip TTA (FFCV, airbench): the logits of each val image and of its horizontal mirror are
averaged, so two forward passes per image. It is on wherever training drew flips, since the
mirror is then an image of the training distribution, except small images up to
TTA_SMALL_MAX_SIZE px (MNIST-class, the compact28 net's): on Fashion-MNIST (4 epochs, 6 runs)
it added 0.03-0.24 pt (0.11 on average) and cost 5 % of the run (each evaluation twice:
5.2 s against 2.5 s of a 55 s run), about what those seconds of training gain at the end of a
run (~0.6 pt an epoch of 13 s): it does not bring the accuracy sooner there.
"""
from __future__ import annotations

from turbotrain.pipeline import augment

from .decision import Decision

EVAL_RES_FACTOR = 1.3
TTA_SMALL_MAX_SIZE = 28
# Sizes step by 16 px: what conv nets with 5 stride-2 stages (ResNets: 32) keep close to, and
# fine enough that 1.3x stays within 1.25-1.33x from 64 px up (64 -> 80, 112 -> 144).
EVAL_RES_STEP = 16


def eval_resolution(asked: int | None, *, train_size: int, small: bool,
                    any_size: bool) -> Decision:
    """The evaluation resolution for a model whose last training epochs ran at `train_size`.
    `small`: the data is small images (pad-crop training, augment.PAD_CROP); `any_size`: the
    model runs at any input size (a conv net ending in a global pool). `asked`: --eval-res."""
    if asked is not None:
        return Decision(asked, "asked for", shown=asked != train_size)
    if small:
        return Decision(train_size, "the training size: small images are "
                        "pad-cropped, never zoomed, so objects look as large in training as in "
                        "evaluation (a larger size would only upsample them)")
    if not any_size:
        return Decision(train_size, "the training size: the model is built for one input "
                        "size")
    size = eval_size_for(train_size)
    return Decision(size, f"{EVAL_RES_FACTOR:g}x the {train_size} px training size, rounded "
                    f"to {EVAL_RES_STEP} px (FFCV 192 -> 256, Composer 176 -> 224): "
                    "random-resized crops make objects look larger in training than in a centre "
                    "crop of the same size")


def eval_size_for(train_size: int) -> int:
    """EVAL_RES_FACTOR x `train_size`, to the nearest multiple of EVAL_RES_STEP, never below
    `train_size`."""
    return max(train_size, EVAL_RES_STEP * round(EVAL_RES_FACTOR * train_size / EVAL_RES_STEP))


def flip_tta(asked: bool | None, *, train_family: str, image_size: int) -> Decision:
    """Whether evaluations average each image's logits with its mirror's. `train_family`: the
    augmentation training used (augment.choose_augmentation); `image_size`: the final training
    size; `asked`: --tta / --no-tta."""
    flips = augment.draws_flips(train_family)
    tiny = train_family == augment.PAD_CROP and image_size <= TTA_SMALL_MAX_SIZE
    if asked is not None:
        why = "" if flips or not asked else " (training drew no flips)"
        return Decision(asked, "asked for" + why, shown=asked != (flips and not tiny))
    if tiny:
        return Decision(False, f"small images at {image_size} px (<= {TTA_SMALL_MAX_SIZE}): "
                        "measured on Fashion-MNIST, the mirror's +0.11 pt cost as much time as "
                        "training buys that accuracy with (each evaluation twice)")
    if flips:
        return Decision(True, "training drew horizontal flips: each val image's logits are "
                        "averaged with its mirror's (2 forward passes: the evaluation's model "
                        "time doubles)")
    return Decision(False, "training drew no flips")


def eval_work(train_size: int, eval_size: int | None, tta: bool | None) -> float:
    """One val image's model work against one at the training size without TTA: forward passes
    x pixels (a --time-budget predicts the first evaluation's time with it, before one is
    measured)."""
    side = train_size if eval_size is None else eval_size
    return (2.0 if tta else 1.0) * (side / train_size) ** 2
