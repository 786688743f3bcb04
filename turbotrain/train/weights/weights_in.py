"""Where a fine-tuning run's first weights come from, read without running code.

* `--pretrained`: the model's published weights. torchvision's named DEFAULT weights, read from
  torch's hub cache (`torch.hub.get_dir()/checkpoints/<file name of weights.url>`, TORCH_HOME
  moves it); timm's weights for `timm:NAME` (its default, or the tag's: `timm:resnet18.a1_in1k`),
  loaded by timm from the Hugging Face cache with the hub set offline. Nothing is downloaded
  unless `--download` says so: a file that is not there is one line saying where it must go,
  and that `--download` fetches it (torchvision's file checked against the hash in its name).
* `--init-from SOURCE`: a turbotrain run folder (its best.safetensors, else final.safetensors),
  a `.safetensors` file (ours, with a card, or a plain state_dict one), or a state_dict saved
  with `torch.save` (any other name).

A `.pt` file is a pickle, which may ask to call any function while it loads, so it gets the
checks `--resume` gives a checkpoint (checkpoint.py): a regular file, a zip of stored entries
that fit in it, then `torch.load(weights_only=True)`, which refuses every global but tensors and
containers. safetensors files hold tensors and a JSON header only.
"""
from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
from torch import nn

from turbotrain.files.untrusted import UnsafeInput, open_regular
from turbotrain.printable import printable

from ..errors import TrainError
from ..models.models import IMAGENET_MEAN, IMAGENET_STD, TIMM_PREFIX, ModelSpec, hub_offline
from ..records import checkpoint as ckpt
from .weights import BEST_NAME, FINAL_NAME, ModelCard, read_safetensors, run_weights

LOAD_ERRORS = (RuntimeError, EOFError, OSError, ValueError, TypeError, KeyError, IndexError,
               AttributeError, OverflowError, MemoryError)


@dataclass
class Start:
    """Weights to start from, as read; finetune.py puts them into the model."""
    what: str                               # for the decision line
    state: dict[str, torch.Tensor] | None   # keys as in Classifier.net; None when `net` is set
    mean: tuple | None = None               # the input normalisation they expect (0..255);
    std: tuple | None = None                # None: the dataset's own
    norm: str = ""                          # why that normalisation
    classes: tuple[str, ...] | None = None  # their class names, when known
    num_classes: int | None = None          # their head's size, when known
    net: nn.Module | None = None            # timm --pretrained: the net with its weights loaded
    card: ModelCard | None = None
    flag: str = "--init-from"               # the flag that named them, for error lines


# ---------------------------------------------------------------------------- --init-from

def init_card(source: str) -> ModelCard | None:
    """The card of --init-from when it is a turbotrain run or weights file (for --model auto
    and --image-size auto), without reading the tensors; None for plain weights."""
    path = _source_file(source)
    if path.suffix != ".safetensors":
        return None
    return read_safetensors(path, f"--init-from {printable(str(path))}", tensors=False)[1]


def _source_file(source: str) -> Path:
    """--init-from's file: a run folder's best.safetensors, else its final.safetensors."""
    try:
        return run_weights(source)
    except TrainError:
        raise TrainError(f"--init-from {printable(source)}: the folder holds no "
                         f"{BEST_NAME} or {FINAL_NAME} (a run writes them as it evaluates "
                         "and when it ends)") from None


def init_start(source: str) -> Start:
    path = _source_file(source)
    shown = printable(str(path))
    if path.suffix == ".safetensors":
        state, card = read_safetensors(path, f"--init-from {shown}")
    else:
        state, card = load_state_file(path, "--init-from"), None
    if card is not None:
        info = card.info
        when = f", step {info['step']}" if isinstance(info.get("step"), int) else ""
        return Start(what=f"{shown} ({card.model}{when})", state=_net_state(state, path),
                     mean=card.mean, std=card.std, classes=card.classes,
                     num_classes=card.num_classes, card=card,
                     norm="the source run's own mean/std (its card)")
    return Start(what=f"{shown} (a plain state_dict)", state=_net_state(state, path))


