"""`TrainConfig`: every `train` setting in one dataclass, with its range checks.

Each field carries its flag's help text, `--help` group and choices as metadata: config_flags.py
makes the `train` flags from them and parses values, config_files.py reads and writes the
settings as YAML and layers defaults, files and flags. A field whose value is None means
"auto": the trainer's plan resolves it from the dataset and the machine (see plan/) and saves the
resolved value in RUNDIR/config.yaml, so a saved config reruns as is.

This module imports no torch, so building the parser for `--help` stays cheap.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field

from turbotrain import augment_policy
from turbotrain.sizes import SizeError, parse_size

from ..errors import TrainError
from .model_args import parse_model_kwargs

AUTO = "auto"
MAX_EVAL_RES = 4096  # weights.ModelCard's bound on a side (written out: no torch here)


def _setting(default, help: str, group: str, *, choices=None, saved: bool = True,
             shown: str | None = None, aliases: tuple[str, ...] = ()):
    """`shown`: how --help writes the default (None: auto for None, on/off for booleans).
    `aliases`: other trainers' names of the same flag, with exactly its meaning (`-b`)."""
    return field(default=default, metadata={"help": help, "group": group, "choices": choices,
                                            "saved": saved, "shown": shown,
                                            "aliases": aliases})


@dataclass
class TrainConfig:
    # -- data and pipeline
    data: str | None = _setting(None, "prepared dataset folder (prepare-dataset's OUT), "
                                "or its URL (s3://, gs://, az://, https://); required", "data")
    pipeline: str = _setting(AUTO, "batch pipeline; auto: the fastest that can run here "
                             "(resident when the decoded split fits in memory, then dali on "
                             "CUDA, then pytorch)", "data")
    image_size: int | None = _setting(None, "training resolution in pixels; auto: the native size "
                                      "of small raw images (<= 64 px), else 64 on CPU and, on "
                                      "CUDA, for fewer than 10,000 train images, else 224; "
                                      "with --time-budget on a CPU (and --model auto), 64 or "
                                      "32, as the budget allows",
                                      "data")
    workers: int | None = _setting(None, "pipeline worker threads/processes per rank; auto: from "
                                   "the thread budget", "data", aliases=("--num-workers",))
    worker_mode: str = _setting(AUTO, "pytorch pipeline workers: threads (decode threads in the "
                                "training process, measured fastest) or processes (a torch "
                                "DataLoader with worker processes); auto: threads", "data",
                                choices=["auto", "threads", "processes"])
    order: str = _setting(AUTO, "training sample order: random (a full shuffle each epoch) or "
                          "quasi-random (shards, or 64 MiB blocks of an unsharded split, "
                          "shuffled; samples shuffled within --order-window of them at a time: "
                          "for data larger than memory or the remote cache); auto: "
                          "quasi-random when the split exceeds half the available RAM or the "
                          "--cache-limit, unless it is stored in class order", "data",
                          choices=(AUTO, "random", "quasi-random"))
    order_window: int = _setting(4, "quasi-random order: shards (or blocks) whose samples are "
                                 "shuffled together; bounds the memory or cache the order "
                                 "needs", "data")
    # -- a dataset in object storage (--data s3://...; datasets/remote/split.py, shard_cache.py)
    cache_dir: str | None = _setting(None, "folder of downloaded shards of a --data URL, "
                                     "shared by ranks and runs", "data",
                                     shown="$TURBOTRAIN_CACHE or ~/.cache/turbotrain/shards")
    cache_limit: str | None = _setting(None, "most bytes --cache-dir may hold (50GB, 512MiB, "
                                       "...); least recently used shards are deleted first",
                                       "data", shown="$TURBOTRAIN_CACHE_LIMIT or 50GB")
    verify_data: bool = _setting(True, "check each dataset file against the SHA-256 that "
                                 "dataset.json records, once, when the run opens it, so a "
                                 "damaged file is refused before training on it (~1 s per "
                                 "GB)", "data")
    # -- model
    model: str = _setting(AUTO, "model name; auto picks by image size and device", "model")
    blurpool: bool = _setting(False, "BlurPool (Zhang 2019, FFCV's and Composer's ImageNet "
                              "recipes): a fixed [1 2 1] x [1 2 1] low-pass before every "
                              "strided conv with 16+ input channels, and max-pools that "
                              "downsample become max then blur; off: on a 2-core CPU it reached "
                              "the same accuracy later (each epoch 27 %% dearer; docs/TRAINING.md)",
                              "model")
    channels_last: bool | None = _setting(None, "channels_last model and input; auto: on for "
                                          "conv nets", "model")
    compile: bool | None = _setting(None, "torch.compile the model; auto: on for CUDA, off on "
                                    "CPU (no speedup there, 35-60 s compile)", "model")
    model_kwargs: str | None = _setting(None, "extra constructor arguments of the model, as "
                                        "JSON or k=v,k=v (e.g. drop_rate=0.1); timm models "
                                        "also get img_size from --image-size", "model",
                                        shown="none")
    # -- starting from weights (finetune.py, weights_in.py)
    pretrained: bool = _setting(False, "start from the model's published weights "
                                "(torchvision's DEFAULT, timm's default or the tag's: "
                                "timm:resnet18.a1_in1k), read from the local cache (TORCH_HOME, "
                                "HF_HOME); nothing is downloaded without --download",
                                "weights")
    download: bool = _setting(False, "with --pretrained: download the weights into that cache "
                              "when they are not there (torchvision's from download.pytorch.org, "
                              "hash-checked; timm's from the Hugging Face hub)", "weights",
                              saved=False)
    init_from: str | None = _setting(None, "start from these weights: a run folder (its "
                                     "best.safetensors, else final.safetensors), a .safetensors "
                                     "file or a state_dict .pt", "weights", shown="none")
    freeze_backbone: bool = _setting(False, "train only the classifier head; the rest keeps "
                                     "the starting weights (and BatchNorm statistics)",
                                     "weights")
    layer_decay: float = _setting(1.0, "layer-wise LR decay: each depth below the head gets "
                                  "F times the LR of the one above it (0.65-0.75 is usual for "
                                  "ViTs; 1: off)", "weights", shown="1 (off)")
    # -- optimisation
    epochs: int | None = _setting(None, "passes over the train split; auto (not given): up to "
                                  "10, with --early-stop", "optim", shown="auto")
    early_stop: bool | None = _setting(None, "end the run at 100%% val accuracy, or when it has "
                                       "stopped improving late in the LR schedule "
                                       "(docs/RUN_LENGTH.md); auto: on without --epochs and "
                                       "--max-steps (with a val split, without "
                                       "--time-budget)", "optim")
    batch_size: int | None = _setting(None, "micro-batch per rank; auto: by device and image "
                                      "size (CUDA 256, CPU 64; 512/128 for images <= 64 px), "
                                      "lowered to the largest that fits in memory, or with "
                                      "--global-batch-size the largest divisor of it that fits",
                                      "optim", aliases=("-b",))
    accum_steps: int = _setting(1, "micro-batches per optimizer step (global batch = batch-size x "
                                "accum-steps x world size)", "optim",
                                aliases=("--grad-accum-steps",))
    global_batch_size: int | None = _setting(None, "images per optimizer step over all ranks; "
                                             "sets --accum-steps to G / (batch-size x ranks)",
                                             "optim", shown="batch-size x accum-steps x ranks")
    lr: float | None = _setting(None, "peak learning rate; auto: the model's rate per 256 images, "
                                "scaled with the global batch", "optim")
    optimizer: str = _setting("sgd", "sgd (Nesterov momentum) or adamw", "optim",
                              choices=("sgd", "adamw"))
    momentum: float = _setting(0.9, "SGD momentum / AdamW beta1", "optim")
    weight_decay: float | None = _setting(None, "weight decay (never on norms and biases); auto: "
                                          "the model's for SGD, 0.05 for AdamW", "optim")
    label_smoothing: float = _setting(0.1, "label smoothing of the training loss", "optim")
    schedule: str = _setting("cosine", "LR decay after the warm-up", "optim",
                             choices=("cosine", "linear", "onecycle"))
    warmup_steps: int | None = _setting(None, "linear LR warm-up in optimizer steps; auto: 5%% "
                                        "of the run, at least 1 and at most 2000", "optim")
    # Saved as the steps it comes to (the plan converts it): config.yaml holds one warm-up.
    warmup_epochs: float | None = _setting(None, "the warm-up in epochs instead, converted to "
                                           "optimizer steps (E x steps per epoch, rounded)",
                                           "optim", saved=False, shown="none")
    ema: bool = _setting(False, "keep an exponential moving average of the weights and evaluate "
                         "it at the end", "optim")
    ema_decay: float = _setting(0.999, "EMA decay per optimizer step (ramped up early in the run)",
                                "optim")
    time_budget: float | None = _setting(None, "end the run within DURATION of its start "
                                         "(90s, 10m, 1h): its first steps are timed and the "
                                         "epochs and the LR schedule sized to fit; without "
                                         "--epochs, as many epochs as fit (config.yaml leaves "
                                         "out the epochs and warm-up it sizes, so a rerun "
                                         "sizes them again); none: no budget", "optim",
                                         shown="none")
    target_accuracy: float | None = _setting(None, "stop at the first evaluation whose val "
                                             "accuracy reaches A (0.95 = 95%%); the LR schedule "
                                             "is cut there; none: no target (drops a "
                                             "saved run's on --resume)", "optim",
                                             shown="none")
    max_steps: int | None = _setting(None, "stop after this many optimizer steps (the LR schedule "
                                     "spans them)", "optim", shown="no limit")
    clip_grad: float = _setting(0.0, "clip the global gradient norm to this before each "
                                "optimizer step, after fp16 unscaling (0: off)", "optim")
    # -- augmentation and regularisation: timm's recipes, off (or torchvision's) by default
    mixup: float = _setting(0.0, "mixup alpha: blend each image with another of its micro-batch "
                            "by a Beta(alpha, alpha) weight, the labels alike (0.2 is usual; "
                            "0: off)", "augment")
    cutmix: float = _setting(0.0, "CutMix alpha: paste a box from another image of the "
                             "micro-batch, the labels weighted by its area (1.0 is usual; 0: off)",
                             "augment")
    mix_prob: float = _setting(1.0, "share of micro-batches that --mixup / --cutmix mix",
                               "augment")
    mix_switch_prob: float = _setting(0.5, "with both --mixup and --cutmix on: share of the mixed "
                                      "micro-batches that get CutMix", "augment")
    # torchvision's RandomResizedCrop ranges (augment.RESIZED_CROP_SCALE / _RATIO; written out
    # here because this module imports no torch, and tests/train/step/test_mixing.py checks them).
    scale: tuple[float, float] = _setting((0.08, 1.0), "RandomResizedCrop area range LO HI, as "
                                          "a fraction of the image (photo-sized images; small "
                                          "ones are pad-cropped)", "augment", shown="0.08 1")
    ratio: tuple[float, float] = _setting((3 / 4, 4 / 3), "RandomResizedCrop aspect-ratio range "
                                          "LO HI (width / height, drawn log-uniform)", "augment",
                                          shown="3/4 4/3")
    # timm's flags and spellings (turbotrain/augment_policy.py); applied to the training
    # batches after decode, the same for every pipeline (pipeline/after_decode.py).
    aa: str | None = _setting(None, "RandAugment or TrivialAugment, in timm's syntax: "
                              "rand-m9-mstd0.5 (n ops per image, default 2, at magnitude m of "
                              "10, std mstd; also -n2, -mmax10, -inc1) or trivial "
                              "(TrivialAugmentWide); per sample from (seed, epoch, index)",
                              "augment", shown="none")
    color_jitter: float = _setting(0.0, "colour jitter: brightness, contrast and saturation "
                                   "each by a factor in [1 - F, 1 + F], in a random order "
                                   "(0.4 is timm's); as in timm, not with --aa (0: off)",
                                   "augment")
    reprob: float = _setting(0.0, "random erasing: the share of images that get 1..--recount "
                             "boxes of 2-33 %% of their area erased (0.25 is timm's recipe; "
                             "0: off)", "augment")
    remode: str = _setting("pixel", "random erasing's fill: per-pixel normal noise, one "
                           "normal colour per box (rand), or the dataset mean (const), as "
                           "timm's", "augment", choices=augment_policy.ERASE_MODES)
    recount: int = _setting(1, "random erasing: at most this many boxes per image", "augment")
    # -- progressive resizing (pipeline/resolution.py; the plan's rule: plan/resolution.py)
    progressive: bool | None = _setting(None, "progressive resizing: the early epochs train "
                                        "smaller, ramping up to --max-res (FFCV's schedule; "
                                        "same crops, same batch size); auto: on for conv nets "
                                        "at >= 128 px for >= 8 epochs; off for small images "
                                        "(it did not pay on Fashion-MNIST)",
                                        "resolution")
    min_res: int | None = _setting(None, "progressive resizing's first training size in px; "
                                   "auto: 3/4 of --max-res, rounded down to the step (4 px "
                                   "up to 64 px, 16, 32 from 160 px on), at least 64 (16 for "
                                   "small images)", "resolution")
    max_res: int | None = _setting(None, "the final training size in px, where the ramp ends; "
                                   "the same as --image-size (give one of them)", "resolution",
                                   shown="--image-size")
    res_ramp: tuple[float, float] | None = _setting(None, "epochs START END of the ramp from "
                                                    "--min-res (before START) to --max-res "
                                                    "(from END on); auto: 40%% and 85%% of "
                                                    "--epochs (small images: 0 and 25%%)", "resolution")
    # -- evaluation: test-time resolution and flip TTA (plan/eval_rules.py decides auto)
    eval_res: int | None = _setting(None, "evaluation resolution in pixels (training's "
                                    "evaluations, and eval, predict and export through the "
                                    "weights' card); auto: about 1.3x the training size for "
                                    "photos trained with random-resized crops and a conv net "
                                    "(FFCV, Composer, FixRes), the training size for small "
                                    "images and for fixed-size models", "eval")
    tta: bool | None = _setting(None, "flip test-time augmentation: each val image's logits "
                                "are the mean of the image's and its mirror's (2 forward "
                                "passes); auto: on where training used flips, except "
                                "small images up to 28 px (it did not pay there)", "eval")
    # -- device, precision and threads
    device: str = _setting(AUTO, "where to train", "runtime", choices=(AUTO, "cpu", "cuda"))
    precision: str = _setting(AUTO, "auto: bf16 autocast on CPUs with native bf16 and on CUDA "
                              "compute capability >= 8.0, fp16 + GradScaler on older GPUs, "
                              "else fp32", "runtime", choices=(AUTO, "fp32", "bf16", "fp16"))
    threads: int | None = _setting(None, "torch intra-op threads per rank; auto: the cores the "
                                   "pipeline workers leave", "runtime")
    seed: int = _setting(0, "seed of the model init, data order and augmentation", "runtime")
    deterministic: bool = _setting(False, "torch.use_deterministic_algorithms (slower; exact "
                                   "reruns)", "runtime")
    # -- several processes (torchrun sets RANK/WORLD_SIZE; a plain run ignores these)
    sync_bn: bool = _setting(False, "SyncBatchNorm: BatchNorm statistics over the global batch, "
                             "not each rank's share (CUDA only; helps below ~32 images per "
                             "rank)", "dist")
    # 300 s: far above the longest legitimate wait at a collective (rank 0 writing a ResNet-50
    # checkpoint, ~200 MB, takes seconds; ranks compile and evaluate equal shares in step),
    # yet a hung rank ends the job in 5 minutes instead of Gloo's default 30.
    dist_timeout: int = _setting(300, "seconds a rank waits at a collective (gradient "
                                 "all-reduce, barrier) before the job fails with an error; "
                                 "raise it for very slow checkpoint storage", "dist")
    # -- run folder, checkpoints and logging
    out: str | None = _setting(None, "run folder; a new run needs it missing or empty, as train "
                               "deletes nothing it did not write (--resume continues the run in "
                               "it); auto: runs/<dataset>-<model>-<time>, with -2, -3, ... added "
                               "when taken", "run")
    # True, False or "auto" (a flag with an optional value: `--resume`, `--resume auto`).
    resume: bool | str = _setting(False, "continue the run in --out from its last checkpoint "
                                  "(flags given with it override its saved settings, and "
                                  "its start says what that changes); "
                                  "--resume auto: continue it when --out holds a checkpoint, "
                                  "else start a new run there (for a scheduler or torchrun "
                                  "--max-restarts that reruns the same command)", "run",
                                  saved=False)
    checkpoint_every: int = _setting(500, "checkpoint every N optimizer steps (0: only at epoch "
                                     "ends and on SIGTERM/SIGINT)", "run")
    log_every: int = _setting(20, "log metrics every N optimizer steps", "run")
    tensorboard: bool = _setting(False, "also write TensorBoard scalars to RUNDIR/tensorboard",
                                 "run")
    profile: bool = _setting(False, "torch.profiler over 10 optimizer steps after warm-up: "
                             "RUNDIR/trace.json (ui.perfetto.dev) and RUNDIR/profile.txt (top "
                             "operators by self time)", "run", saved=False)
    config: str | None = _setting(None, "YAML file that sets any of these flags (keys as the flag "
                                  "names); flags given here win", "run", saved=False, shown="none")

    def __post_init__(self):
        # Pairs (--scale, --ratio) come as lists from argparse (nargs=2) and YAML: kept as tuples.
        for name in PAIRS:
            if isinstance(getattr(self, name), list):
                setattr(self, name, tuple(getattr(self, name)))

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        """Range checks argparse cannot do; TrainError names the flag."""
        if not self.data:
            raise TrainError("--data is required (a folder written by prepare-dataset)")
        at_least = {"epochs": 1, "accum_steps": 1, "log_every": 1, "checkpoint_every": 0,
                    "batch_size": 1, "image_size": 8, "workers": 0, "threads": 1,
                    "max_steps": 1, "warmup_steps": 0, "seed": 0, "dist_timeout": 1,
                    "global_batch_size": 1, "order_window": 1, "eval_res": 8}
        at_least.update(min_res=8, max_res=8)
        for name, low in at_least.items():
            value = getattr(self, name)
            if value is not None and value < low:
                raise TrainError(f"--{name.replace('_', '-')} must be at least {low}, "
                                 f"not {value}")
        if self.eval_res is not None and self.eval_res > MAX_EVAL_RES:
            raise TrainError(f"--eval-res must be at most {MAX_EVAL_RES} (the largest side a "
                             f"weights card holds), not {self.eval_res}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise TrainError(f"--label-smoothing must be in [0, 1), not {self.label_smoothing}")
        if not 0.0 < self.ema_decay < 1.0:
            raise TrainError(f"--ema-decay must be in (0, 1), not {self.ema_decay}")
        if self.target_accuracy is not None and not 0.0 < self.target_accuracy <= 1.0:
            raise TrainError(f"--target-accuracy must be in (0, 1] (0.95 is 95%), not "
                             f"{self.target_accuracy}")
        if self.time_budget is not None and not (math.isfinite(self.time_budget)
                                                 and self.time_budget > 0):
            raise TrainError(f"--time-budget must be a positive duration, not "
                             f"{self.time_budget}")
        if self.warmup_epochs is not None:
            if not (math.isfinite(self.warmup_epochs) and self.warmup_epochs >= 0):
                raise TrainError(f"--warmup-epochs must be a number >= 0, not "
                                 f"{self.warmup_epochs}")
            if self.warmup_steps is not None:
                raise TrainError("--warmup-steps and --warmup-epochs both set the warm-up; "
                                 "give one")
        if self.lr is not None and self.lr <= 0:
            raise TrainError(f"--lr must be positive, not {self.lr}")
        self._validate_weights_settings()
        self._validate_resolution_settings()
        if self.cache_limit is not None:
            try:
                parse_size(self.cache_limit, "--cache-limit")
            except SizeError as exc:
                raise TrainError(str(exc)) from None
        for name in ("clip_grad", "mixup", "cutmix"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise TrainError(f"--{name.replace('_', '-')} must be a number >= 0 (0: off), "
                                 f"not {getattr(self, name)}")
        for name in ("mix_prob", "mix_switch_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise TrainError(f"--{name.replace('_', '-')} must be in [0, 1], not "
                                 f"{getattr(self, name)}")
        for name, rule, top in (("scale", "0 < LO <= HI <= 1", 1.0),
                                ("ratio", "0 < LO <= HI (finite)", math.inf)):
            pair = getattr(self, name)
            if not (len(pair) == 2 and all(math.isfinite(v) for v in pair)
                    and 0 < pair[0] <= pair[1] <= top):
                raise TrainError(f"--{name} needs {rule}, not {' '.join(map(str, pair))}")
        try:
            self.augment_policy()
        except augment_policy.AugmentError as exc:
            raise TrainError(str(exc)) from None

    def _validate_weights_settings(self) -> None:
        """--pretrained, --init-from, --freeze-backbone, --layer-decay, --model-kwargs,
        --resume."""
        if not (math.isfinite(self.layer_decay) and 0.0 < self.layer_decay <= 1.0):
            raise TrainError(f"--layer-decay must be in (0, 1] (1: off), not {self.layer_decay}")
        if self.download and not self.pretrained:
            raise TrainError("--download fetches --pretrained weights: add --pretrained (or "
                             "drop --download)")
        if self.pretrained and self.init_from is not None:
            raise TrainError("--pretrained and --init-from both name starting weights; give one")
        if self.freeze_backbone and not (self.pretrained or self.init_from is not None):
            raise TrainError("--freeze-backbone trains only the head, on top of starting "
                             "weights: add --pretrained or --init-from")
        if self.resume not in (True, False, AUTO):
            raise TrainError(f"--resume takes no value or 'auto', not {self.resume!r}")
        parse_model_kwargs(self.model_kwargs)

    def _validate_resolution_settings(self) -> None:
        """--max-res, --min-res, --res-ramp, --no-progressive."""
        if (self.max_res is not None and self.image_size is not None
                and self.max_res != self.image_size):
            raise TrainError(f"--max-res {self.max_res} and --image-size {self.image_size} both "
                             "set the final training size; give one")
        if self.min_res is not None and self.max_res is not None and self.min_res > self.max_res:
            raise TrainError(f"--min-res {self.min_res} is above --max-res {self.max_res}")
        if self.res_ramp is not None:
            start, end = self.res_ramp
            if not (len(self.res_ramp) == 2 and math.isfinite(start) and math.isfinite(end)
                    and 0 <= start <= end):
                raise TrainError(f"--res-ramp needs epochs 0 <= START <= END, not "
                                 f"{' '.join(map(str, self.res_ramp))}")
        if self.progressive is False and (self.min_res is not None
                                          or self.res_ramp is not None):
            raise TrainError("--no-progressive turns off the schedule that --min-res / "
                             "--res-ramp set; drop one")

    def augment_policy(self) -> augment_policy.AugmentPolicy:
        """--aa, --color-jitter, --reprob, --remode, --recount as one policy (AugmentError when
        one is out of range)."""
        return augment_policy.policy(self.aa, reprob=self.reprob, remode=self.remode,
                                     recount=self.recount, color_jitter=self.color_jitter)

    @property
    def from_weights(self) -> bool:
        """Whether the run starts from weights: --pretrained or --init-from."""
        return bool(self.pretrained) or self.init_from is not None

    def to_saved_dict(self) -> dict:
        """The fields that describe the run (not `resume`/`config`), for RUNDIR/config.yaml."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.metadata["saved"]}


# ---------------------------------------------------------------------------- field types

_HINTS = typing.get_type_hints(TrainConfig)
FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def _base_type(hint) -> tuple[type, bool]:
    """(int/float/str/bool/tuple, whether None (= auto) is allowed) of a field's annotation;
    tuple is a pair of floats (LO HI)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], True
    if typing.get_origin(hint) is tuple:
        return tuple, False
    return hint, False


def field_type(name: str) -> tuple[type, bool]:
    """`_base_type` of the annotation of TrainConfig's field `name` (a pair that may be None,
    like --res-ramp, is a nullable tuple)."""
    kind, nullable = _base_type(_HINTS[name])
    if typing.get_origin(kind) is tuple:
        return tuple, nullable
    return kind, nullable




PAIRS = tuple(name for name in FIELDS if field_type(name)[0] is tuple)
