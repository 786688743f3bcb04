"""Models by name: our small nets (nets.py), torchvision classifiers, and `timm:NAME`.

Every model is wrapped in a `Classifier` whose `InputStem` turns the pipeline's uint8 pixels into
normalised float on the device (4x fewer bytes cross the bus than float32), with the dataset's
mean/std as buffers, so a checkpoint carries its own normalisation.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Callable

import torch
from torch import nn

from ...did_you_mean import closest
from ..errors import TrainError
from . import nets  # noqa: F401  (registers resnet9, airbench, compact28)
from .blurpool import MIN_CHANNELS, apply_blurpool
from .model_check import check_fits_memory, net_on_meta
# ModelSpec and register_model are re-exported: models.py is where callers look for them.
from .registry import MODELS, ModelSpec, register_model  # noqa: F401
from .timm_names import TIMM_PREFIX, check_timm_name, hub_offline

# ImageNet's mean/std on the 0..255 scale: the stem's fallback when dataset.json has none.
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def model_names() -> list[str]:
    """Our own nets (torchvision's and timm's names come on top; see `model_choices`)."""
    return sorted(MODELS)


def torchvision_model_names() -> list[str]:
    import torchvision
    return torchvision.models.list_models(module=torchvision.models)


def model_choices() -> str:
    """Every valid `--model` value, for an error message."""
    return (f"{', '.join(model_names())}; torchvision: {', '.join(torchvision_model_names())}; "
            f"or {TIMM_PREFIX}NAME with timm installed")


def unknown_model(name: str) -> str:
    """The one line for an unknown --model: the closest names when there are some (a typo:
    `resnet181`), else every choice."""
    close = closest(name, [*model_names(), *torchvision_model_names()])
    if close:
        return (f"unknown model {name!r}; did you mean {' or '.join(close)}? (or "
                f"{TIMM_PREFIX}NAME for a timm model)")
    return f"unknown model {name!r}; choose one of: {model_choices()}"


def get_model_spec(name: str, *, model_kwargs: dict | None = None,
                   image_size: int | None = None, where: str = "--model-kwargs",
                   blurpool: bool = False) -> ModelSpec:
    """The spec of model `name`; `model_kwargs` (checked by model_args) go to its constructor,
    and a timm model that takes `img_size` is built for `image_size`. Arguments the model does
    not take are one TrainError line starting with `where` (a card says its file). `blurpool`:
    the net is built with BlurPool (blurpool.py; a net with nothing to blur is refused)."""
    kwargs = dict(model_kwargs or {})
    if name in MODELS:
        spec = _own_spec(MODELS[name], kwargs, where)
    elif name.startswith(TIMM_PREFIX):
        spec = _timm_spec(name[len(TIMM_PREFIX):], kwargs, image_size, where)
    elif name in torchvision_model_names():
        spec = _torchvision_spec(name, kwargs, where)
    else:
        raise TrainError(unknown_model(name))
    return _with_blurpool(spec, where) if blurpool else spec


def _with_blurpool(spec: ModelSpec, where: str) -> ModelSpec:
    """`spec` building its net with BlurPool; checked on the meta device first, so that a net
    without a strided conv or max-pool (a ViT) is one line, not a silent no-op."""
    build = spec.build

    def blurred(num_classes: int) -> nn.Module:
        net = build(num_classes)
        apply_blurpool(net)
        return net
    if apply_blurpool(net_on_meta(spec.name, build, 2, where)) == 0:
        raise TrainError(f"--blurpool: model {spec.name} has no strided conv (with "
                         f"{MIN_CHANNELS}+ input channels) or strided max-pool to blur; "
                         "leave --blurpool out")
    return dataclasses.replace(spec, build=blurred)


def _own_spec(spec: ModelSpec, kwargs: dict, where: str) -> ModelSpec:
    if not kwargs:
        return spec
    takes = [p for p in inspect.signature(spec.build).parameters if p != "num_classes"]
    unknown = sorted(set(kwargs) - set(takes))
    if unknown:
        raise TrainError(f"{where}: {spec.name} takes "
                         f"{', '.join(takes) if takes else 'no keyword arguments'}, not "
                         f"{', '.join(unknown)}")
    build = spec.build
    _try_on_meta(spec.name, lambda n: build(n, **kwargs), where)
    return dataclasses.replace(spec, build=lambda n: build(n, **kwargs), kwargs=kwargs)


def _try_on_meta(name: str, build: Callable[[int], nn.Module], where: str) -> None:
    """Builds the net on the meta device (no memory, ~0.1 s for a ViT-B) so that arguments it
    refuses fail now, in one line, rather than later inside the batch finder, and arguments
    that would make it larger than this machine's memory are refused before it exists
    (model_check.py: the one check of every card and --model-kwargs)."""
    net = net_on_meta(name, build, 2, where)
    check_fits_memory(name, net, where)


def _torchvision_spec(name: str, kwargs: dict, where: str) -> ModelSpec:
    import torchvision

    def build(num_classes: int) -> nn.Module:
        extra = {}
        if name.startswith(("resnet", "resnext", "wide_resnet")):
            # Zero-init the last BN of each residual block: every block starts as the identity,
            # which lets the large-batch warm-up go faster (Goyal et al. 2017).
            extra["zero_init_residual"] = True
        return torchvision.models.get_model(name, weights=None, num_classes=num_classes,
                                            **{**extra, **kwargs})

    if kwargs:
        _try_on_meta(name, build, where)
    transformer = name.startswith(("vit_", "swin_"))
    # 0.1 per 256 images with SGD is torchvision's and Goyal et al.'s ResNet rate; 1e-4 decay.
    return ModelSpec(name, build, sgd_lr=0.1, weight_decay=1e-4, conv=not transformer,
                     family="torchvision", kwargs=kwargs)


def _timm_spec(timm_name: str, kwargs: dict, image_size: int | None,
               where: str) -> ModelSpec:
    try:
        import timm
    except ImportError:
        raise TrainError(f"model {TIMM_PREFIX}{timm_name} needs timm: pip install timm") from None
    arch = check_timm_name(timm, timm_name)  # resnet18, resnet18.a1_in1k, hf-hub:..., ...
    name = TIMM_PREFIX + timm_name

    def builder(extra: dict) -> Callable[[int], nn.Module]:
        def build(n: int) -> nn.Module:
            with hub_offline() as hub:  # an hf-hub: model's config.json: from the cache
                try:
                    return timm.create_model(timm_name, pretrained=False, num_classes=n, **extra)
                except OSError as exc:  # huggingface_hub's LocalEntryNotFoundError
                    cache = getattr(hub, "HF_HUB_CACHE", "the Hugging Face cache")
                    raise TrainError(f"--model {name}: its config is not in the Hugging Face "
                                     f"cache {cache}; fetch it once where there is a network "
                                     f"(huggingface-cli download {timm_name.split(':', 1)[-1]}) "
                                     f"and copy that folder here, or set HF_HOME") from None
        return build

    note = ""
    if image_size is not None:
        # Transformers (ViT, DeiT, Swin, ...) size their position embeddings and patch grid
        # for img_size, 224 by default: a 32 px image would fail the patch embedding's size
        # check. Conv nets end in a global pool and take no img_size; any size runs.
        sized = {**kwargs, "img_size": image_size}
        try:
            with torch.device("meta"):
                builder(sized)(2)
            kwargs, note = sized, f"built with img_size={image_size}, the run's image size"
        except TrainError:
            raise
        except TypeError as exc:
            if "img_size" not in str(exc):
                raise TrainError(f"{where}: {name} refuses them ({exc})") from None
            note = (f"{name} takes no img_size (a conv net with a global pool: it runs at "
                    "any size)")
        except Exception as exc:  # noqa: BLE001 - ValueError, AssertionError, ...: one line
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TrainError(f"{name} cannot be built for {image_size} px images ({reason}); "
                             "choose another --image-size") from None
    if kwargs:  # (with img_size: built above; this also bounds its size)
        _try_on_meta(name, builder(kwargs), where)
    conv = not arch.startswith(("vit", "deit", "swin", "beit", "eva"))
    return ModelSpec(name, builder(kwargs), sgd_lr=0.1, weight_decay=1e-4, conv=conv,
                     family="timm", kwargs=kwargs, note=note)


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


class GlobalMaxPool(nn.Module):
    """AdaptiveMaxPool2d(1) as a max-pool whose kernel is the whole map: the same values and
    the same gradients (one arg-max per channel), but a deterministic CUDA backward, which
    adaptive_max_pool2d lacks (it scatters with atomics)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.max_pool2d(x, kernel_size=x.shape[-2:])


