"""Every command in README.md and in the docs pages it links to for the rest (PAGES) runs, at a
small size, and does what the page says around it.

The pages are written for users (ImageNet paths, 8 GPUs, 16 epochs); this test maps it onto a
tiny stand-in, in two explicit tables:

* STAND_INS: a README token -> what the test puts there (a 60-JPEG ImageFolder, the dataset
  prepared from it, a local rendezvous instead of node01, 2 processes instead of 8).
* RULES: a README command (a regex over the whole command) -> how the test runs it: the flags
  it appends to make it small (argparse: the last value wins), what it prepares first, what
  it checks afterwards; or, for commands that install or build (pip, apt-get, make), what it
  verifies instead of running them.

Each ```bash command (a line, or a `\\`-continued one; comments dropped) must match a rule:
one that matches none fails with a message saying to add one, so a new README command is never
skipped silently. A block preceded by `<!-- readme-test: skip (REASON) -->` is not run; such
blocks are few and counted exactly (ALLOWED_SKIPS). ```python blocks are executed; a ```yaml block must
be a train config; a ```text block is an output sample. Other fence languages fail.

Set TURBOTRAIN_README=PATH to run the same test against another copy of the README (the docs
pages are this checkout's).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import yaml
from packaging.requirements import Requirement

from turbotrain.train.records.report import read_metrics

from .pyproject_toml import pyproject_requirements, read_pyproject
from .readme_blocks import Block, Command, parse_blocks, parse_commands

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast

REPO = Path(__file__).resolve().parents[1]
README = Path(os.environ.get("TURBOTRAIN_README", REPO / "README.md"))
# The README is a quick start plus links (issue 46); the sections it had moved to these docs
# pages, whose commands run here as the README's do. A page with a bash block added later is
# tested too; the other docs pages (FORMAT.md, PREPARE_AT_SCALE.md, ...) hold sketches (sbatch
# scripts, layouts) that are not commands to run as written.
DOC_PAGES = ("PREPARE", "REMOTE", "TRAINING", "LOADER", "USE", "DOCTOR", "DEPLOY", "INSTALL",
             "FAQ", "DEVELOPMENT")
PAGES = {"README.md": README, **{f"docs/{name}.md": REPO / "docs" / f"{name}.md"
                                 for name in DOC_PAGES}}
VENV_BIN = Path(sys.executable).parent  # turbotrain, prepare-dataset, train, torchrun

# --------------------------------------------------------------------------- the stand-ins

# README token -> stand-in, replaced as a whole word in every command and python block before
# it runs. {name} fields come from the Sandbox: the module's tiny data and the command's own
# temporary working directory (relative paths such as runs/r50 land there).
STAND_INS = {
    "SOURCE": "{source}",                        # ImageFolder: 10 classes x 6 JPEGs, 80x64
    "OUT": "{prepared}",                         # SOURCE prepared once, with a val split
    "/data/imagenet-prepared": "{prepared}",
    "/shared/imagenet-prepared": "{prepared}",
    "/shared/runs/r50": "shared/runs/r50",       # "shared storage": a folder in the cwd
    "run.yaml": "{cwd}/run.yaml",                # RUN_YAML, written by the rule's setup
    "my-photos/": "{source}",                    # predict's folder: the 60 source JPEGs
    "--nproc-per-node 8": "--nproc-per-node 2",  # 2 CPU processes (Gloo) instead of 8 GPUs
    "train.py": "{cwd}/train.py",                # the doctor's script: bench/doctor_script.py
    "--nnodes 4": "--nnodes 1",                  # this machine plays every node ...
    "node01:29500": "127.0.0.1:{port}",          # ... and hosts the rendezvous on a free port
}

# The tiny sizes. Train: 3 optimizer steps of 8 images at 32 px, one torch thread.
TRAIN_SMALL = ("--epochs", "1", "--max-steps", "3", "--batch-size", "8", "--image-size", "32",
               "--device", "cpu", "--threads", "1", "--workers", "1")
# Under torchrun each of the 2 ranks gets one thread and no extra worker: 2 cores in all.
TRAIN_SMALL_DDP = (*TRAIN_SMALL[:-2], "--workers", "0")
BENCH_SMALL = ("--image-size", "32", "--batch-size", "8", "--batches", "2", "--warmup", "1",
               "--workers", "1", "--device", "cpu")
TUNE_SMALL = ("--budget-seconds", "3", "--image-size", "32", "--workers", "1", "--device", "cpu")

# What the README's `train --config run.yaml` reads: a user's file of train flags.
RUN_YAML = "model: resnet18\nepochs: 4\nlr: 0.05\nlabel-smoothing: 0.0\n"

# Blocks marked `<!-- readme-test: skip (REASON) -->`: the program their commands run -> how
# many such blocks there are. A new skip must be added here on purpose.
ALLOWED_SKIPS = {"docker": 1}  # no Docker engine on the dev box or in CI (tests/test_docker.py)

# Command blocks, executed blocks, and passive ones (see the module docstring).
COMMAND_LANGUAGES = {"bash", "sh", "shell"}
PASSIVE_LANGUAGES = {"yaml", "text"}


# --------------------------------------------------------------------------- running commands

@dataclass
class Sandbox:
    """The module's tiny data plus one command's temporary working directory."""
    source: Path
    prepared: Path
    cwd: Path

    def fields(self) -> dict[str, str]:
        with socket.socket() as s:  # a free port for a local rendezvous
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return {"source": str(self.source), "prepared": str(self.prepared),
                "cwd": str(self.cwd), "port": str(port)}

    def substitute(self, text: str) -> str:
        fields = self.fields()
        for token, stand_in in STAND_INS.items():
            text = re.sub(rf"(?<![\w-]){re.escape(token)}(?![\w-])",
                          lambda _: stand_in.format(**fields), text)
        return text


@dataclass
class Ran:
    command: Command
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    box: Sandbox

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def run_dir(self) -> Path:
        """The run folder a train command names in its last line ("... results in RUNDIR")."""
        found = re.findall(r"^done: .*; results in (\S+)$", self.stdout, re.M)
        assert found, f"{self.command}: no `done: ... results in RUNDIR` line:\n{self.output}"
        return self.box.cwd / found[-1]


def environment() -> dict[str, str]:
    # One thread per process: the box has 2 cores and other work running.
    return {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "OMP_NUM_THREADS": "1"}


def run_argv(argv: list[str], cwd: Path, timeout: float = 150) -> tuple[int, str, str]:
    """Runs argv in its own process group, so a timeout also ends torchrun's ranks."""
    proc = subprocess.Popen(argv, cwd=cwd, env=environment(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(argv)} ran over {timeout} s:\n{out[-3000:]}\n{err[-3000:]}")
    return proc.returncode, out, err


# --------------------------------------------------------------------------- the rules

@dataclass(frozen=True)
class Rule:
    pattern: str                          # regex, matched against the whole README command
    append: tuple[str, ...] = ()          # flags added at the end: the small sizes
    setup: Callable | None = None         # setup(box) before the command runs
    check: Callable | None = None         # check(ran) after it ran with the expected exit code
    verify: Callable | None = None        # verify(command, box) *instead* of running it
    exit_code: int = 0                    # a command the README documents as failing: its code


def rule_for(command: Command) -> Rule:
    matches = [r for r in RULES if re.fullmatch(r.pattern, command.text)]
    if not matches:
        pytest.fail(f"{command}\n  the README test has no rule for this command: add one to "
                    f"RULES (and a stand-in to STAND_INS if it names new data) in "
                    f"tests/test_readme.py, or mark its block <!-- readme-test: skip (REASON) -->")
    return matches[0]


def run_command(command: Command, box: Sandbox) -> Ran:
    rule = rule_for(command)
    if rule.verify is not None:
        rule.verify(command, box)
        return Ran(command, [], 0, "", "", box)
    if rule.setup is not None:
        rule.setup(box)
    argv = [*shlex.split(box.substitute(command.text)), *rule.append]
    code, out, err = run_argv(argv, box.cwd)
    ran = Ran(command, argv, code, out, err, box)
    assert code == rule.exit_code, (f"{command}\n  ran as: {shlex.join(argv)}\n  exit code "
                                    f"{code}, expected {rule.exit_code}\n{out[-3000:]}\n"
                                    f"{err[-3000:]}")
    if rule.check is not None:
        rule.check(ran)
    return ran


# ----- verifications for commands that install or build

def makefile_text() -> str:
    return (REPO / "Makefile").read_text()


def verify_make(command: Command, box: Sandbox) -> None:
    """`make TARGET`: the target exists and does what the README says; nothing is run (make
    test runs this very test, make install reinstalls, make bench takes half an hour)."""
    target = command.text.split()[1]
    result = subprocess.run(["make", "-n", "--no-print-directory", target], cwd=REPO,
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "MAKEFLAGS": "", "MAKELEVEL": ""})
    assert result.returncode == 0, f"{command}: `make -n {target}` fails:\n{result.stderr}"
    last = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    if target == "demo":
        # `turbotrain demo` at its full size takes minutes; tests/test_demo.py runs it small.
        assert last == ".venv/bin/turbotrain demo", result.stdout
        demo_test = (REPO / "tests" / "test_demo.py").read_text()
        assert '"-m", "turbotrain", "demo"' in demo_test and "--train-per-class" in demo_test
    elif target == "test":
        # the suite, then the pipeline tests again on the Python decode path (the fallback)
        lines = result.stdout.strip().splitlines()
        assert lines[-2:][0].startswith(".venv/bin/python -m pytest -q"), result.stdout
        assert last.startswith("TURBOTRAIN_NATIVE=0 .venv/bin/python -m pytest -q tests/"), last
        testpaths = read_pyproject()["tool"]["pytest"]["ini_options"]["testpaths"]
        assert testpaths == ["tests"]  # so `make test` runs this file too
    elif target == "test-fast":  # the fast lane: tests/fast_lane.py picks it, --fast runs it
        assert last.startswith(".venv/bin/python -m pytest -q --fast"), result.stdout
    elif target == "bench":
        assert last == ".venv/bin/python bench/run_all.py", result.stdout
        assert (REPO / "bench" / "run_all.py").is_file()
    elif target == "gpu-check":  # needs a GPU; tests/pipeline/test_parity.py runs its smoke form
        assert last.split()[1:] == ["bench/gpu_check.py", "--all"], result.stdout
        assert "install" not in result.stdout.replace("gpu_check", "")  # installs nothing


