"""`--model timm:NAME`: the names `timm.create_model` takes, checked before anything is built.

timm names a model four ways: an architecture (`resnet18`), an architecture with a weights tag
(`resnet18.a1_in1k`: the tag picks the weights and their pretrained_cfg: mean/std, input size),
and a source prefix: `hf-hub:timm/resnet18.a1_in1k` (a model card on the Hugging Face hub) or
`local-dir:/path` (a folder with its config.json). `timm.list_models()` lists architectures
only, so checking a name against it refused the tagged names that timm (and our own
`--pretrained` message, which names the hub id) uses; `check_timm_name` checks each form as
create_model reads it, and says what is wrong in one line.

A hub source is read from the Hugging Face cache only (`hub_offline`): nothing is downloaded
without being asked for, and a missing config fails at once instead of after huggingface_hub's
retries (~25 s without a network).
"""
from __future__ import annotations

import contextlib
import os

from ..errors import TrainError

TIMM_PREFIX = "timm:"
SOURCES = ("hf-hub", "local-dir")  # timm's source prefixes (timm.models.parse_model_name)
TAGS_SHOWN = 8


def check_timm_name(timm, timm_name: str) -> str:
    """The architecture that `timm_name` builds (for a source: the name after its prefix);
    TrainError when timm would refuse the name."""
    from timm.models import parse_model_name, split_model_name_tag
    shown = TIMM_PREFIX + timm_name
    try:
        source, name = parse_model_name(timm_name)
    except ValueError as exc:  # "timm/resnet18" without hf-hub:
        raise TrainError(f"--model {shown}: {exc}") from None
    if source:
        if source not in SOURCES:
            raise TrainError(f"--model {shown}: timm reads models from {', '.join(SOURCES)} "
                             f"sources, not {source!r}")
        if source == "local-dir" and not os.path.isfile(os.path.join(name, "config.json")):
            raise TrainError(f"--model {shown}: no config.json in {name}")
        return name.rstrip("/").rsplit("/", 1)[-1]
    arch, tag = split_model_name_tag(name)
    if not timm.is_model(arch):
        raise TrainError(f"timm has no model {arch!r} (see timm.list_models())")
    if tag:
        tags = [n.split(".", 1)[1] for n in timm.list_pretrained(f"{arch}.*")]
        if tag not in tags:
            listed = ", ".join(tags[:TAGS_SHOWN]) + (", ..." if len(tags) > TAGS_SHOWN else "")
            raise TrainError(f"timm's {arch} has no weights tag {tag!r}; "
                             + (f"its tags: {listed}" if tags else "it has no tagged weights"))
    return arch


@contextlib.contextmanager
def hub_offline(offline: bool = True):
    """The Hugging Face hub in offline mode: its cache only, never the network. The library
    reads HF_HUB_OFFLINE when it is imported (timm imports it), so its constant is set too.
    Yields huggingface_hub.constants (None without it); `offline=False` changes nothing
    (`--download`)."""
    if not offline:
        constants = None
        with contextlib.suppress(ImportError):
            from huggingface_hub import constants
        yield constants
        return
    previous_env = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants = None
    with contextlib.suppress(ImportError):
        from huggingface_hub import constants
    previous = getattr(constants, "HF_HUB_OFFLINE", None)
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
    try:
        yield constants
    finally:
        if constants is not None:
            constants.HF_HUB_OFFLINE = previous
        if previous_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = previous_env
