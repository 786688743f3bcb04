"""The rule for each automatic setting: a pure function of a few facts, returning the value with
its reason (the device's, precision's and compile's: device_choice.py). `plan.plan` applies them in order; nothing here reads a file, a device or a global.

Each rule's numbers are measurements, quoted next to it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from turbotrain.datasets.beton.layout import SMALL_IMAGE_MAX_SIDE
from turbotrain.printable import printable

from ..errors import TrainError
from .decision import Decision, asked  # noqa: F401  (rules.Decision, rules.asked: one namespace)


# ---------------------------------------------------------------------------- image size, model

SHORT_RUN_SIZE = 64  # px: photos on a CPU, and small photo sets on CUDA
# Fewer training images than this: photos train at SHORT_RUN_SIZE on CUDA too, where
# `--model auto` picks the airbench net (measured on 2,000 photos: see LARGE_SET).
SMALL_SET = 10_000


def image_size(largest_side: int, count: int, device_type: str) -> Decision:
    if 0 < largest_side <= SMALL_IMAGE_MAX_SIDE:
        # prepare-dataset stores images this small raw: nothing to decode, and upscaling
        # would only multiply the FLOPs.
        return Decision(largest_side, f"native size of the {largest_side} px images")
    if device_type == "cuda":
        if count < SMALL_SET:
            return Decision(SHORT_RUN_SIZE, f"{count:,} train images (< {SMALL_SET:,}) on CUDA: "
                            "a small set learns best small, like a CPU run")
        return Decision(224, f"224 px on CUDA for {count:,} train images, the standard ImageNet "
                        "training size")
    # A CPU run is a short run: what matters is accuracy per CPU-minute. On the demo's photos
    # (3,000 images of 256 px, 2-core dev box) ResNet-18 at 128 px reached 29 % val accuracy
    # after 230 steps; at 64 px `--model auto` picks the airbench net, which reached 83 % after
    # 138 steps (ResNet-18 itself: 44 % at 64 px, 31 % at 112 px; see LARGE_SET). The reason
    # names no model: the model is its own decision, and may be one asked for.
    return Decision(SHORT_RUN_SIZE, "64 px on CPU: short CPU runs learn fastest small")


# `--model auto` for photos (> 64 px) on CUDA depends on the train split's size as well:
# ResNet-50 from scratch wants ImageNet-scale data. Measured on the 2-core dev box, 2,000 of
# the demo's shape photos (10 classes, 256 px; 500 val), 10 epochs at batch 128 (150 steps),
# bf16, default recipe: airbench at 64 px 99.4 % val accuracy; ResNet-18 at 64 px 44.4 %,
# ResNet-50 at 64 px 42.4 %, ResNet-18 at 112 px 31.0 %. A GPU default once trained ResNet-50
# at 224 px on a 2,000-image two-class set to 58 % (issue 14). So below SMALL_SET images
# a GPU trains photos at 64 px (the airbench net, as on a CPU); up to LARGE_SET, ResNet-18
# (11.7 M weights, 1.8 GMAC at 224 px, against ResNet-50's 25.6 M and 4.1 GMAC: fewer weights
# to fit from the same images, ~2.3x the steps per second); ResNet-50 from LARGE_SET on,
# about ImageNet-100's size. The two thresholds are not measured (no GPU here, and 224 px
# ResNets on 10,000-100,000 images are days on this CPU): `make gpu-check` runs the 2,000-image
# case on a GPU.
LARGE_SET = 100_000


def model(image_size: int, device_type: str, num_samples: int | None = None
          ) -> tuple[str, str]:
    """(model name, reason) for `--model auto`; `num_samples`: the train split's size."""
    if image_size <= 28:
        return "compact28", f"{image_size} px images: the compact 28x28 net"
    if image_size <= SMALL_IMAGE_MAX_SIDE:
        return "airbench", (f"{image_size} px images: the airbench net, 2.6x fewer FLOPs "
                            "than ResNet-9 for CIFAR-class accuracy")
    if device_type == "cuda":
        if num_samples is not None and num_samples < LARGE_SET:
            return "resnet18", (f"{num_samples:,} train images (< {LARGE_SET:,}) at "
                                f"{image_size} px on CUDA: ResNet-18; ResNet-50 from scratch "
                                "wants ImageNet-scale data")
        return "resnet50", f"{image_size} px images on CUDA: ResNet-50"
    return "resnet18", f"{image_size} px images on CPU: ResNet-18 (4.5x fewer FLOPs than -50)"