def verify_pip(command: Command, box: Sandbox) -> None:
    """`pip install ...` (possibly `&&`-chained): each requirement parses, turbotrain[EXTRA]
    names real extras, any other package is one pyproject declares with the same pin, and
    `--no-build-isolation` is used exactly as the Makefile uses it."""
    groups = pyproject_requirements()
    declared = {r.name: r for reqs in groups.values() for r in reqs}
    for part in " ".join(shlex.split(command.text)).split(" && "):
        words = part.split()
        assert words[:2] == ["pip", "install"], f"{command}: {part!r} is not a pip install"
        options = [w for w in words[2:] if w.startswith("-")]
        assert set(options) <= {"--no-build-isolation"}, f"{command}: unknown options {options}"
        for text in (w for w in words[2:] if not w.startswith("-")):
            req = Requirement(text)
            if req.name == "turbotrain":
                unknown = req.extras - (set(groups) - {""})
                assert req.extras and not unknown, f"{command}: pyproject has no extra {unknown}"
                # A package named in the comment is one that extra installs.
                named = re.match(r"[A-Za-z0-9][\w.-]*", command.comment or "")
                if named:
                    names = {r.name for extra in req.extras for r in groups[extra]}
                    assert named.group(0) in names, f"{command}: {named.group(0)} not in {names}"
                continue
            assert req.name in declared, (f"{command}: {req.name} is not declared in pyproject;"
                                          f" declare it, or give it a rule in RULES")
            if req.specifier:
                assert req.specifier == declared[req.name].specifier, (command, declared[req.name])
            if options:
                assert f'{" ".join(options)} "{req}"' in makefile_text(), (
                    f"{command}: the Makefile does not install {req} with {options}")