def load_state_file(path: Path, flag: str) -> dict[str, torch.Tensor]:
    """The state_dict in a torch.save file, with the checks the module docstring lists."""
    shown = printable(str(path))
    try:
        f = open_regular(path)
    except FileNotFoundError:
        raise TrainError(f"{flag} {shown}: no such file") from None
    except UnsafeInput as exc:
        raise TrainError(f"{flag} {shown} {exc}; refusing to read it") from None
    except OSError as exc:
        raise TrainError(f"{flag} {shown}: cannot read it ({exc.strerror})") from None
    with f:
        problem = ckpt.stored_zip_problem(f)
        if problem is not None:
            raise TrainError(f"{flag} {shown}: {problem} (expected a state_dict written by "
                             "torch.save, or a .safetensors file)")
        f.seek(0)
        try:
            loaded = torch.load(f, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            wanted = ckpt._forbidden_global(str(exc))
            if wanted is not None:
                raise TrainError(f"{flag} {shown} asks to run code ({wanted}) when loaded; "
                                 "refusing it (weights are loaded with weights_only=True)"
                                 ) from None
            raise TrainError(f"{flag} {shown}: not a readable state_dict "
                             f"({ckpt._torch_reason(exc)})") from None
        except LOAD_ERRORS as exc:
            raise TrainError(f"{flag} {shown}: not a readable state_dict "
                             f"({ckpt._torch_reason(exc)})") from None
    return _state_dict_in(loaded, shown, flag)


def _state_dict_in(loaded, shown: str, flag: str) -> dict[str, torch.Tensor]:
    """A mapping of names to tensors: the file itself, or the one under a usual key (a
    turbotrain checkpoint's "model", a training script's "state_dict")."""
    def tensors_only(value) -> bool:
        return isinstance(value, dict) and bool(value) and all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items())
    if tensors_only(loaded):
        return loaded
    if isinstance(loaded, dict):
        for key in ("state_dict", "model", "model_state_dict", "module"):
            if tensors_only(loaded.get(key)):
                return loaded[key]
    raise TrainError(f"{flag} {shown}: holds no state_dict (a mapping of names to tensors)")


def _net_state(state: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """Keys as in Classifier.net: DDP's `module.` and torch.compile's `_orig_mod.` prefixes are
    dropped, and so is our `net.` (with the `stem.` buffers: the normalisation comes from the
    card, or is the dataset's). A torchvision or timm state_dict already has the net's keys."""
    for prefix in ("module.", "_orig_mod."):
        if state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items()}
    if any(k.startswith("net.") for k in state) and all(
            k.startswith(("net.", "stem.")) for k in state):
        state = {k[4:]: v for k, v in state.items() if k.startswith("net.")}
    if not state:
        raise TrainError(f"--init-from {printable(str(path))}: holds no tensors")
    return state


def source_classes(config, spec: ModelSpec) -> tuple[int | None, tuple[str, ...] | None]:
    """(class count, class names) the starting weights were trained for, as far as known
    without reading them: a run's card has both, published weights their count (their names
    are ImageNet's, never a dataset's folder names); a plain state_dict neither."""
    if config.init_from is not None:
        card = init_card(config.init_from)
        return (card.num_classes, card.classes) if card is not None else (None, None)
    if spec.family == "torchvision":
        import torchvision
        try:
            weights = torchvision.models.get_model_weights(spec.name).DEFAULT
        except (ValueError, KeyError, AttributeError):
            return None, None  # start_model says there are none
        return len(weights.meta.get("categories") or ()) or None, None
    if spec.family == "timm":
        import timm
        cfg = timm.models.get_pretrained_cfg(spec.name[len(TIMM_PREFIX):])
        return getattr(cfg, "num_classes", None), None
    return None, None


# ---------------------------------------------------------------------------- --pretrained

def pretrained_start(spec: ModelSpec, num_classes: int, *, download: bool = False) -> Start:
    """--pretrained's weights from the cache; with `download`, fetched into it when missing."""
    if spec.family == "torchvision":
        return _torchvision_start(spec, download)
    if spec.family == "timm":
        return _timm_start(spec, num_classes, download)
    raise TrainError(f"--pretrained: {spec.name} has no published weights (torchvision and "
                     f"timm models do, e.g. --model resnet18 or --model {TIMM_PREFIX}resnet18); "
                     "to start from a run of yours, pass --init-from RUNDIR")


def _hub_file(url: str) -> Path:
    """Where torch.hub.load_state_dict_from_url keeps `url`'s file (TORCH_HOME moves it)."""
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(url).path)


