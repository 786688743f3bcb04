"""The one check of a model whose shape comes from outside, before a byte of it is allocated.

A weights file's card (weights.py) and `--model-kwargs` (model_args.py) say which net to build
and with which arguments; a 7.9 MB file whose card said ResNet-50 with width_per_group=1024
would have made us allocate 3 G parameters (12 GB) before the tensors were even compared. So:

* the net is first built on the meta device (`net_on_meta`): shapes only, no memory, and any
  error its constructor raises (TypeError, ValueError, AssertionError, ...) is one line;
* its size is compared with what may hold it: the tensors in the weights file, key by key and
  shape by shape (`check_card_fits`), and for --model-kwargs the memory this machine has
  (`check_fits_memory`);
* only then is it built for real, with memory its file already holds (or the user asked for).

Random initialisation is skipped on meta tensors (`_SkipInitOnMeta`): it has no effect there,
and `normal_` on a meta tensor runs torch's Python decomposition, whose first use imports
torch._dynamo (+2.5 s for compact28 on the busy 2-core box; torchvision imports it anyway).
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from turbotrain.host import available_ram

from ..errors import TrainError

# In-place initialisers and the arithmetic init code does on a fresh tensor (timm's
# trunc_normal_: uniform_, erfinv_, mul_, add_, clamp_): on a meta tensor each returns it as it
# is, with its shape and dtype unchanged.
_DATA_ONLY_IN_PLACE = frozenset({
    "normal_", "uniform_", "fill_", "zero_", "erfinv_", "exponential_", "log_normal_",
    "cauchy_", "geometric_", "bernoulli_", "random_", "mul_", "add_", "sub_", "div_", "clamp_",
    "clamp_min_", "clamp_max_", "copy_", "abs_", "neg_", "sqrt_", "exp_", "log_", "fmod_"})


class _SkipInitOnMeta(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if (getattr(func, "__name__", None) in _DATA_ONLY_IN_PLACE and args
                and isinstance(args[0], torch.Tensor) and args[0].is_meta):
            return args[0]
        return func(*args, **(kwargs or {}))


def net_on_meta(name: str, build: Callable[[int], nn.Module], num_classes: int,
                where: str) -> nn.Module:
    """build(num_classes) on the meta device; whatever its constructor raises is one
    TrainError line starting with `where`."""
    try:
        # Quiet: a constructor's warnings about odd arguments ("Initializing zero-element
        # tensors is a no-op") would make a refusal more than one line.
        with torch.device("meta"), _SkipInitOnMeta(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return build(num_classes)
    except Exception as exc:  # noqa: BLE001 - a constructor may raise anything on bad arguments
        text = str(exc).strip()
        reason = text.splitlines()[0][:200] if text else type(exc).__name__
        raise TrainError(f"{where}: {name} refuses them ({type(exc).__name__}: {reason})"
                         ) from None


def elements(module: nn.Module) -> int:
    """Numbers in the module's parameters and buffers (what building it allocates)."""
    return sum(t.numel() for t in (*module.parameters(), *module.buffers()))


def check_fits_memory(name: str, net: nn.Module, where: str) -> None:
    """Its float32 weights alone must fit in the memory this process can still use (training
    needs 3-4x that: gradients, optimizer state, activations)."""
    need = elements(net) * 4
    available = available_ram()
    if need > available:
        raise TrainError(f"{where}: {name} would hold {elements(net):,} parameters "
                         f"({need / 2**30:,.1f} GiB), more than the {available / 2**30:,.1f} "
                         "GiB of memory available; choose smaller arguments")


# The stem's buffers (models.InputStem), in every Classifier's state beside the net's.
_STEM = {"stem.scale": (1, 3, 1, 1), "stem.shift": (1, 3, 1, 1)}


def check_card_fits(model: str, build: Callable[[int], nn.Module], num_classes: int,
                    shapes: dict[str, tuple[int, ...]], label: str) -> None:
    """The Classifier a card describes must hold exactly the tensors of its file, names and
    shapes (read from the safetensors header: nothing is allocated); TrainError otherwise."""
    net = net_on_meta(model, build, num_classes, f"{label}: its card's model_kwargs")
    expected = {**_STEM, **{f"net.{k}": tuple(v.shape) for k, v in net.state_dict().items()}}
    if expected == shapes:
        return
    missing = sorted(set(expected) - set(shapes))
    extra = sorted(set(shapes) - set(expected))
    wrong = sorted(k for k in set(expected) & set(shapes) if expected[k] != shapes[k])
    if wrong:
        k = wrong[0]
        detail = f"{k} is {list(shapes[k])} in the file, {list(expected[k])} in the model"
    elif missing:
        detail = f"the file lacks {missing[0]}" + (f" and {len(missing) - 1} more"
                                                   if len(missing) > 1 else "")
    else:
        detail = f"the file has {extra[0]}, which the model has not"
    raise TrainError(f"{label}: its weights do not fit model {model} with {num_classes:,} "
                     f"classes, as its card says ({detail}); nothing was built")