def verify_apt(command: Command, box: Sandbox) -> None:
    """`apt-get install ...`: the same packages `make install` installs (Makefile APT_PACKAGES)."""
    words = shlex.split(command.text)[2:]
    packages = [w for w in words if not w.startswith("-")]
    assert set(words) - set(packages) <= {"-y", "--no-install-recommends"}, command
    apt = re.search(r"^APT_PACKAGES := (.*)$", makefile_text(), re.M).group(1).split()
    missing = set(packages) - set(apt)
    assert packages and not missing, f"{command}: not in the Makefile's APT_PACKAGES: {missing}"


def verify_prepare_synopsis(command: Command, box: Sandbox) -> None:
    """`prepare-dataset SOURCE OUT [--flag VALUE] ...`: every optional flag exists, `a|b|c` are
    exactly its choices, a number shown is its default; then it runs once bare, once with every
    flag (the first choice each), and once per other choice."""
    from turbotrain.cli import add_prepare_arguments
    parser = argparse.ArgumentParser()
    add_prepare_arguments(parser)
    actions = {s: a for a in parser._actions for s in a.option_strings}
    placeholders = {"N": "1", "F": "0.25"}  # --workers N, --val-fraction F
    base = command.text.split(" [", 1)[0]
    first, others = [], []
    for flag, value in re.findall(r"\[(--[\w-]+)(?: ([^\]]+))?\]", command.text):
        assert flag in actions, f"{command}: prepare-dataset has no {flag}"
        action = actions[flag]
        if not value:
            assert action.nargs == 0, f"{command}: {flag} takes a value"
            first.append(flag)
        elif "|" in value:
            assert value.split("|") == list(action.choices), (flag, action.choices)
            first += [flag, value.split("|")[0]]
            others += [[flag, choice] for choice in value.split("|")[1:]]
        elif value in placeholders:
            first += [flag, placeholders[value]]
        else:
            assert action.type(value) == action.default, f"{command}: {flag} default is " \
                                                         f"{action.default}, not {value}"
            first += [flag, value]
    assert base == "prepare-dataset SOURCE OUT" and first, command
    for k, extra in enumerate([[], first, *others]):
        out = box.cwd / f"synopsis-{k}"
        argv = [*shlex.split(box.substitute(base)), *extra, "--workers", "1"]  # 1 process
        argv[2] = str(out)  # OUT is a fresh folder here, not the prepared stand-in
        code, stdout, stderr = run_argv(argv, box.cwd)
        assert code == 0, f"{command}\n  ran as: {shlex.join(argv)}\n{stderr[-2000:]}"
        assert (out / "dataset.json").is_file() and f"prepared {out}" in stdout


