"""`TrainConfig`: every `train` setting in one dataclass, and its YAML and argparse forms.

Settings layer, later wins: the dataclass defaults, the run's saved `config.yaml` (with
`--resume`), the `--config FILE.yaml`, then the flags given on the command line. A field whose
value is None means "auto": the trainer resolves it from the dataset and the device (see
resolve.py) and saves the resolved value in RUNDIR/config.yaml, so a saved config reruns as is.

This module imports no torch, so building the parser for `--help` stays cheap.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .errors import TrainError

AUTO = "auto"
# A config file is a few hundred bytes; a cap keeps a huge or endless one from being read whole.
MAX_CONFIG_BYTES = 16 << 20

# Argument groups in the order `--help` shows them.
GROUPS = {
    "data": "Data and pipeline",
    "model": "Model",
    "optim": "Optimisation",
    "runtime": "Device, precision and threads",
    "dist": "Several processes (under torchrun)",
    "run": "Run folder, checkpoints and logging",
}


def _setting(default, help: str, group: str, *, choices=None, saved: bool = True,
             shown: str | None = None):
    """`shown`: how --help writes the default (None: auto for None, on/off for booleans)."""
    return field(default=default, metadata={"help": help, "group": group, "choices": choices,
                                            "saved": saved, "shown": shown})


@dataclass
class TrainConfig:
    # -- data and pipeline
    data: str | None = _setting(None, "prepared dataset folder (prepare-dataset's OUT); required",
                                "data")
    pipeline: str = _setting(AUTO, "batch pipeline; auto: the fastest that can run here "
                             "(resident when the decoded split fits in memory, then dali on "
                             "CUDA, then pytorch)", "data")
    image_size: int | None = _setting(None, "training resolution in pixels; auto: the native size "
                                      "of small raw images (<= 64 px), else 224 on CUDA and 64 "
                                      "on CPU", "data")
    workers: int | None = _setting(None, "pipeline worker threads/processes per rank; auto: from "
                                   "the thread budget", "data")
    worker_mode: str = _setting(AUTO, "pytorch pipeline workers: threads (decode threads in the "
                                "training process, measured fastest) or processes (a torch "
                                "DataLoader with worker processes); auto: threads", "data",
                                choices=["auto", "threads", "processes"])
    # -- model
    model: str = _setting(AUTO, "model name; auto picks by image size and device", "model")
    channels_last: bool | None = _setting(None, "channels_last model and input; auto: on for "
                                          "conv nets", "model")
    compile: bool | None = _setting(None, "torch.compile the model; auto: on for CUDA, off on "
                                    "CPU (no speedup there, 35-60 s compile)", "model")
    # -- optimisation
    epochs: int = _setting(10, "passes over the train split", "optim")
    batch_size: int | None = _setting(None, "micro-batch per rank; auto: by device and image "
                                      "size (CUDA 256, CPU 64; 512/128 for images <= 64 px), "
                                      "lowered to the largest that fits in memory, or with "
                                      "--global-batch-size the largest divisor of it that fits",
                                      "optim")
    accum_steps: int = _setting(1, "micro-batches per optimizer step (global batch = batch-size x "
                                "accum-steps x world size)", "optim")
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
    ema: bool = _setting(False, "keep an exponential moving average of the weights and evaluate "
                         "it at the end", "optim")
    ema_decay: float = _setting(0.999, "EMA decay per optimizer step (ramped up early in the run)",
                                "optim")
    max_steps: int | None = _setting(None, "stop after this many optimizer steps (the LR schedule "
                                     "spans them)", "optim", shown="no limit")
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
    resume: bool = _setting(False, "continue the run in --out from its last checkpoint", "run",
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

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        """Range checks argparse cannot do; TrainError names the flag."""
        if not self.data:
            raise TrainError("--data is required (a folder written by prepare-dataset)")
        at_least = {"epochs": 1, "accum_steps": 1, "log_every": 1, "checkpoint_every": 0,
                    "batch_size": 1, "image_size": 8, "workers": 0, "threads": 1,
                    "max_steps": 1, "warmup_steps": 0, "seed": 0, "dist_timeout": 1,
                    "global_batch_size": 1}
        for name, low in at_least.items():
            value = getattr(self, name)
            if value is not None and value < low:
                raise TrainError(f"--{name.replace('_', '-')} must be at least {low}, "
                                 f"not {value}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise TrainError(f"--label-smoothing must be in [0, 1), not {self.label_smoothing}")
        if not 0.0 < self.ema_decay < 1.0:
            raise TrainError(f"--ema-decay must be in (0, 1), not {self.ema_decay}")
        if self.lr is not None and self.lr <= 0:
            raise TrainError(f"--lr must be positive, not {self.lr}")

    def to_saved_dict(self) -> dict:
        """The fields that describe the run (not `resume`/`config`), for RUNDIR/config.yaml."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.metadata["saved"]}


# ---------------------------------------------------------------------------- field types