class GlobalAvgPool(nn.Module):
    """AdaptiveAvgPool2d(1) as a mean over H and W (its backward is a broadcast)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3), keepdim=True)


def deterministic_global_pools(model: nn.Module) -> int:
    """Swaps every AdaptiveMaxPool2d(1) / AdaptiveAvgPool2d(1) for GlobalMaxPool /
    GlobalAvgPool in place; returns how many. For `--deterministic` on CUDA, where the adaptive
    pools' backward raises under torch.use_deterministic_algorithms (our small nets end in a
    global max-pool, torchvision's ResNets in a global average). The swapped modules hold no
    weights, so checkpoints are unchanged; other runs keep the adaptive pools, measured faster
    on the CPU (compact28's pool + backward: 0.5 ms adaptive vs 2.6 ms max_pool2d, bf16)."""
    swaps = {nn.AdaptiveMaxPool2d: GlobalMaxPool, nn.AdaptiveAvgPool2d: GlobalAvgPool}
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            size = getattr(child, "output_size", None)
            if type(child) in swaps and size in (1, (1, 1)):
                setattr(parent, name, swaps[type(child)]())
                count += 1
    return count


def build_model(spec: ModelSpec, num_classes: int, mean=None, std=None) -> Classifier:
    return Classifier(spec.build(num_classes), mean, std)
