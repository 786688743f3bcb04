"""pyproject.toml as the tests read it, parsed once for every test that checks what the project
declares (tests/test_readme.py: the README's pip commands; tests/test_docker.py: the
Dockerfile's pins)."""
from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def read_pyproject() -> dict:
    return tomllib.loads(PYPROJECT.read_text())


def pyproject_requirements(pyproject: dict | None = None) -> dict[str, list[Requirement]]:
    """{"": the dependencies, EXTRA: that extra's} of `pyproject` (parsed; default: the
    repository's). The build requirements are pyproject["build-system"]["requires"]."""
    project = (read_pyproject() if pyproject is None else pyproject)["project"]
    groups = {"": project["dependencies"], **project["optional-dependencies"]}
    return {name: [Requirement(r) for r in reqs] for name, reqs in groups.items()}