_HINTS = typing.get_type_hints(TrainConfig)
FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def _base_type(hint) -> tuple[type, bool]:
    """(int/float/str/bool, whether None (= auto) is allowed) of a field's annotation."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], True
    return hint, False


def parse_value(name: str, raw):
    """One setting's value from a flag string or a YAML scalar; TrainError says what is wrong."""
    kind, nullable = _base_type(_HINTS[name])
    flag = "--" + name.replace("_", "-")
    if raw is None or (nullable and isinstance(raw, str) and raw.lower() == AUTO):
        if nullable:
            return None
        raise TrainError(f"{flag} needs a value")
    try:
        if kind is bool:
            if isinstance(raw, bool):
                value = raw
            elif str(raw).lower() in ("true", "yes", "on", "1"):
                value = True
            elif str(raw).lower() in ("false", "no", "off", "0"):
                value = False
            else:
                raise ValueError(raw)
        elif kind is int:
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError(raw)
            value = int(raw)
        elif kind is float:
            value = float(raw)
        else:
            value = str(raw)
    except (TypeError, ValueError):
        expected = kind.__name__ + (" or auto" if nullable else "")
        raise TrainError(f"{flag}: expected {expected}, got {raw!r}") from None
    choices = FIELDS[name].metadata["choices"]
    if choices and value not in choices:
        raise TrainError(f"{flag}: {value!r} is not one of: {', '.join(choices)}")
    return value


# ---------------------------------------------------------------------------- YAML

def load_yaml(path: str | os.PathLike) -> dict:
    """The settings in a YAML file, validated; keys may be written `batch-size` or `batch_size`."""
    from turbotrain.datasets.untrusted import UnsafeInput, read_regular
    path = Path(path)
    try:
        # A regular file only (a named pipe would block the read forever), capped.
        loaded = yaml.safe_load(read_regular(path, MAX_CONFIG_BYTES))
    except UnsafeInput as exc:
        raise TrainError(f"config {path} {exc}") from None
    except OSError as exc:
        raise TrainError(f"cannot read config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise TrainError(f"config {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise TrainError(f"config {path} must be a mapping of flag names to values")
    settings = {}
    for key, raw in loaded.items():
        name = str(key).replace("-", "_")
        if name not in FIELDS:
            raise TrainError(f"config {path}: unknown setting {str(key)[:80]!r}; choose from: "
                             f"{', '.join(n.replace('_', '-') for n in FIELDS)}")
        if not isinstance(raw, (str, int, float, bool, type(None))):
            # Never str() a list or mapping: YAML aliases nest them into billions of items.
            raise TrainError(f"config {path}: {key} must be a single value, not a "
                             f"{type(raw).__name__}")
        settings[name] = parse_value(name, raw)
    return settings


def save_yaml(config: TrainConfig, path: str | os.PathLike) -> None:
    """Writes the run's settings as YAML readable by `--config`; auto values must be resolved.
    Written beside and renamed over `path`: a symlink there is replaced, not written through."""
    data = {name.replace("_", "-"): value for name, value in config.to_saved_dict().items()}
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.unlink(missing_ok=True)
        with open(tmp, "x") as f:
            f.write(yaml.safe_dump(data, sort_keys=False))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------------------- argparse

def add_config_arguments(parser: argparse.ArgumentParser, *, pipeline_choices=None,
                         model_help: str = "") -> None:
    """One flag per TrainConfig field, grouped. Defaults are SUPPRESSed so that the Namespace
    holds only the flags actually given, which lets YAML and saved settings sit underneath."""
    groups = {key: parser.add_argument_group(title) for key, title in GROUPS.items()}
    for name, f in FIELDS.items():
        kind, nullable = _base_type(_HINTS[name])
        flag = "--" + name.replace("_", "-")
        default = f.default
        shown = f.metadata["shown"]
        if shown is None:
            shown = (AUTO if default is None else ("on" if default else "off")
                     if isinstance(default, bool) else default)
        help_text = f.metadata["help"]
        if name == "model" and model_help:
            help_text += "; " + model_help
        if name != "data":
            help_text += f" (default: {shown})"
        kwargs = dict(default=argparse.SUPPRESS, help=help_text, dest=name)
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            choices = f.metadata["choices"]
            if name == "pipeline" and pipeline_choices is not None:
                choices = (AUTO, *pipeline_choices)
            if choices:
                kwargs["choices"] = choices
            else:
                kwargs["type"] = _flag_parser(name)
                kwargs["metavar"] = name.upper() if kind is str else kind.__name__.upper()
        groups[f.metadata["group"]].add_argument(flag, **kwargs)


def _flag_parser(name: str):
    def parse(text: str):
        try:
            return parse_value(name, text)
        except TrainError as exc:
            raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None
    parse.__name__ = _base_type(_HINTS[name])[0].__name__  # argparse's "invalid int value"
    return parse


def config_from_namespace(args: argparse.Namespace) -> TrainConfig:
    """Defaults <- RUNDIR/config.yaml (with --resume) <- --config FILE <- the given flags."""
    given = {name: getattr(args, name) for name in FIELDS if hasattr(args, name)}
    from_file = load_yaml(given["config"]) if given.get("config") else {}
    requested = {**from_file, **given}
    saved = {}
    if requested.get("resume"):
        if not requested.get("out"):
            raise TrainError("--resume needs --out RUNDIR (the run to continue)")
        saved_path = Path(requested["out"]) / "config.yaml"
        if not os.path.lexists(saved_path):  # anything else there: load_yaml says what it is
            raise TrainError(f"--resume: no run to continue in {requested['out']} "
                             "(no config.yaml there)")
        saved = load_yaml(saved_path)
    config = TrainConfig(**{**saved, **requested})
    config.validate()
    return config