def _download(url: str, path: Path) -> None:
    """`url` into the hub cache at `path`, checked against the hash prefix in its name (as
    torch.hub's check_hash does); a network or disk failure is one TrainError line."""
    found = torch.hub.HASH_REGEX.search(path.name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.hub.download_url_to_file(url, str(path), found.group(1) if found else None,
                                       progress=False)
    except (OSError, RuntimeError) as exc:  # URLError is an OSError; a bad hash RuntimeError
        reason = str(getattr(exc, "reason", None) or exc).strip().splitlines()
        raise TrainError(f"--download: cannot fetch {url} ({reason[0][:200] if reason else ''}"
                         f"); download it where there is a network and copy it to {path}"
                         ) from None


def _torchvision_start(spec: ModelSpec, download: bool) -> Start:
    import torchvision
    try:
        weights = torchvision.models.get_model_weights(spec.name).DEFAULT
    except (ValueError, KeyError, AttributeError):
        raise TrainError(f"--pretrained: torchvision publishes no weights for {spec.name}"
                         ) from None
    path = _hub_file(weights.url)
    if not os.path.lexists(path) and download:
        _download(weights.url, path)
    if not os.path.lexists(path):
        raise TrainError(f"--pretrained: {spec.name}'s weights are not in the cache; add "
                         f"--download to fetch them, or download {weights.url} to {path} "
                         f"(or set TORCH_HOME)")
    categories = weights.meta.get("categories") or None
    return Start(what=f"torchvision's {weights} ({path.name})", flag="--pretrained",
                 state=load_state_file(path, "--pretrained"),
                 mean=IMAGENET_MEAN, std=IMAGENET_STD,
                 norm="ImageNet's mean/std, as torchvision's weights expect",
                 classes=tuple(categories) if categories else None,
                 num_classes=len(categories) if categories else None)


def _timm_start(spec: ModelSpec, num_classes: int, download: bool) -> Start:
    import timm
    timm_name = spec.name[len(TIMM_PREFIX):]
    cfg = timm.models.get_pretrained_cfg(timm_name)
    hub_id, url = getattr(cfg, "hf_hub_id", None), getattr(cfg, "url", None)
    if cfg is None or not (hub_id or url):
        raise TrainError(f"--pretrained: timm publishes no weights for {spec.name}")
    if not hub_id and not os.path.lexists(_hub_file(url)) and download:
        _download(url, _hub_file(url))
    if not hub_id and not os.path.lexists(_hub_file(url)):
        raise TrainError(f"--pretrained: {spec.name}'s weights are not in the cache; add "
                         f"--download to fetch them, or download {url} to {_hub_file(url)} "
                         f"(or set TORCH_HOME)")
    with hub_offline(not download) as hub:
        try:
            net = timm.create_model(timm_name, pretrained=True, num_classes=num_classes,
                                    **spec.kwargs)
        except (FileNotFoundError, OSError) as exc:
            # huggingface_hub's LocalEntryNotFoundError (an OSError): not in the cache.
            cache = getattr(hub, "HF_HUB_CACHE", "the Hugging Face cache")
            fetch = (f"fetch them once where there is a network (huggingface-cli download "
                     f"{hub_id}) and copy that folder here, or set HF_HOME")
            if download:
                raise TrainError(f"--download: cannot fetch {spec.name}'s weights ({hub_id}) "
                                 f"into {cache} ({type(exc).__name__}); {fetch}") from None
            raise TrainError(f"--pretrained: {spec.name}'s weights ({hub_id or url}) are not in "
                             f"the Hugging Face cache {cache}; add --download, or {fetch} "
                             f"({type(exc).__name__})") from None
        except (RuntimeError, ValueError, AssertionError) as exc:
            reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            raise TrainError(f"--pretrained: {spec.name}'s weights do not fit the model built "
                             f"with {spec.kwargs or 'its defaults'} ({reason})") from None
    used = getattr(net, "pretrained_cfg", {}) or {}
    mean = tuple(255.0 * m for m in used.get("mean", (0.485, 0.456, 0.406)))
    std = tuple(255.0 * s for s in used.get("std", (0.229, 0.224, 0.225)))
    imagenet = mean == IMAGENET_MEAN and std == IMAGENET_STD
    return Start(what=f"timm's {hub_id or url}", state=None, net=net, mean=mean, std=std,
                 flag="--pretrained",
                 norm=("ImageNet's mean/std, as timm's weights expect" if imagenet else
                       "the mean/std timm's weights were trained with (their pretrained_cfg)"),
                 num_classes=used.get("num_classes"))
