"""Models by name: our small nets (nets.py), torchvision classifiers, and `timm:NAME`.

Every model is wrapped in a `Classifier` whose `InputStem` turns the pipeline's uint8 pixels into
normalised float on the device (4x fewer bytes cross the bus than float32), with the dataset's
mean/std as buffers, so a checkpoint carries its own normalisation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .errors import TrainError

# ImageNet's mean/std on the 0..255 scale: the stem's fallback when dataset.json has none.
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable[[int], nn.Module]  # num_classes -> net (input: normalised float)
    sgd_lr: float  # peak SGD learning rate per 256 images of global batch
    weight_decay: float  # SGD weight decay
    conv: bool = True  # channels_last helps


_MODELS: dict[str, ModelSpec] = {}

TIMM_PREFIX = "timm:"


def register_model(name: str, *, sgd_lr: float, weight_decay: float, conv: bool = True):
    def decorator(build):
        if name in _MODELS:
            raise ValueError(f"model {name!r} is registered twice")
        _MODELS[name] = ModelSpec(name, build, sgd_lr, weight_decay, conv)
        return build
    return decorator


def model_names() -> list[str]:
    """Our own nets (torchvision's and timm's names come on top; see `model_choices`)."""
    _register_builtin()
    return sorted(_MODELS)


def torchvision_model_names() -> list[str]:
    import torchvision
    return torchvision.models.list_models(module=torchvision.models)


def model_choices() -> str:
    """Every valid `--model` value, for an error message."""
    return (f"{', '.join(model_names())}; torchvision: {', '.join(torchvision_model_names())}; "
            f"or {TIMM_PREFIX}NAME with timm installed")


def get_model_spec(name: str) -> ModelSpec:
    _register_builtin()
    if name in _MODELS:
        return _MODELS[name]
    if name.startswith(TIMM_PREFIX):
        return _timm_spec(name[len(TIMM_PREFIX):])
    if name in torchvision_model_names():
        return _torchvision_spec(name)
    raise TrainError(f"unknown model {name!r}; choose one of: {model_choices()}")


def _torchvision_spec(name: str) -> ModelSpec:
    import torchvision

    def build(num_classes: int) -> nn.Module:
        extra = {}
        if name.startswith(("resnet", "resnext", "wide_resnet")):
            # Zero-init the last BN of each residual block: every block starts as the identity,
            # which lets the large-batch warm-up go faster (Goyal et al. 2017).
            extra["zero_init_residual"] = True
        return torchvision.models.get_model(name, weights=None, num_classes=num_classes, **extra)

    transformer = name.startswith(("vit_", "swin_"))
    # 0.1 per 256 images with SGD is torchvision's and Goyal et al.'s ResNet rate; 1e-4 decay.
    return ModelSpec(name, build, sgd_lr=0.1, weight_decay=1e-4, conv=not transformer)


def _timm_spec(timm_name: str) -> ModelSpec:
    try:
        import timm
    except ImportError:
        raise TrainError(f"model {TIMM_PREFIX}{timm_name} needs timm: pip install timm") from None
    if timm_name not in timm.list_models():
        raise TrainError(f"timm has no model {timm_name!r} (see timm.list_models())")

    def build(num_classes: int) -> nn.Module:
        return timm.create_model(timm_name, pretrained=False, num_classes=num_classes)

    conv = not timm_name.startswith(("vit", "deit", "swin", "beit", "eva"))
    return ModelSpec(TIMM_PREFIX + timm_name, build, sgd_lr=0.1, weight_decay=1e-4, conv=conv)


def _register_builtin() -> None:
    from . import nets  # noqa: F401  (registers resnet9, airbench, compact28)


class InputStem(nn.Module):
    """uint8 pixels (0..255) -> (x - mean) / std as float32, as one multiply-add on the device."""

    def __init__(self, mean=None, std=None):
        super().__init__()
        mean = torch.tensor(IMAGENET_MEAN if mean is None else mean, dtype=torch.float32)
        std = torch.tensor(IMAGENET_STD if std is None else std, dtype=torch.float32)
        self.register_buffer("scale", (1.0 / std).view(1, 3, 1, 1))
        self.register_buffer("shift", (-mean / std).view(1, 3, 1, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.shift, images.float(), self.scale)


class Classifier(nn.Module):
    def __init__(self, net: nn.Module, mean=None, std=None):
        super().__init__()
        self.stem = InputStem(mean, std)
        self.net = net

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(self.stem(images))

    @torch.no_grad()
    def data_init(self, images: torch.Tensor) -> bool:
        """Lets a net set weights from a first batch (airbench's whitening); True if it did."""
        if not hasattr(self.net, "data_init"):
            return False
        self.net.data_init(self.stem(images))
        return True


def build_model(spec: ModelSpec, num_classes: int, mean=None, std=None) -> Classifier:
    return Classifier(spec.build(num_classes), mean, std)


def auto_model(image_size: int, device_type: str) -> tuple[str, str]:
    """(model name, reason) for `--model auto`."""
    if image_size <= 28:
        return "compact28", f"{image_size} px images: the compact 28x28 net"
    if image_size <= 64:
        return "airbench", (f"{image_size} px images: the airbench net, 2.6x fewer FLOPs "
                            "than ResNet-9 for CIFAR-class accuracy")
    if device_type == "cuda":
        return "resnet50", f"{image_size} px images on CUDA: ResNet-50"
    return "resnet18", f"{image_size} px images on CPU: ResNet-18 (4.5x fewer FLOPs than -50)"