def verify_prepare_val_split(command: Command, box: Sandbox) -> None:
    """`prepare-dataset SOURCE OUT --val-fraction F`, "F of each class held out for val": run
    into a fresh folder (OUT's stand-in is the module's dataset, which stays as it is), then
    every class has val images, each class's val count within half an image of F x its count."""
    from turbotrain.datasets import open_dataset
    out = box.cwd / "prepared-here"
    argv = [*shlex.split(box.substitute(command.text)), "--workers", "1"]
    argv[2] = str(out)
    code, stdout, stderr = run_argv(argv, box.cwd)
    assert code == 0, f"{command}\n  ran as: {shlex.join(argv)}\n{stderr[-2000:]}"
    fraction = float(argv[argv.index("--val-fraction") + 1])
    train, val = open_dataset(out, split="train"), open_dataset(out, split="val")
    classes = len(train.classes)
    in_val = np.bincount(np.asarray(val.labels), minlength=classes)
    in_all = in_val + np.bincount(np.asarray(train.labels), minlength=classes)
    assert in_all.sum() == len(list(box.source.rglob("*.jpg"))), in_all
    assert (in_val > 0).all() and (abs(in_val - fraction * in_all) <= 0.5).all(), (in_val, in_all)


# ----- setups

def write_run_yaml(box: Sandbox) -> None:
    (box.cwd / "run.yaml").write_text(RUN_YAML)


def stopped_run(box: Sandbox) -> None:
    """A run in runs/a that stopped after 2 of its 3 steps, for `--out runs/a --resume`."""
    argv = ["train", "--data", str(box.prepared), "--out", "runs/a", *TRAIN_SMALL,
            "--max-steps", "2", "--log-every", "1"]
    code, _, err = run_argv(argv, box.cwd)
    assert code == 0, err


def finished_run(name: str) -> Callable[[Sandbox], None]:
    """A setup putting a finished small run (best.safetensors, final.safetensors, config.yaml)
    at cwd/NAME, for the README's eval / predict / export / --init-from commands. It is
    trained once per module, beside the tiny data, and copied."""
    def setup(box: Sandbox) -> None:
        import shutil
        trained = box.prepared.parent / "readme-run"
        if not (trained / "final.safetensors").is_file():
            argv = ["train", "--data", str(box.prepared), "--out", str(trained), *TRAIN_SMALL]
            code, _, err = run_argv(argv, box.cwd)
            assert code == 0, err
        shutil.copytree(trained, box.cwd / name)
    return setup


# ----- checks

def page_saying(phrase: str) -> str:
    """The text of the one page (PAGES) that holds `phrase`: the sentence or table a check
    reads may move between pages, but must not be said twice."""
    texts = [text for path in PAGES.values() if phrase in (text := path.read_text())]
    assert len(texts) == 1, f"{len(texts)} pages say {phrase!r}, not one"
    return texts[0]


def readme_backticked_after(phrase: str) -> list[str]:
    """The `names` in the page's sentence that starts at `phrase`, up to its full stop."""
    text = page_saying(phrase)
    start = text.index(phrase)
    sentence = text[start:re.compile(r"\.(\s|$)").search(text, start).start()]
    return re.findall(r"`([^`]+)`", sentence[len(phrase):])


def check_inspect(ran: Ran) -> None:
    """"splits, counts, classes, encoding mix, sizes"."""
    from turbotrain.datasets.synthetic import CLASSES
    out = ran.stdout
    assert all(c in out for c in CLASSES), out
    assert re.search(r"train: \d+ images \(\d+ jpeg, \d+ raw\)", out), out
    assert re.search(r"val: \d+ images", out) and "size " in out, out


def check_verify(ran: Ran) -> None:
    assert ran.stdout.strip().endswith(": ok"), ran.stdout


def check_sharded(ran: Ran) -> None:
    """"each split as numbered .beton shards" plus their index, read back as one split."""
    from turbotrain.datasets import open_dataset
    out = ran.box.cwd / ran.argv[2]
    info = json.loads((out / "dataset.json").read_text())
    shards = info["splits"]["train"]["shards"]
    assert info["format_version"] == 2 and shards, info
    assert all(re.fullmatch(r"train-\d{5}-of-\d{5}\.beton", s["file"]) for s in shards), shards
    assert len(open_dataset(out, "train")) == info["splits"]["train"]["num_samples"] > 0


def check_part(ran: Ran) -> None:
    """"part 2 of 4": its manifest, and no index until every part is merged."""
    out = ran.box.cwd / ran.argv[2]
    part, parts = ran.argv[ran.argv.index("--part") + 1].split("/")
    assert (out / "parts" / f"part-{int(part):05d}-of-{int(parts):05d}.json").is_file()
    assert not (out / "dataset.json").exists()


