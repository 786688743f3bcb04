"""Weights files: what a run leaves for people to use (`best.safetensors`, `final.safetensors`),
and reading weights back for `eval`, `predict`, `export` and `train --init-from`.

A weights file is a safetensors file of the whole `Classifier` state (the input stem's
normalisation buffers included) plus, in its header's metadata under "turbotrain", a small JSON
card: the model name, class names, image size, mean/std, model keyword arguments and where the
weights came from. One file carries everything needed to rebuild and run the model; safetensors
holds tensors only, so loading one runs no code (docs/SECURITY.md), unlike a pickle.

`checkpoint.pt` stays the resume state (optimizer, RNG, position); these files are what is
shipped.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from turbotrain.datasets.beton.dataset_json import MAX_CLASS_NAME_CHARS
from turbotrain.datasets.beton.layout import MAX_CLASSES
from turbotrain.files.safe_create import replacing_path
from turbotrain.files.untrusted import UnsafeInput, open_regular
from turbotrain.pipeline.augment import eval_rule
from turbotrain.pipeline.base import PipelineOptions
from turbotrain.printable import printable

from ..config.model_args import check_model_kwargs
from ..errors import TrainError
from ..models.model_check import check_card_fits
from ..models.models import build_model, get_model_spec

WEIGHTS_FORMAT = 1
BEST_NAME = "best.safetensors"
FINAL_NAME = "final.safetensors"
CARD_KEY = "turbotrain"
# A card holds class names, as dataset.json does, and gets its cap (16 MiB: 200,000 names of
# 60 characters are ~13 MB), which also bounds what json.loads allocates.
MAX_CARD_CHARS = 16 << 20
MAX_MODEL_NAME = 200
MAX_INFO_ITEMS = 64
MAX_SIDE = 4096  # the largest image or eval size a card may give (config.MAX_EVAL_RES)


@dataclass(frozen=True)
class ModelCard:
    """What a weights file says about its model; enough to rebuild it and prepare its input."""
    model: str                         # as --model names it: compact28, resnet18, timm:NAME
    classes: tuple[str, ...]
    image_size: int                    # the side the model was trained at
    mean: tuple[float, float, float]   # the input stem's normalisation, 0..255 scale
    std: tuple[float, float, float]
    model_kwargs: dict = field(default_factory=dict)
    # Provenance, shown by eval/predict and never needed to run the model: step, epoch,
    # val_accuracy, dataset, run folder.
    info: dict = field(default_factory=dict)
    # How the run evaluated (plan/eval_rules.py), which eval and predict repeat: the side of
    # the input (None: image_size, as in files written before test-time resolution) and flip
    # TTA. BlurPool changes what the net computes, not its tensors: a model trained with it
    # must be rebuilt with it (models.blurpool).
    eval_size: int | None = None
    tta: bool = False
    blurpool: bool = False

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def input_size(self) -> int:
        """The side eval and predict feed the model: the run's evaluation resolution."""
        return self.image_size if self.eval_size is None else self.eval_size

    @property
    def preprocessing(self) -> dict[str, str]:
        """How an image becomes the model's input, as eval and predict make it: written in
        every card (from the code's own rule, so it cannot drift; never read back)."""
        return preprocessing(self.input_size, tta=self.tta)

    def to_json(self) -> str:
        return json.dumps({"format": WEIGHTS_FORMAT, **asdict(self),
                           "preprocessing": self.preprocessing}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, path: Path) -> ModelCard:
        """The card in a weights file's metadata, checked field by field (a file from elsewhere
        is input like any other): the ranges dataset.json's schema gives classes and pixel
        statistics, model_kwargs as --model-kwargs are (model_args), info as plain values;
        TrainError naming the file otherwise. Whether the model fits the file's tensors is
        checked before it is built (read_safetensors, model_check.check_card_fits)."""


        def bad(what: str) -> TrainError:
            return TrainError(f"{path}: not a turbotrain weights file ({what})")
        if len(text) > MAX_CARD_CHARS:
            raise bad(f"its card is {len(text) / 2**20:,.0f} MiB, over the "
                      f"{MAX_CARD_CHARS >> 20} MiB a card may be")
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError, MemoryError):
            raise bad("its card is not valid JSON") from None
        if not isinstance(raw, dict) or raw.get("format") != WEIGHTS_FORMAT:
            shown = raw.get("format") if isinstance(raw, dict) else None
            raise bad(f"card format {printable(repr(shown))[:40]}, expected {WEIGHTS_FORMAT}")
        model = raw.get("model")
        if not isinstance(model, str) or not 0 < len(model) <= MAX_MODEL_NAME:
            raise bad("no model name")
        classes = raw.get("classes")
        if not isinstance(classes, list) or not classes or not all(
                isinstance(c, str) and len(c) <= MAX_CLASS_NAME_CHARS for c in classes):
            raise bad(f"no class names (a list of names of at most {MAX_CLASS_NAME_CHARS:,} "
                      "characters)")
        if len(classes) > MAX_CLASSES:
            raise bad(f"{len(classes):,} class names, more than the {MAX_CLASSES:,} a dataset "
                      "may have")
        size = raw.get("image_size")
        if type(size) is not int or not 1 <= size <= MAX_SIDE:
            raise bad(f"image size {printable(repr(size))[:40]}")
        eval_size = raw.get("eval_size")
        if eval_size is not None and (type(eval_size) is not int
                                      or not 1 <= eval_size <= MAX_SIDE):
            raise bad(f"eval size {printable(repr(eval_size))[:40]}")
        flags = {key: raw.get(key, False) for key in ("tta", "blurpool")}
        for key, value in flags.items():
            if type(value) is not bool:
                raise bad(f"{key} is not true or false")
        stats = {}
        for key in ("mean", "std"):
            values = raw.get(key)
            if not isinstance(values, list) or len(values) != 3 or not all(
                    type(v) in (int, float) and math.isfinite(v) and 0 <= v <= 255
                    for v in values):
                raise bad(f"{key} is not 3 numbers in 0..255")
            stats[key] = tuple(float(v) for v in values)
        if not all(0 < v for v in stats["std"]):
            raise bad("std has a value <= 0")
        kwargs = check_model_kwargs(raw.get("model_kwargs", {}), f"{path}: its card's "
                                    "model_kwargs")
        info = raw.get("info", {})
        if not (isinstance(info, dict) and len(info) <= MAX_INFO_ITEMS and all(
                isinstance(k, str) and len(k) <= 100 and _plain_info(v)
                for k, v in info.items())):
            raise bad(f"info is not a mapping of at most {MAX_INFO_ITEMS} plain values")
        return cls(model, tuple(classes), size, stats["mean"], stats["std"], kwargs, info,
                   eval_size=eval_size, **flags)


