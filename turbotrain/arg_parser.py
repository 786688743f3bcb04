"""`CommandParser`: the argparse parser of every turbotrain command.

Two things argparse does by default that a user pays for:

* prefix abbreviations: `train --epoch 2`, `--opt adamw`, `--sched linear` silently meant
  --epochs, --optimizer, --schedule; a typo that happens to be a prefix started a full run.
  Every parser here is built with `allow_abbrev=False` (tests/test_arg_parser.py checks every
  `ArgumentParser(` in the repository), so only whole flags are read;
* an unknown flag after a subcommand is reported by the top-level parser, with its usage
  (`turbotrain [-h] [--version] COMMAND ...`) and no hint. Here the subcommand's own parser
  refuses it, with its usage and, per unknown flag, what to type instead (`hint`): a flag of
  another trainer (timm, torchvision's references, Lightning) that means something of ours
  (FOREIGN), a snake_case spelling, a prefix, or the closest flags by difflib (did_you_mean.py:
  only a close spelling, so `--aa` does not suggest `--data`).

Flags that mean exactly what one of ours means (`-b`, `--grad-accum-steps`, `--num-workers`,
`--warmup-epochs`) are accepted by `train` itself (config.py's `aliases`); for the commands that
do not take them, FOREIGN names the flag to use.
"""
from __future__ import annotations

import argparse
import re
import sys

from .did_you_mean import closest

# A flag of another trainer -> (our flag it maps to, what to type). A hint is given only where
# that flag exists in the command at hand (None: the hint applies as it is); elsewhere the
# closest flags are suggested as for any other unknown flag.
_LR_RULE = ("no base LR flag here: without --lr the peak LR is the model's rate per 256 images "
            "scaled with the global batch (linearly for SGD, by its square root for AdamW), "
            "as timm's --lr-base does; --lr sets the peak LR itself")
FOREIGN: dict[str, tuple[str | None, str]] = {
    "--amp": ("--precision", "use --precision bf16|fp16 (mixed precision; the default, auto, "
                             "picks bf16 or fp16 where they are faster than fp32)"),
    "--fp16": ("--precision", "use --precision fp16"),
    "--bf16": ("--precision", "use --precision bf16"),
    "--model-ema": ("--ema", "use --ema (its decay: --ema-decay)"),
    "--model-ema-decay": ("--ema-decay", "use --ema-decay"),
    "--learning-rate": ("--lr", "use --lr"),
    # timm's base LR per --lr-base-size images, scaled with the batch: our automatic LR is that
    # rule (plan/recipe.py), with each model's own base; --lr sets the peak LR itself.
    "--lr-base": ("--lr", _LR_RULE),
    "--lr-base-size": ("--lr", _LR_RULE),
    "--lr-base-scale": ("--lr", _LR_RULE),
    "--wd": ("--weight-decay", "use --weight-decay"),
    "--opt": ("--optimizer", "use --optimizer sgd|adamw"),
    "--sched": ("--schedule", "use --schedule cosine|linear|onecycle"),
    "--lr-scheduler": ("--schedule", "use --schedule cosine|linear|onecycle"),
    "--lr-warmup-epochs": ("--warmup-epochs", "use --warmup-epochs (or --warmup-steps)"),
    "--smoothing": ("--label-smoothing", "use --label-smoothing"),
    "--mixup-alpha": ("--mixup", "use --mixup ALPHA"),
    "--cutmix-alpha": ("--cutmix", "use --cutmix ALPHA"),
    "--drop": ("--model-kwargs", "use --model-kwargs drop_rate=P (a timm model's dropout)"),
    "--drop-path": ("--model-kwargs", "use --model-kwargs drop_path_rate=P (timm models)"),
    "--torchcompile": ("--compile", "use --compile"),
    "--img-size": ("--image-size", "use --image-size"),
    "--input-size": ("--image-size", "use --image-size (one side, in pixels)"),
    "--train-crop-size": ("--image-size", "use --image-size"),
    "--data-path": ("--data", "use --data OUT (a folder written by prepare-dataset)"),
    "--data-dir": ("--data", "use --data OUT (a folder written by prepare-dataset)"),
    "--dataset": ("--data", "use --data OUT (a folder written by prepare-dataset)"),
    "--output-dir": ("--out", "use --out"),
    "--output": ("--out", "use --out"),
    "--initial-checkpoint": ("--init-from", "use --init-from (a run folder or a weights file)"),
    "--resume-from-checkpoint": ("--resume", "use --out RUNDIR --resume"),
    "--print-freq": ("--log-every", "use --log-every"),
    "--log-interval": ("--log-every", "use --log-every"),
    "--max-epochs": ("--epochs", "use --epochs"),
    "--gradient-clip-val": ("--clip-grad", "use --clip-grad"),
    "--accumulate-grad-batches": ("--accum-steps", "use --accum-steps"),
    "--grad-accum-steps": ("--accum-steps", "use --accum-steps"),
    "--num-workers": ("--workers", "use --workers"),
    "-j": ("--workers", "use --workers"),
    "-b": ("--batch-size", "use --batch-size"),
    "--gpus": ("--device", "use --device cuda; for several GPUs, torchrun --nproc-per-node N "
                           "-m turbotrain train ..."),
    "--devices": ("--device", "use --device cuda; for several GPUs, torchrun --nproc-per-node N "
                              "-m turbotrain train ..."),
    "--accelerator": ("--device", "use --device cpu|cuda"),
}
# (command, flag) -> what to type, before FOREIGN: a flag that another of our commands has.
FOREIGN_IN = {
    ("turbotrain eval", "--top-k"): "eval reports top-1 and top-5 accuracy (eval.json); "
                                    "--top-k is predict's (classes listed per image)",
    ("turbotrain eval", "--topk"): "eval reports top-1 and top-5 accuracy (eval.json); "
                                   "--top-k is predict's (classes listed per image)",
}
NUMBER = re.compile(r"-\d|-\.\d")  # a negative number is a value, not a flag