MERGE_SHARD_BYTES = 30_000  # ~10 of the 80x64 JPEGs a shard: several shards over 4 parts


def all_parts(name: str, parts: int = 4) -> Callable:
    """Setup for `turbotrain merge NAME`: the N parts of SOURCE written into cwd/NAME (small
    shards, through the library: the flag's minimum is 8 MiB), and one machine's run beside."""
    def setup(box: Sandbox) -> None:
        from turbotrain.datasets.prepare.convert import PrepareOptions, prepare_dataset
        options = dict(shard_size=MERGE_SHARD_BYTES, workers=1, progress=False)
        for part in range(parts):
            prepare_dataset(box.source, box.cwd / name, PrepareOptions(part=(part, parts),
                                                                       **options))
        prepare_dataset(box.source, box.cwd / "one-machine", PrepareOptions(**options))
    return setup


def check_merged(ran: Ran) -> None:
    """"the index": the merged folder equals a one-machine run's, byte for byte."""
    merged, single = ran.box.cwd / ran.argv[2], ran.box.cwd / "one-machine"
    names = sorted(os.listdir(single))
    assert sorted(os.listdir(merged)) == names and len(names) > 3, os.listdir(merged)
    for name in names:
        assert (merged / name).read_bytes() == (single / name).read_bytes(), name


def check_bench(ran: Ran) -> None:
    """A rate per requested pipeline, plus the bare JPEG-decode rate of the same bytes."""
    asked = ran.argv[ran.argv.index("--pipeline") + 1:]
    asked = asked[:next((k for k, w in enumerate(asked) if w.startswith("-")), len(asked))]
    for name in [*asked, "bare_decode"]:
        row = re.search(rf"^{name}\s+(\S.*)$", ran.stdout, re.M)
        assert row, f"no {name} row:\n{ran.stdout}"
        no_gpu = "cuda" in row.group(1).lower() or "gpu" in row.group(1).lower()
        assert re.match(r"[\d,]+\s", row.group(1)) or no_gpu, f"{name}: {row.group(0)}"


def check_train(ran: Ran) -> None:
    """The run folder and summary.json hold what "Reading the run report" and "Where the time
    goes" list, and each flag in the command did what it says."""
    run_dir = ran.run_dir()
    summary = json.loads((run_dir / "summary.json").read_text())
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    if "--out" not in ran.command.text:  # default: runs/<dataset>-<model>-<time>
        assert re.fullmatch(rf"runs/{ran.box.prepared.name}-{summary['model']}-\d{{8}}-\d{{6}}",
                            str(run_dir.relative_to(ran.box.cwd))), run_dir
    files = [f for f in readme_backticked_after("The run folder (`--out`") if "." in f]
    assert set(files) >= {"config.yaml", "metrics.jsonl", "summary.json", "curves.png"}, files
    for name in [*files, "timeline.png", "checkpoint.pt"]:
        assert (run_dir / name).is_file(), f"{run_dir} has no {name}"
    keys = readme_backticked_after("`summary.json` has ")
    assert len(keys) > 10 and not set(keys) - set(summary), set(keys) - set(summary)
    assert summary["diagnosis"] and re.search(r"^bottleneck: ", ran.stdout, re.M), ran.stdout
    words = ran.command.text.split()
    if "--model" in words:
        assert summary["model"] == config["model"] == words[words.index("--model") + 1]
    if "--accum-steps" in words:
        assert summary["accum_steps"] == int(words[words.index("--accum-steps") + 1])
    if "--config" in words:  # the file's settings apply, the flags given win over them
        assert config["model"] == "resnet18" and config["label-smoothing"] == 0.0
        assert config["lr"] == float(words[words.index("--lr") + 1]) != 0.05
    if "--profile" in words:
        assert json.loads((run_dir / "trace.json").read_text())
        assert (run_dir / "profile.txt").read_text().strip()
    if words == ["train", "--data", "OUT"]:  # "each choice printed with its reason"
        for choice in ("device", "model", "precision", "compile", "pipeline", "threads"):
            assert re.search(rf"^  {choice}: .+?: \S", ran.stdout, re.M), (choice, ran.stdout)
        check_config_reruns(ran, run_dir, config)


def check_config_reruns(ran: Ran, run_dir: Path, config: dict) -> None:
    """"config.yaml (the resolved settings: rerun them with --config and a new --out)"."""
    argv = ["train", "--config", str(run_dir / "config.yaml"), "--out", "runs/rerun"]
    code, _, err = run_argv(argv, ran.box.cwd)
    assert code == 0, err
    again = yaml.safe_load((ran.box.cwd / "runs" / "rerun" / "config.yaml").read_text())
    assert {**again, "out": None} == {**config, "out": None}


