"""The table of our own nets by `--model` name: nets.py registers into it, models.py reads it
(a leaf, so that neither imports the other)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable[[int], nn.Module]  # num_classes -> net (input: normalised float)
    sgd_lr: float  # peak SGD learning rate per 256 images of global batch
    weight_decay: float  # SGD weight decay
    conv: bool = True  # channels_last helps
    family: str = "ours"  # ours, torchvision or timm: where --pretrained weights come from
    # What `build` passes to the constructor beyond num_classes (--model-kwargs, and timm's
    # img_size), and a line saying how the image size reaches the model (timm), or "".
    kwargs: dict = field(default_factory=dict)
    note: str = ""

    @property
    def any_size(self) -> bool:
        """Runs at any input size (a conv net ending in a global pool), so it can be evaluated
        above its training size; a transformer is built for one (timm's img_size)."""
        return self.conv and "img_size" not in self.kwargs


MODELS: dict[str, ModelSpec] = {}


def register_model(name: str, *, sgd_lr: float, weight_decay: float, conv: bool = True):
    def decorator(build):
        if name in MODELS:
            raise ValueError(f"model {name!r} is registered twice")
        MODELS[name] = ModelSpec(name, build, sgd_lr, weight_decay, conv)
        return build
    return decorator