class CommandParser(argparse.ArgumentParser):
    """argparse.ArgumentParser without prefix abbreviations, whose unknown flags are refused by
    the parser they were given to (a subcommand's, with its usage) with a hint each."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:  # every command takes all of its arguments: nothing is passed on
            self.error(unrecognized(self.prog, self.flags(), extras))
        return namespace, extras

    def flags(self) -> list[str]:
        return [s for action in self._actions for s in action.option_strings]

    def print_usage(self, file=None):
        """On an error: the usage, or for a command with many flags (train's usage is 33
        lines) one line saying where they are listed."""
        usage = self.format_usage()
        if usage.count("\n") > 8:
            usage = f"usage: {self.prog} [FLAG ...]   ({self.prog} --help lists the flags)\n"
        self._print_message(usage, file or sys.stderr)


def unrecognized(prog: str, known: list[str], extras: list[str]) -> str:
    """The error for arguments no action took: the unknown flags, each with its hint; a value
    right after an unknown flag is taken as its value, not listed apart."""
    flags, stray = [], []
    for i, arg in enumerate(extras):
        if arg.startswith("-") and len(arg) > 1 and not NUMBER.match(arg):
            flags.append(arg.split("=", 1)[0])
        elif not (i and extras[i - 1].startswith("-") and "=" not in extras[i - 1]):
            stray.append(arg)
    parts = [f"unknown flag {flag}: {hint(prog, flag, known)}" for flag in flags]
    if stray:
        parts.append(f"unexpected argument{'s' if len(stray) > 1 else ''} "
                     f"{' '.join(stray)} (see {prog} --help)")
    return "; ".join(parts)


def hint(prog: str, flag: str, known: list[str]) -> str:
    """What to type instead of the unknown `flag`, given the command's `known` flags."""
    if (prog, flag) in FOREIGN_IN:
        return FOREIGN_IN[prog, flag]
    target, text = FOREIGN.get(flag, (None, ""))
    if text and (target is None or target in known):
        return text
    dashed = flag.replace("_", "-")
    if dashed != flag and dashed in known:
        return f"did you mean {dashed}? (flags are written with dashes)"
    longer = sorted(k for k in known if k.startswith(flag) and len(flag) > 2)
    if longer:
        return f"did you mean {' or '.join(longer[:3])}? (flags are not abbreviated)"
    # Compared without their leading dashes: the shared "--" made `--bogus` "close" to `--out`.
    names = {k.lstrip("-"): k for k in known}
    close = closest(flag.lstrip("-"), names)
    if close:
        return f"did you mean {' or '.join(names[c] for c in close)}?"
    return f"not a flag of {prog} (see {prog} --help)"
