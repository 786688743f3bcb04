"""TrainConfig on disk: YAML settings files, and the layering that builds a run's config.

Settings layer, later wins: the dataclass defaults, the run's saved `config.yaml` (with
`--resume`), the `--config FILE.yaml`, then the flags given on the command line
(`config_from_namespace`). Keys are the flag names; each value is checked as its flag is
(config_flags.parse_value). A run saves its resolved settings in RUNDIR/config.yaml
(`save_yaml`, called by builder.py), so a saved config reruns as is.

This module imports no torch, so building the parser for `--help` stays cheap.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import yaml

from turbotrain.files.safe_create import write_file
from turbotrain.files.untrusted import UnsafeInput, read_regular

from ..errors import TrainError
from .config import AUTO, FIELDS, PAIRS, TrainConfig
from .config_flags import parse_value
from .duration import BUDGET_MAX_EPOCHS

# A config file is a few hundred bytes; a cap keeps a huge or endless one from being read whole.
MAX_CONFIG_BYTES = 16 << 20


def read_yaml(path: Path):
    """What a YAML settings file holds, read the one way every config file is (`--config`, a
    run's config.yaml for --resume, eval, predict and export): a regular file only (a named
    pipe would block the read forever), at most MAX_CONFIG_BYTES, `yaml.safe_load` (no tags
    that build objects). Whatever the file does wrong is one TrainError line naming it: a
    5,000-digit integer (ValueError from int()), nesting 200,000 deep (RecursionError in
    PyYAML's composer), or a structure too large for memory."""
    try:
        data = read_regular(path, MAX_CONFIG_BYTES)
    except UnsafeInput as exc:
        raise TrainError(f"config {path} {exc}") from None
    except OSError as exc:
        raise TrainError(f"cannot read config {path}: {exc.strerror}") from None
    try:
        return yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise TrainError(f"config {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    except ValueError as exc:  # int() of more than 4,300 digits
        raise TrainError(f"config {path} is not valid YAML: {str(exc).split(';')[0]}") from None
    except (RecursionError, MemoryError):
        raise TrainError(f"config {path} is not valid YAML: nested too deeply or too large "
                         "to read") from None


def load_yaml(path: str | os.PathLike) -> dict:
    """The settings in a YAML file, validated; keys may be written `batch-size` or `batch_size`."""
    path = Path(path)
    loaded = read_yaml(path)
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
        pair = name in PAIRS and isinstance(raw, list) and len(raw) == 2  # checked by parse_value
        if not pair and not isinstance(raw, (str, int, float, bool, type(None))):
            # Never str() a list or mapping: YAML aliases nest them into billions of items.
            raise TrainError(f"config {path}: {key} must be a single value, not a "
                             f"{type(raw).__name__}")
        settings[name] = parse_value(name, raw)
    return settings


def save_yaml(config: TrainConfig, path: str | os.PathLike, *,
              budget_sized: tuple[str, ...] = ()) -> None:
    """Writes the run's settings as YAML readable by `--config`; auto values must be resolved,
    except `budget_sized` (plan.Plan.budget_sized): the settings --time-budget sizes during the
    run are left out, with a comment saying so, so that `--config RUN/config.yaml` (and
    --resume) sizes them again from the budget: what reproduces the run is the budget, not the
    placeholders planned before it timed a step. Written beside and renamed over `path`: a
    symlink there is replaced, not written through."""
    data = {name.replace("_", "-"): value for name, value in config.to_saved_dict().items()
            if name not in budget_sized}
    header = ""
    if budget_sized:
        names = " and ".join(name.replace("_", "-") for name in budget_sized)
        header = (f"# {names}: left to --time-budget, which sizes them after timing the "
                  "first steps\n# (the run's own: summary.json's steps and decisions)\n")
    write_file(path, header + yaml.safe_dump(data, sort_keys=False))


# What a run saved before a setting existed did instead: resuming it must not switch to what
# `auto` would pick now (a split over half the RAM would go quasi-random mid-run).
BEFORE_IT_EXISTED = {"order": "random", "progressive": False}
# Settings that are one value in two units: a layer that sets one drops the other from the
# layers below it (a resumed run's saved warmup-steps under a --warmup-epochs flag).
SAME_SETTING = (("warmup_steps", "warmup_epochs"),)


def _layer(below: dict, above: dict) -> dict:
    """`above` over `below`, SAME_SETTING pairs taken whole from the layer that sets one."""
    below = dict(below)
    for pair in SAME_SETTING:
        if any(name in above for name in pair):
            for name in pair:
                below.pop(name, None)
    return {**below, **above}


def config_from_namespace(args: argparse.Namespace) -> TrainConfig:
    """Defaults <- RUNDIR/config.yaml (with --resume) <- --config FILE <- the given flags."""
    return config_and_sources(args)[0]


def config_and_sources(args: argparse.Namespace) -> tuple[TrainConfig, dict[str, str]]:
    """`config_from_namespace`'s config, and where each setting a layer set came from, as the
    run's decision lines say it in place of "asked for" (plan.decision.labelled): on --resume
    every setting is in the saved config.yaml, so "asked for" once named the plan's old
    choices as the user's. Only with a file or a saved run under the flags; {} otherwise."""
    given = {name: getattr(args, name) for name in FIELDS if hasattr(args, name)}
    from_file = load_yaml(given["config"]) if given.get("config") else {}
    requested = _layer(from_file, given)
    saved, saved_path = {}, None
    resume = requested.get("resume")
    if resume:
        if not requested.get("out"):
            raise TrainError(f"--resume{' auto' if resume == AUTO else ''} needs --out RUNDIR "
                             "(the run to continue)")
        saved_path = Path(requested["out"]) / "config.yaml"
        # --resume auto continues only a run that has a checkpoint (checkpoint.CHECKPOINT_NAME;
        # that module imports torch); without one it starts a new run (builder.py says so).
        if resume is True or os.path.lexists(Path(requested["out"]) / "checkpoint.pt"):
            if not os.path.lexists(saved_path):  # anything else: load_yaml says what it is
                raise TrainError(f"--resume: no run to continue in {requested['out']} "
                                 "(no config.yaml there)")
            saved = {**BEFORE_IT_EXISTED, **load_yaml(saved_path)}
    if ("epochs" in requested or "max_steps" in requested) and "early_stop" not in requested:
        # A length given now is the length: the saved run's automatic early stop is not kept.
        saved.pop("early_stop", None)
    settings = _layer(saved, requested)
    if settings.get("time_budget") is not None and "epochs" not in settings:
        # The budget decides the run's length (budget.fit_budget); --epochs, when given, caps it.
        settings["epochs"] = BUDGET_MAX_EPOCHS
    config = TrainConfig(**settings)
    config.validate()
    sources = {}
    if saved or from_file:
        sources.update({name: f"kept from the saved run ({saved_path})" for name in saved})
        sources.update({name: f"from --config {given['config']}" for name in from_file})
        sources.update({name: "asked for in this command" for name in given})
    return config, sources
