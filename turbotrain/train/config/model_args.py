"""`--model-kwargs`: extra keyword arguments for the model's constructor, checked.

Two spellings: a JSON object (`'{"drop_rate": 0.1, "global_pool": "avg"}'`) or `k=v,k=v`
(`drop_rate=0.1,global_pool=avg`; each value is read as JSON when it parses, else kept as a
string). Values are single numbers, booleans, strings or null, or flat lists of them: enough for
the constructor arguments people set (drop rates, pooling, widths), and nothing that could name
code. The same check runs on a weights file's card (`weights.ModelCard.model_kwargs`), which
comes from whoever wrote the file.

This module imports no torch (config.validate calls it).
"""
from __future__ import annotations

import json
import math

from ..errors import TrainError

# Arguments turbotrain sets itself: the class count comes from the dataset, the weights from
# --pretrained / --init-from, timm's img_size from --image-size.
RESERVED = {"num_classes": "the dataset's class count", "pretrained": "--pretrained",
            "weights": "--pretrained", "img_size": "--image-size"}
MAX_ITEMS = 64  # a constructor takes a handful; a cap keeps a card from listing millions
MAX_TEXT = 4096
# A whole number or a float beyond +-2**31 is no width, depth, rate or size a constructor
# takes; 10**400 would raise OverflowError inside it. Whether the numbers in range make a model
# that fits is model_check's question (its parameter count, built on the meta device).
MAX_MAGNITUDE = 2**31


def parse_model_kwargs(text: str | None, where: str = "--model-kwargs") -> dict:
    """The keyword arguments in `text` (None or "" -> {}); TrainError naming `where`."""
    if text is None or not text.strip():
        return {}
    if len(text) > MAX_TEXT:
        raise TrainError(f"{where}: {len(text):,} characters; at most {MAX_TEXT:,}")
    text = text.strip()
    if text.startswith("{"):
        try:
            kwargs = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise TrainError(f"{where}: not valid JSON ({exc})") from None
    else:
        kwargs = {}
        for item in text.split(","):
            key, sep, raw = item.partition("=")
            if not sep:
                raise TrainError(f"{where}: {item.strip()!r} is not KEY=VALUE (write "
                                 "k=v,k=v or a JSON object)")
            kwargs[key.strip()] = _scalar(raw.strip())
    return check_model_kwargs(kwargs, where)


def _scalar(raw: str):
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def check_model_kwargs(kwargs, where: str) -> dict:
    """`kwargs` if it is a mapping of identifiers to plain values (see the module docstring)."""
    if not isinstance(kwargs, dict):
        raise TrainError(f"{where}: expected a mapping of argument names to values")
    if len(kwargs) > MAX_ITEMS:
        raise TrainError(f"{where}: {len(kwargs)} arguments; at most {MAX_ITEMS}")
    for key, value in kwargs.items():
        if not (isinstance(key, str) and key.isidentifier()):
            raise TrainError(f"{where}: {str(key)[:60]!r} is not an argument name")
        if key in RESERVED:
            raise TrainError(f"{where}: {key} is set by turbotrain ({RESERVED[key]})")
        items = value if isinstance(value, list) else [value]
        if len(items) > MAX_ITEMS or not all(_plain(v) for v in items):
            raise TrainError(f"{where}: {key} must be a number (at most {MAX_MAGNITUDE:,} "
                             "either way), boolean, string, null or a flat list of them")
    return kwargs


def _plain(value) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return math.isfinite(value) and abs(value) <= MAX_MAGNITUDE
    return value is None or isinstance(value, bool) or (
        isinstance(value, str) and len(value) <= 256)


def canonical(kwargs: dict) -> str | None:
    """The form saved in config.yaml (sorted JSON; None for none), which parses back the same."""
    return json.dumps(kwargs, sort_keys=True, separators=(",", ":")) if kwargs else None