# ---------------------------------------------------------------------------- batch

# The preferred batch is halved until the run makes at least this many optimizer steps. On
# 2,000 photos (airbench, 64 px, 10 epochs, dev box): batch 512 = 30 steps reached 34.8 % val
# accuracy, 256 = 70 steps 98.8 %, 128 = 150 steps 99.4 %.
MIN_RUN_STEPS = 64
MIN_AUTO_BATCH = 32  # below this BatchNorm's batch statistics get noisy


def auto_batch_size(image_size: int, device_type: str, num_samples: int | None = None,
                    epochs: int | None = None) -> tuple[int, str]:
    """The preferred micro-batch for this image size and device; with the number of samples
    (per rank) and epochs, lowered so that a small set still gets MIN_RUN_STEPS updates."""
    batch, why = _device_batch(image_size, device_type)
    if num_samples is None or epochs is None:
        return batch, why
    preferred = batch
    while batch > MIN_AUTO_BATCH and (num_samples // batch) * epochs < MIN_RUN_STEPS:
        batch //= 2
    if batch < preferred:
        why = f"{why}, {_halved_reason(batch, preferred, num_samples, epochs)}"
    return batch, why


def _halved_reason(batch: int, preferred: int, num_samples: int, epochs: int) -> str:
    """Why the batch was halved, and, when even MIN_AUTO_BATCH leaves the run short of
    MIN_RUN_STEPS updates, that it stopped there and what gives more."""
    steps, preferred_steps = (num_samples // batch) * epochs, (num_samples // preferred) * epochs
    counts = (f"{num_samples:,} images x {epochs} epoch{'s' * (epochs != 1)} make {steps:,} "
              f"optimizer steps at {batch} ({preferred_steps:,} at {preferred})")
    if steps >= MIN_RUN_STEPS:
        return f"halved to {batch} for a run that learns (>= {MIN_RUN_STEPS} steps): {counts}"
    return (f"halved to {batch}, the least (BatchNorm's statistics get noisy below): {counts}, "
            f"fewer than the {MIN_RUN_STEPS} a run needs to learn: give more --epochs or data")


def _device_batch(image_size: int, device_type: str) -> tuple[int, str]:
    if device_type == "cuda":
        if image_size <= SMALL_IMAGE_MAX_SIDE:
            return 512, "small images on CUDA: 512 keeps the GPU busy"
        return 256, "256 per GPU on CUDA, the ImageNet reference batch"
    if image_size <= SMALL_IMAGE_MAX_SIDE:
        # On the 2-core dev box 256 runs no faster per image than 128 (the convs are already
        # large enough to use both cores), so the smaller batch gives twice the updates.
        return 128, "small images on CPU: per-image speed is flat from 128 up, more updates"
    return 64, "large images on CPU: 64 keeps a step under a few seconds"


@dataclass(frozen=True)
class BatchSearch:
    """`--batch-size auto` still to be measured: the largest micro-batch up to `limit` whose
    training step fits beside `reserve_bytes` (the resident store), found by batch_finder
    (trial steps with OOM recovery on CUDA, an estimate on CPU). The run carries the search out
    and plans again with its BatchFit (`Observed.batch_fit`)."""
    preferred: int  # the device default, or this rank's share of --global-batch-size
    limit: int  # preferred, at most this rank's share of the split
    reserve_bytes: int
    why: str  # why `preferred`
    global_batch: int | None  # --global-batch-size: the micro-batch must divide its share

    def __str__(self) -> str:
        return f"search up to {self.limit}"

    @property
    def bound(self) -> int:
        """The largest batch the search can end with (what a plan without it assumes)."""
        if self.global_batch is None:
            return self.limit
        return divisor_at_most(self.preferred, self.limit)


def divisor_at_most(total: int, most: int) -> int:
    """The largest divisor of `total` that is <= `most` (a micro-batch for a global batch)."""
    for candidate in range(min(total, most), 0, -1):
        if total % candidate == 0:
            return candidate
    return 1


def batch_search(*, preferred: tuple[int, str], global_batch: int | None, world_size: int,
                 count: int, reserve_bytes: int) -> BatchSearch:
    batch, why = preferred
    if global_batch is not None:
        if global_batch % world_size:
            raise TrainError(f"--global-batch-size {global_batch} is not a multiple of the "
                             f"{world_size} ranks")
        batch = global_batch // world_size
        why = f"--global-batch-size {global_batch} over {world_size} rank(s)"
    limit = min(batch, max(1, count // world_size))
    return BatchSearch(batch, limit, reserve_bytes, why, global_batch)


def batch_from_fit(search: BatchSearch, fit, *, count: int, model: str, image_size: int
                   ) -> Decision:
    """The micro-batch a BatchFit (batch_finder's answer) allows: the largest that fits, up to
    the search's limit; with --global-batch-size the largest divisor of the rank's share."""
    if fit.batch_size < 1:
        raise TrainError(f"not even one {image_size} px image fits in memory for {model} "
                         f"({fit.how}); try a smaller --image-size or --model")
    fitting = min(fit.batch_size, search.limit)
    batch = fitting
    preferred, why = search.preferred, search.why
    if search.global_batch is not None:
        batch = divisor_at_most(preferred, batch)  # accumulation must add up to it exactly
    if batch == preferred:
        return Decision(batch, f"{why}; it fits ({fit.how})")
    if fitting >= search.limit and search.limit < preferred:
        return Decision(batch, f"{why}, but the train split has only {count} images")
    return Decision(batch, f"{why}, but {preferred} does not fit: {batch} is the largest that "
                    f"does ({fit.how})")


def accum_for_global_batch(global_batch: int, accum_steps: int, batch: int, world_size: int
                           ) -> Decision:
    """`--global-batch-size G`: accum-steps = G / (batch-size x ranks), which must be whole."""
    per_step = batch * world_size
    if global_batch % per_step:
        raise TrainError(f"--global-batch-size {global_batch} is not a multiple of batch-size "
                         f"{batch} x {world_size} rank(s) = {per_step}")
    accum = global_batch // per_step
    if accum_steps not in (1, accum):
        raise TrainError(f"--accum-steps {accum_steps} contradicts --global-batch-size "
                         f"{global_batch} = {batch} x {world_size} rank(s) x {accum}; give one")
    return Decision(accum, f"--global-batch-size {global_batch} = {batch} x {world_size} "
                    f"rank(s) x {accum}")


def check_batch_fits_split(batch: int, accum: int, world_size: int, count: int) -> None:
    per_step = batch * world_size
    if per_step > count:
        raise TrainError(f"--batch-size {batch} x {world_size} rank(s) = {per_step} is larger "
                         f"than the train split ({count} images)")
    if per_step * accum > count:
        raise TrainError(f"the global batch {per_step * accum} (batch-size x "
                         f"accum-steps x ranks) is larger than the train split "
                         f"({count} images)")


# ---------------------------------------------------------------------------- optimizer
# The learning rate, the warm-up and the weight decay: recipe.py.

def worker_mode() -> Decision:
    # bench/bench_pipelines.py on the 2-core dev box (2026-12-02): the kernel's threads 1,872
    # images/s, DataLoader worker processes 1,369 (and 941 vs 703 per CPU-second); beside a
    # Python-busy thread (bench_kernel.py, 2 threads, 2026-12-02 06:08) 887 vs 703.
    return Decision("threads", "measured 1.4x faster than worker processes (decode threads "
                    "release the GIL for the whole batch)")


# ---------------------------------------------------------------------------- sample order

# `--order auto` keeps a full shuffle while the page cache can hold the stored split: at most
# this share of the available RAM (the rest: the model, the pipeline's batches, the system).
# Past it, a random read is a disk read for one image: bench/bench_order.py measures random
# against quasi-random on a split 4x its memory limit.
PAGE_CACHE_SHARE = 0.5
# A split whose neighbouring samples share a label this often is stored in class order: a
# window of a few blocks would hold a few classes, so auto keeps the full shuffle.
CLASS_ORDER_SHARE = 0.5


def order(requested: str, *, pipeline: str, reads_during_epoch: bool, stored_bytes: int,
          ram_bytes: int, cache_limit: int | None, same_label_neighbours: float) -> Decision:
    """`--order`: random (a full shuffle each epoch) unless the stored split outgrows the page
    cache or the remote cache limit, then quasi-random (pipeline/order.py), which needs only
    a window of shards at a time. `reads_during_epoch`: what `pipeline` declared (a pipeline
    that holds the decoded split reads nothing then)."""
    if requested != "auto":
        return Decision(requested, "asked for")
    gib = 2**30
    size = f"the stored split ({stored_bytes / gib:.1f} GiB)"
    if not reads_during_epoch:
        return Decision("random", f"{pipeline} holds the decoded split: nothing is read from "
                        "disk during an epoch")
    budget = int(ram_bytes * PAGE_CACHE_SHARE)
    if cache_limit is not None and stored_bytes > cache_limit:
        why = f"{size} exceeds the --cache-limit of {cache_limit / gib:.1f} GiB"
    elif stored_bytes > budget:
        why = (f"{size} exceeds {PAGE_CACHE_SHARE:.0%} of the {ram_bytes / gib:.1f} GiB of "
               "available RAM, so the page cache cannot hold it")
    else:
        return Decision("random", f"{size} fits in {PAGE_CACHE_SHARE:.0%} of the "
                        f"{ram_bytes / gib:.1f} GiB of available RAM: a full shuffle reads "
                        "from the page cache")
    if same_label_neighbours > CLASS_ORDER_SHARE:
        return Decision("random", f"{why}, but it is stored in class order "
                        f"({same_label_neighbours:.0%} of neighbouring samples share a label): "
                        "quasi-random batches would hold few classes, so the full shuffle "
                        "stays (slower reads); --order quasi-random forces it")
    return Decision("quasi-random", f"{why}: blocks are shuffled and read a window at a time "
                    "(pipeline/order.py)")


# ---------------------------------------------------------------------------- --resume auto

# The checkpoint's file name in a run folder: what --resume auto looks for (records/checkpoint.py
# writes it under this name).
CHECKPOINT_NAME = "checkpoint.pt"
# The lock file of the train writing a run folder (files/folder_lock.py; engine/run_folder.py).
RUN_LOCK_NAME = ".lock"
# What train writes into a new run folder before its first checkpoint: a run killed then (the
# queue's time limit, a preemption) leaves only these, and --resume auto starts it again.
STARTED_NAMES = frozenset({"config.yaml", "metrics.jsonl", "tensorboard"})
# The temporary name safe_create.replacing gives a checkpoint being written; kill -9 mid-write
# leaves it behind (run_folder.py removes it).
_CHECKPOINT_TEMPORARY = re.compile(r"\.checkpoint\.pt\.[0-9a-f]{16}\.tmp")


def is_checkpoint_temporary(name: str) -> bool:
    return _CHECKPOINT_TEMPORARY.fullmatch(name) is not None


def run_names(names) -> list[str] | None:
    """A run folder's names, less those that are not the run's (its lock file, a killed
    checkpoint's temporary); None stays None (no such folder)."""
    if names is None:
        return None
    return [name for name in names if name != RUN_LOCK_NAME and not is_checkpoint_temporary(name)]


def killed_before_checkpoint(names: list[str]) -> bool:
    """Whether run_names(...) are those of a run killed before its first checkpoint."""
    return bool(names) and set(names) <= STARTED_NAMES


def resume(out: str | None, names, checkpoint_name: str) -> Decision:
    """`--resume auto`, from the names in --out (None: no such folder): continue the run there
    when it has a checkpoint, else start a new one, which needs the folder missing, empty, or
    holding only what a run killed before its first checkpoint wrote (train deletes nothing it
    did not write)."""
    if not out:
        raise TrainError("--resume auto needs --out RUNDIR (the run to continue or start)")
    names = run_names(names)
    if names and checkpoint_name in names:
        return Decision(True, f"auto: {out} holds a checkpoint")
    if killed_before_checkpoint(names):
        return Decision(False, f"auto: no checkpoint in {out} (killed before the first one): "
                        "starting from scratch")
    if names:
        shown = ", ".join(printable(name) for name in names[:3]) + (", ..." if len(names) > 3
                                                                    else "")
        raise TrainError(f"--resume auto: --out {out} has no {checkpoint_name} to "
                         f"continue and is not empty (holds {shown}), so no new run can start "
                         "there either; choose another --out")
    return Decision(False, f"auto: no checkpoint in {out} yet: a new run")
