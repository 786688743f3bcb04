"""The command line (turbotrain/arg_parser.py): no prefix abbreviations in any parser, an unknown
flag refused by its command with that command's usage and a hint, and the aliases that mean
exactly one of our flags accepted by `train` (issue 36, item 4)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from turbotrain.arg_parser import FOREIGN, CommandParser, hint
from turbotrain.cli import COMMANDS, build_parser

from .datasets.cli_run import cli

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast

REPO = Path(__file__).resolve().parents[1]


def _parser_calls(path: Path):
    """(line, keyword names) of each `ArgumentParser(...)` / `CommandParser(...)` call."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if name in ("ArgumentParser", "CommandParser"):
                yield node.lineno, name, {k.arg: k.value for k in node.keywords}


def test_every_parser_refuses_prefix_abbreviations():
    """`--epoch 2` must not silently mean --epochs: every parser of the package, the benchmarks
    and the scripts is a CommandParser (allow_abbrev=False by default) or says so itself."""
    files = [p for folder in ("turbotrain", "bench", "scripts") for p in
             (REPO / folder).rglob("*.py")]
    found, wrong = 0, []
    for path in files:
        for line, name, keywords in _parser_calls(path):
            found += 1
            abbrev = keywords.get("allow_abbrev")
            if name == "ArgumentParser" and not (isinstance(abbrev, ast.Constant)
                                                 and abbrev.value is False):
                wrong.append(f"{path.relative_to(REPO)}:{line}")
    assert found > 20 and not wrong, wrong


def test_command_parsers_refuse_prefixes_and_suggest_the_whole_flag(capsys):
    for command in COMMANDS:  # the subparsers are CommandParsers too
        parser = build_parser(command)
        sub = parser._subparsers._group_actions[0].choices[command]
        assert isinstance(sub, CommandParser) and sub.allow_abbrev is False, command
    with pytest.raises(SystemExit) as exit_:
        build_parser("train").parse_args(["train", "--data", "d", "--epoch", "2"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == ("turbotrain train: error: unknown flag --epoch: did you "
                                    "mean --epochs? (flags are not abbreviated)")


def test_every_commands_help_renders():
    # argparse %-formats each help string: a bare "27 % dearer" ("% d" is a conversion) made
    # `train --help` end in a TypeError traceback
    for command in COMMANDS:
        sub = build_parser(command)._subparsers._group_actions[0].choices[command]
        assert f"usage: turbotrain {command}" in sub.format_help(), command


def test_train_takes_the_aliases_that_mean_its_own_flags():
    args = build_parser("train").parse_args(
        ["train", "--data", "d", "-b", "8", "--grad-accum-steps", "2", "--num-workers", "1",
         "--warmup-epochs", "0.5"])
    assert (args.batch_size, args.accum_steps, args.workers, args.warmup_epochs) == (8, 2, 1, 0.5)


def test_each_foreign_flag_names_a_flag_that_exists():
    """A hint is only as good as the flag it names: each FOREIGN target is a flag of train."""
    parser = build_parser("train")
    train = parser._subparsers._group_actions[0].choices["train"]
    known = train.flags()
    for flag, (target, text) in FOREIGN.items():
        if flag in known:  # accepted as an alias: never reaches the table
            continue
        assert target in known, (flag, target)
        assert hint("turbotrain train", flag, known) == text


def test_close_flags_are_found_by_name_not_by_the_shared_dashes():
    """difflib on whole flags counted the leading "--": `--bogus` was "close" to `--out`."""
    known = build_parser("train")._subparsers._group_actions[0].choices["train"].flags()
    prog = "turbotrain train"
    assert hint(prog, "--bogus", known) == f"not a flag of {prog} (see {prog} --help)"
    assert hint(prog, "--workres", known).startswith("did you mean --workers")
    assert hint(prog, "--bacth-size", known).startswith("did you mean --batch-size")


@pytest.mark.parametrize("typed, meant", [("--ouy", "--out"), ("--epohcs", "--epochs"),
                                          ("--seeed", "--seed"), ("--dt", None),
                                          ("--ee", None), ("--xy", None), ("--dat", "--data")])
def test_a_did_you_mean_needs_a_close_spelling(typed, meant):
    """Issue 46: `--aa` (timm's AutoAugment, before it was a flag of ours) suggested `--data`,
    as `--ee` suggested `--seed` and `--dt` would: their 2 letters are in it, but half of the
    name is missing; a typo keeps most of the name it was meant to be."""
    known = build_parser("train")._subparsers._group_actions[0].choices["train"].flags()
    assert typed not in known
    prog = "turbotrain train"
    said = hint(prog, typed, known)
    if meant is None:
        assert said == f"not a flag of {prog} (see {prog} --help)"
    else:
        assert said.startswith(f"did you mean {meant}")


def test_timm_lr_base_says_what_our_lr_rule_is():
    known = build_parser("train")._subparsers._group_actions[0].choices["train"].flags()
    for flag in ("--lr-base", "--lr-base-size", "--lr-base-scale"):
        said = hint("turbotrain train", flag, known)
        assert "per 256 images scaled with the global batch" in said and "--lr " in said


@pytest.mark.timeout(300)
@pytest.mark.parametrize("argv, says", [
    (["train", "--data", "d", "--amp"], "unknown flag --amp: use --precision bf16|fp16"),
    (["train", "--data", "d", "--model-ema"], "unknown flag --model-ema: use --ema"),
    (["train", "--data", "d", "--learning-rate", "0.1"], "unknown flag --learning-rate: use --lr"),
    (["train", "--data", "d", "--batch_size", "8"],
     "unknown flag --batch_size: did you mean --batch-size? (flags are written with dashes)"),
    (["train", "--data", "d", "--opt", "adamw"], "unknown flag --opt: use --optimizer sgd|adamw"),
    (["train", "--data", "d", "--sched", "linear"], "unknown flag --sched: use --schedule"),
    (["eval", "--run", "r", "--top-k", "3"], "unknown flag --top-k: eval reports top-1 and "
                                             "top-5 accuracy"),
    (["predict", "--run", "r", "x.jpg", "--topk", "3"], "unknown flag --topk: did you mean "
                                                         "--top-k?"),
    (["bench", "--data", "d", "-b", "8"], "unknown flag -b: use --batch-size"),
    (["prepare", "a", "b", "--ovewrite"], "unknown flag --ovewrite: did you mean --overwrite?"),
])
def test_an_unknown_flag_gets_its_commands_usage_and_a_hint(argv, says):
    """The real command in a child process: exit code 2, the command's own usage (never the
    top-level `turbotrain [-h] [--version] COMMAND`), then one error line with the hint."""
    done = cli(*argv, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    command = {"prepare": "prepare"}.get(argv[0], argv[0])
    assert lines[0].startswith(f"usage: turbotrain {command} "), done.stderr
    assert "COMMAND ..." not in done.stderr and "Traceback" not in done.stderr
    assert lines[-1].startswith(f"turbotrain {command}: error: {says}"), lines[-1]
    assert len(lines) <= 9  # train's 33-line usage is one line pointing at --help
