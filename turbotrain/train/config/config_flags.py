"""TrainConfig as text: one `train` flag per field, and each setting's value parsed from text.

`add_config_arguments` generates the flags from the dataclass (its help, group and choices
metadata): `--flag/--no-flag` for booleans, two numbers `LO HI` (nargs=2) for pairs, `--resume`
with an optional `auto`, and a type parser for the rest. `parse_value` turns a flag's text or
a YAML scalar into the field's type, so a setting is checked the same way wherever it comes
from (flags, `--config FILE.yaml`, the run's saved config.yaml; see config_files.py).

This module imports no torch, so building the parser for `--help` stays cheap.
"""
from __future__ import annotations

import argparse

from ..errors import TrainError
from .config import AUTO, FIELDS, field_type
from .duration import DurationError, parse_duration

# Argument groups in the order `--help` shows them.
GROUPS = {
    "data": "Data and pipeline",
    "model": "Model",
    "weights": "Starting from weights (fine-tuning)",
    "optim": "Optimisation",
    "augment": "Augmentation and regularisation (off or torchvision's ranges by default)",
    "resolution": "Progressive resizing (the training size by epoch)",
    "eval": "Evaluation (test-time resolution and flip augmentation)",
    "runtime": "Device, precision and threads",
    "dist": "Several processes (under torchrun)",
    "run": "Run folder, checkpoints and logging",
}
# Flags whose value is not shown well by its type's name.
METAVARS = {"time_budget": "DURATION", "target_accuracy": "A", "min_res": "PX",
            "max_res": "PX", "eval_res": "PX", "aa": "POLICY", "color_jitter": "F",
            "reprob": "P", "recount": "N"}
PAIR_METAVARS = {"res_ramp": ("START", "END")}


# ---------------------------------------------------------------------------- values

def _parse_pair(flag: str, raw) -> tuple[float, float]:
    """Two numbers from a YAML list, a tuple or a string "LO HI" (or "LO,HI")."""
    items = raw.replace(",", " ").split() if isinstance(raw, str) else raw
    if isinstance(items, (list, tuple)) and len(items) == 2 and all(
            isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in items):
        try:
            return float(items[0]), float(items[1])
        except ValueError:
            pass
    # Never repr a list: YAML aliases can nest it into billions of items.
    got = f", got {raw!r:.80}" if isinstance(raw, str) else ""
    raise TrainError(f"{flag}: expected two numbers LO HI{got}")


def _parse_resume(raw) -> bool | str:
    """--resume: True (the flag alone), "auto", or a YAML boolean."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).lower()
    if text == AUTO:
        return AUTO
    if text in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return text in ("true", "yes", "on", "1")
    raise TrainError(f"--resume: expected no value or auto, got {str(raw)[:80]!r}")


def _says_none(name: str, raw) -> bool:
    """`none` for a setting whose default is none (--target-accuracy none, --time-budget
    none): how a --resume drops one that the saved run has."""
    return (isinstance(raw, str) and raw.lower() == "none"
            and FIELDS[name].metadata["shown"] == "none")


def parse_value(name: str, raw):
    """One setting's value from a flag string or a YAML scalar; TrainError says what is wrong."""
    if name == "resume":
        return _parse_resume(raw)
    if _says_none(name, raw):
        return None
    if name == "time_budget" and raw is not None and str(raw).lower() != AUTO:
        try:
            return parse_duration(raw)
        except DurationError as exc:
            raise TrainError(str(exc)) from None
    kind, nullable = field_type(name)
    flag = "--" + name.replace("_", "-")
    if raw is None or (nullable and isinstance(raw, str) and raw.lower() == AUTO):
        if nullable:
            return None
        raise TrainError(f"{flag} needs a value")
    if kind is tuple:
        return _parse_pair(flag, raw)
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


# ---------------------------------------------------------------------------- argparse

def add_config_arguments(parser: argparse.ArgumentParser, *, pipeline_choices=None,
                         model_help: str = "") -> None:
    """One flag per TrainConfig field, grouped. Defaults are SUPPRESSed so that the Namespace
    holds only the flags actually given, which lets YAML and saved settings sit underneath."""
    groups = {key: parser.add_argument_group(title) for key, title in GROUPS.items()}
    for name, f in FIELDS.items():
        kind, nullable = field_type(name)
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
        if name == "resume":  # a flag with an optional value: --resume, --resume auto
            kwargs.update(nargs="?", const=True, type=_flag_parser(name), metavar="auto")
            groups[f.metadata["group"]].add_argument(
                "--no-resume", dest=name, action="store_const", const=False,
                default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        elif kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif kind is tuple:
            kwargs.update(nargs=2, type=float, metavar=PAIR_METAVARS.get(name, ("LO", "HI")))
        else:
            choices = f.metadata["choices"]
            if name == "pipeline" and pipeline_choices is not None:
                choices = (AUTO, *pipeline_choices)
            if choices:
                kwargs["choices"] = choices
            else:
                kwargs["type"] = _flag_parser(name)
                kwargs["metavar"] = METAVARS.get(name) or (
                    name.upper() if kind is str else kind.__name__.upper())
        groups[f.metadata["group"]].add_argument(flag, *f.metadata["aliases"], **kwargs)


def _flag_parser(name: str):
    def parse(text: str):
        try:
            return parse_value(name, text)
        except TrainError as exc:
            raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None
    parse.__name__ = field_type(name)[0].__name__  # argparse's "invalid int value"
    return parse