def check_resumed(ran: Ran) -> None:
    steps = [r["step"] for r in read_metrics(ran.run_dir()) if r["kind"] == "step"]
    assert steps == [1, 2, 3] and "resuming" in ran.stdout, (steps, ran.stdout)


def check_tune(ran: Ran) -> None:
    """It prints the train command it recommends, and that command runs; with a global batch
    it reaches it with --accum-steps."""
    found = re.search(r"^recommended: (turbotrain train .*)$", ran.stdout, re.M)
    assert found, ran.stdout
    recommended = shlex.split(found.group(1))
    assert recommended[2:4] == ["--data", str(ran.box.prepared)], recommended
    words = ran.command.text.split()
    if "--global-batch-size" in words:
        batch = int(recommended[recommended.index("--batch-size") + 1])
        accum = int(recommended[recommended.index("--accum-steps") + 1])
        assert batch * accum == int(words[words.index("--global-batch-size") + 1])
    else:
        argv = [*recommended, "--epochs", "1", "--max-steps", "2", "--device", "cpu",
                "--out", "runs/recommended"]
        code, _, err = run_argv(argv, ran.box.cwd)
        assert code == 0, f"{shlex.join(argv)}\n{err[-2000:]}"


def check_info(ran: Ran) -> None:
    """"versions, CPU features, GPUs, usable pipelines, and what train would pick here"."""
    for heading in ("versions:", "CPU:", "GPUs:", "pipelines:", "train would pick:"):
        assert re.search(rf"^{heading}", ran.stdout, re.M), (heading, ran.stdout)
    if "--machine" in ran.argv:  # "what train would pick on another machine"
        name = ran.argv[ran.argv.index("--machine") + 1]
        assert re.search(rf"^machine: {re.escape(name)}: ", ran.stdout, re.M), ran.stdout


def check_torchrun(ran: Ran) -> None:
    """Two ranks trained one run; only rank 0 printed and wrote."""
    summary = json.loads((ran.run_dir() / "summary.json").read_text())
    assert summary["world_size"] == 2, summary
    assert ran.stdout.count("done: ") == 1, ran.stdout


def check_init_from(ran: Ran) -> None:
    """A run started from another run's weights, which says so in its own weights' card."""
    check_train(ran)
    from turbotrain.train.weights.weights import read_weights
    words = ran.command.text.split()
    card = read_weights(ran.run_dir() / "best.safetensors")[1]
    assert card.info.get("started_from") == words[words.index("--init-from") + 1], card.info


def dataset_classes(box: Sandbox) -> list[str]:
    return json.loads((box.prepared / "dataset.json").read_text())["classes"]


def check_eval(ran: Ran) -> None:
    """eval.json (in the run folder, or beside --weights) holds what the README lists, and on
    the run's own val split top-1 is the run's logged val accuracy."""
    words = ran.command.text.split()
    source = Path(words[words.index("--run") + 1] if "--run" in words else
                  Path(words[words.index("--weights") + 1]).parent)
    result = json.loads((ran.box.cwd / source / "eval.json").read_text())
    keys = {"top1", "top5", "loss", "per_class", "confusion", "predictions"}
    assert keys <= set(result), set(result)
    assert [c["class"] for c in result["per_class"]] == dataset_classes(ran.box)
    assert (ran.box.cwd / source / "confusion.png").is_file()
    if "--run" in words:
        assert "for these weights: the same" in ran.stdout, ran.stdout
    if "--batch-size" in words:
        assert result["batch_size"] == int(words[words.index("--batch-size") + 1])