def preprocessing(image_size: int, *, tta: bool = False) -> dict[str, str]:
    """The input rule of a model trained at `image_size` (pipeline/augment.eval_rule, with the
    pipelines' crop ratio and prepare-dataset's default storage): a naive resize of the whole
    image to image_size x image_size gives other predictions."""
    # lazy: the converter's imports (multiprocessing, the sources) stay out of loading weights
    from turbotrain.datasets.prepare.convert import PrepareOptions
    stored = PrepareOptions()
    return {"input": f"uint8 RGB, NCHW [batch, 3, {image_size}, {image_size}]; do not "
                     "normalise: the model applies the card's mean/std itself",
            "stored": f"EXIF rotation applied, a longest side over {stored.max_side} px "
                      f"shrunk to {stored.max_side} (prepare-dataset's default --max-side)",
            **eval_rule(image_size, PipelineOptions.crop_ratio),
            "tta": ("the mean of the logits of the image and of its horizontal mirror"
                    if tta else "none: one forward pass")}


def _plain_info(value) -> bool:
    """A value a card's provenance may hold: shown by eval/predict, never needed to run."""
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, (bool, int)) and abs(value) < 2**63 or (
        isinstance(value, str) and len(value) <= 4096)


def save_weights(path: str | os.PathLike, model: torch.nn.Module, card: ModelCard, *,
                 overwrite: bool = True) -> Path:
    """Writes model's state (contiguous CPU copies) and the card; atomic (safe_create: written
    in a private folder beside `path`, renamed onto it), so a reader never sees half a file
    and nothing planted at `path` is written through."""
    from safetensors.torch import save_file

    path = Path(path)
    state = {name: tensor.detach().to("cpu").contiguous()
             for name, tensor in model.state_dict().items()}
    with replacing_path(path, overwrite=overwrite) as tmp:
        save_file(state, str(tmp), metadata={CARD_KEY: card.to_json()})
    return path