def check_predict(ran: Ran) -> None:
    """A CSV row per source image: path, then --top-k (class, probability) pairs."""
    import csv
    words = ran.command.text.split()
    k = int(words[words.index("--top-k") + 1])
    with (ran.box.cwd / words[words.index("--out") + 1]).open(newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["path", "class", "prob"] + [
        f"{what}_{r}" for r in range(2, k + 1) for what in ("class", "prob")], rows[0]
    assert len(rows) - 1 == len(list(ran.box.source.rglob("*.jpg")))
    classes = set(dataset_classes(ran.box))
    assert all(set(row[1::2]) <= classes for row in rows[1:]), rows[:3]


def check_export(ran: Ran) -> None:
    """The file lands in the run folder and was checked against the model."""
    words = ran.command.text.split()
    suffix = {"onnx": "onnx", "torchscript": "torchscript.pt",
              "safetensors": "safetensors"}[words[words.index("--format") + 1]]
    assert (ran.box.cwd / words[words.index("--run") + 1] / f"model.{suffix}").is_file()
    assert re.search(r"largest \|logit difference\| \S+ \(tolerance", ran.stdout), ran.stdout


def your_training_script(box: Sandbox) -> None:
    """"Already have a training script?": a plain PyTorch loop (bench/doctor_script.py, its
    30 steps of random tensors; one thread, as OMP_NUM_THREADS says here) as the user's
    train.py."""
    shutil.copyfile(REPO / "bench" / "doctor_script.py", box.cwd / "train.py")


def check_doctor(ran: Ran) -> None:
    """The report on stderr and in doctor/doctor.json: timed steps, shares, the verdict."""
    report = json.loads((ran.box.cwd / "doctor" / "doctor.json").read_text())
    process = report["processes"][0]
    words = ran.command.text.split()
    assert process["timed_steps"] == int(words[words.index("--steps") + 1]), process
    assert process["ended"] == "stopped" and "RESULT" not in ran.stdout  # --stop ended it
    assert re.search(r"^verdict: (input|copy|host|compute)-bound$", ran.stderr, re.M), ran.stderr
    assert (ran.box.cwd / "doctor" / "timeline.png").is_file()


# README command (regex over the whole command, comments dropped) -> how the test runs it. The
# first rule that matches wins.
RULES = [
    Rule(r"make (demo|test|test-fast|bench|install|gpu-check)", verify=verify_make),
    Rule(r"pip install .*", verify=verify_pip),
    Rule(r"apt-get install .*", verify=verify_apt),
    Rule(r"prepare-dataset SOURCE OUT \[.*", verify=verify_prepare_synopsis),
    Rule(r"turbotrain inspect OUT", check=check_inspect),
    Rule(r"turbotrain verify OUT", check=check_verify),
    Rule(r"prepare-dataset SOURCE OUT --val-fraction \S+", verify=verify_prepare_val_split),
    Rule(r"prepare-dataset SOURCE (\S+) --shard-size \S+", check=check_sharded),
    Rule(r"prepare-dataset SOURCE (\S+) --shard-size \S+ --part \d+/\d+", check=check_part),
    Rule(r"turbotrain merge BIG", setup=all_parts("BIG"), check=check_merged),
    Rule(r"turbotrain bench --data OUT .*", append=BENCH_SMALL, check=check_bench),
    Rule(r"train --data OUT --out (\S+) --resume", setup=stopped_run, append=TRAIN_SMALL,
         check=check_resumed),
    Rule(r"train --data OUT --config run\.yaml .*", setup=write_run_yaml, append=TRAIN_SMALL,
         check=check_train),
    Rule(r"train --data OUT --out (\S+) --init-from runs/base( .*)?",
         setup=finished_run("runs/base"), append=TRAIN_SMALL, check=check_init_from),
    Rule(r"train --data OUT( .*)?", append=TRAIN_SMALL, check=check_train),
    Rule(r"turbotrain eval --weights runs/ft\S* .*", setup=finished_run("runs/ft"),
         check=check_eval),
    Rule(r"turbotrain eval --run runs/base", setup=finished_run("runs/base"), check=check_eval),
    Rule(r"turbotrain predict --run runs/base .*", setup=finished_run("runs/base"),
         check=check_predict),
    Rule(r"turbotrain export --run runs/ft --format \w+", setup=finished_run("runs/ft"),
         check=check_export),
    Rule(r"turbotrain tune --data OUT( .*)?", append=TUNE_SMALL, check=check_tune),
    Rule(r"turbotrain info( --data \S+)?( --machine \S+)?", check=check_info),
    Rule(r"turbotrain doctor --steps \d+ --stop -- python train\.py", setup=your_training_script,
         check=check_doctor),
    Rule(r"torchrun .*-m turbotrain train .*", append=TRAIN_SMALL_DDP, check=check_torchrun),
]


# --------------------------------------------------------------------------- the tests

BLOCKS = [block for name, path in PAGES.items() for block in parse_blocks(path.read_text(), name)]
COMMANDS = [c for b in BLOCKS if b.language in COMMAND_LANGUAGES and b.skip_reason is None
            for c in parse_commands(b)]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> tuple[Path, Path]:
    """(SOURCE, OUT): an ImageFolder of 60 photo-like JPEGs (10 classes, 80x64: above the
    64 px raw threshold, so JPEG-decoding pipelines decode), prepared with a 20% val split."""
    from turbotrain.cli import main as turbotrain_main
    from turbotrain.datasets.synthetic import write_shapes_imagefolder
    root = tmp_path_factory.mktemp("readme")
    source = write_shapes_imagefolder(root / "photos", train_per_class=6, val_per_class=0,
                                      size=(80, 64), threads=1) / "train"
    prepared = root / "prepared"
    assert turbotrain_main(["prepare", str(source), str(prepared), "--val-fraction", "0.2",
                            "--workers", "1"]) == 0
    return source, prepared


@pytest.fixture
def box(tiny_data, tmp_path) -> Sandbox:
    return Sandbox(*tiny_data, cwd=tmp_path)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("command", COMMANDS,
                         ids=lambda c: f"{Path(c.page).stem} L{c.line} {c.text[:50]}")
def test_readme_command(command: Command, box: Sandbox):
    run_command(command, box)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.language == "python"],
                         ids=lambda b: f"{Path(b.page).stem} L{b.line}")
def test_readme_python_block(block: Block, box: Sandbox, monkeypatch):
    monkeypatch.chdir(box.cwd)
    namespace: dict = {}
    exec(compile(box.substitute(block.text), f"{block.page}:{block.line}", "exec"), namespace)
    if "open_dataset" in block.text:  # what its comments say
        ds, stored, image = namespace["ds"], namespace["stored"], namespace["image"]
        assert len(ds) > 0 and ds.classes and np.asarray(ds.labels).dtype == np.int64
        assert bytes(stored[:2]) == b"\xff\xd8"  # 80x64 photos are stored as JPEG, undecoded
        assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
        from turbotrain.datasets import open_dataset
        assert len(open_dataset(box.prepared / "train.beton")) == len(ds)  # a bare .beton


def test_readme_blocks_are_all_known():
    """Every block is one the test handles, skips are few and explained, and every rule and
    stand-in is still used (so the tables follow the pages)."""
    assert COMMANDS, "no commands found in the README and its docs pages"
    for block in BLOCKS:
        assert block.language in COMMAND_LANGUAGES | PASSIVE_LANGUAGES | {"python"}, (
            f"{block.page}:{block.line}: a ```{block.language} block: add it to the languages the "
            f"README test handles (tests/test_readme.py) or mark it readme-test: skip (REASON)")
        if block.language == "yaml" and block.skip_reason is None:
            check_yaml_is_a_train_config(block)
    skipped = [b for b in BLOCKS if b.skip_reason is not None]
    counts: dict[str, int] = {}
    for block in skipped:
        assert block.skip_reason, f"{block.page}:{block.line}: a readme-test skip needs a (REASON)"
        programs = {c.text.split()[0] for c in parse_commands(block)} or {block.language}
        assert len(programs) == 1 and programs <= set(ALLOWED_SKIPS), (
            f"{block.page}:{block.line}: skipped block runs {programs}; ALLOWED_SKIPS lists the "
            f"skippable ones: run it instead, or add it there on purpose")
        program = programs.pop()
        counts[program] = counts.get(program, 0) + 1
    assert counts == ALLOWED_SKIPS, f"skipped blocks {counts}, ALLOWED_SKIPS {ALLOWED_SKIPS}"
    used = {r.pattern for c in COMMANDS for r in RULES if re.fullmatch(r.pattern, c.text)}
    assert not {r.pattern for r in RULES} - used, "rules no command of the pages uses any more"
    text = " ".join(c.text for c in COMMANDS) + " ".join(
        b.text for b in BLOCKS if b.language == "python")
    unused = [t for t in STAND_INS if not re.search(rf"(?<![\w-]){re.escape(t)}(?![\w-])", text)]
    assert not unused, f"stand-ins for tokens the pages no longer have: {unused}"


def check_yaml_is_a_train_config(block: Block) -> None:
    from turbotrain.train.config.config import TrainConfig
    keys = set(yaml.safe_load(block.text) or {})
    known = {name.replace("_", "-") for name in TrainConfig.__dataclass_fields__}
    assert keys <= known, f"{block.page}:{block.line}: not train settings: {keys - known}"


def test_flags_in_the_training_table_exist():
    """The "flags that matter most" table (docs/TRAINING.md) names real train flags."""
    from turbotrain.train.cli import add_train_arguments
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    known = {s for a in parser._actions for s in a.option_strings}
    text = page_saying("The flags that matter most:")
    table = text[text.index("The flags that matter most:"):].split("\n\n", 2)[1]  # that table only
    rows = re.findall(r"^\| (`--.*?) \|", table, re.M)
    flags = {f for row in rows for f in re.findall(r"`(--[\w-]+)`", row)}
    assert len(flags) > 10 and not flags - known, flags - known


# ----- the harness itself: an unknown command fails, a skip needs its reason

SAMPLE = """\
```bash
turbotrain inspect OUT   # ok
turbotrain frobnicate OUT
torchrun --nnodes 4 \\
    -m turbotrain train --data OUT
# a comment
prepare-dataset SOURCE OUT [--encoding auto|jpeg|raw]
                [--overwrite]
```

<!-- readme-test: skip () -->
```bash
docker build .
```
"""


def test_parser_and_unknown_commands_fail_loudly():
    blocks = parse_blocks(SAMPLE)
    assert [b.skip_reason for b in blocks] == [None, ""]
    commands = parse_commands(blocks[0])
    assert [(c.line, c.text, c.comment) for c in commands] == [
        (2, "turbotrain inspect OUT", "ok"),
        (3, "turbotrain frobnicate OUT", ""),
        (4, "torchrun --nnodes 4 -m turbotrain train --data OUT", ""),
        (7, "prepare-dataset SOURCE OUT [--encoding auto|jpeg|raw] [--overwrite]", "")]
    assert rule_for(commands[0]).check is check_inspect
    with pytest.raises(pytest.fail.Exception, match="no rule for this command: add one"):
        rule_for(commands[1])