def read_weights(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], ModelCard]:
    """(state dict on the CPU, card) of a turbotrain weights file; TrainError (one line) for
    anything else, a safetensors file without our card included."""
    path = Path(path)
    state, card = read_safetensors(path, printable(str(path)))
    if card is None:
        raise TrainError(f"{printable(str(path))}: not a turbotrain weights file (no "
                         f"{CARD_KEY!r} card in its metadata); use train --init-from for other "
                         f"weights")
    return state, card


def read_safetensors(path: Path, label: str, *, tensors: bool = True):
    """(state dict on the CPU, or {} without `tensors`; card or None) of any safetensors file.
    Errors are one TrainError line starting with `label` (the path, or the flag and the path).
    Only a regular file is opened (a named pipe would block): safetensors reads a bounded JSON
    header and tensors, never code."""
    from safetensors import SafetensorError, safe_open

    try:
        with open_regular(path):
            pass
    except FileNotFoundError:
        raise TrainError(f"{label}: no such file") from None
    except (UnsafeInput, OSError) as exc:
        raise TrainError(f"{label}: {exc}") from None
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            card = (ModelCard.from_json(metadata[CARD_KEY], path) if CARD_KEY in metadata
                    else None)
            if card is not None:  # before a tensor is read or a module built
                shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
                check_card(card, shapes, printable(str(path)))
            state = {name: f.get_tensor(name) for name in f.keys()} if tensors else {}
    except (SafetensorError, OSError, ValueError, OverflowError, MemoryError) as exc:
        raise TrainError(f"{label}: not a readable safetensors file "
                         f"({printable(' '.join(str(exc).split()))[:200]})") from None
    return state, card


def check_card(card: ModelCard, shapes: dict[str, tuple[int, ...]], label: str) -> None:
    """The card must name a model this install builds, and that model (with the card's
    classes and model_kwargs, built on the meta device) must hold exactly the file's
    tensors: then building it for real allocates what the file already holds, and no more."""
    try:
        spec = get_model_spec(card.model, model_kwargs=card.model_kwargs,
                              image_size=card.image_size, blurpool=card.blurpool,
                              where=f"{label}: its card's model_kwargs")
    except TrainError as exc:
        if str(exc).startswith(label):
            raise
        raise TrainError(f"{label}: its card names a model this install cannot build ({exc})"
                         ) from None
    check_card_fits(card.model, spec.build, card.num_classes, shapes, label)


def run_weights(source: str | os.PathLike) -> Path:
    """The weights file for `source`: itself when it is a file; in a run folder,
    best.safetensors (the best val accuracy), else final.safetensors."""
    source = Path(source)
    if not source.is_dir():
        return source
    for name in (BEST_NAME, FINAL_NAME):
        if (source / name).is_file():
            return source / name
    raise TrainError(f"{source} holds no {BEST_NAME} or {FINAL_NAME}: a run writes them as it "
                     f"evaluates and when it ends; pass --weights FILE or a finished run")


def load_classifier(source: str | os.PathLike, device: torch.device | str = "cpu"):
    """(Classifier in eval mode on `device`, card) from a run folder or a weights file."""
    path = run_weights(source)
    state, card = read_weights(path)  # its card checked against its tensors (check_card)
    spec = get_model_spec(card.model, model_kwargs=card.model_kwargs, image_size=card.image_size,
                          blurpool=card.blurpool)
    model = build_model(spec, card.num_classes, card.mean, card.std)
    try:
        # assign=True: the module takes the file's tensors instead of copying them into its
        # own (ResNet-50: 0.5 s of copying saved on the busy 2-core box; bench_predict.py
        # times the whole load). Building on the meta device would also skip the random
        # init, but its first use imports torch._dynamo: +1.1 s for compact28.
        model.load_state_dict(state, assign=True)
    except RuntimeError as exc:
        raise TrainError(f"{path}: its weights do not fit model {card.model} with "
                         f"{card.num_classes} classes ({str(exc).splitlines()[0]})") from None
    return model.to(device).eval(), card
