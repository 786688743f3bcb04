"""What the tests may skip when it is not installed, and where they may not: the one place.

`make test` (and so CI, .ci/run) installs Ray, timm, DALI, FFCV, Debian's Fashion-MNIST and the
compiled extension, and says so with the environment variable

    TURBOTRAIN_EXPECT=ray,timm,dali,ffcv,fashion_mnist,native      (the Makefile's TEST_EXPECT)

There, a test that needs one of them and finds it missing FAILS with the install hint, so a
broken install cannot pass as a green run with tests skipped. Where the variable does not name
it (a contributor's `pytest` without DALI, or `make test TEST_EXPECT=ray,timm`), the test is
skipped with the same hint and the rest run. The only other skips in the suite are for a CUDA
GPU (the `cuda` marker, tests/conftest.py), root-only mounts and Linux-only calls.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType
from typing import Callable, NoReturn

import pytest

ENV = "TURBOTRAIN_EXPECT"
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def _native_built() -> bool:
    from turbotrain.datasets.beton import map_guard
    return map_guard._native() is not None


def _module_found(name: str) -> Callable[[], bool]:
    def found() -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package (nvidia) is missing
            return False
    return found


# name in TURBOTRAIN_EXPECT -> (is it here?, how to install it)
INSTALLS: dict[str, tuple[Callable[[], bool], str]] = {
    "ray": (_module_found("ray"), "pip install 'turbotrain[ray]'"),
    "timm": (_module_found("timm"), "pip install 'turbotrain[timm]'"),
    "dali": (_module_found("nvidia.dali"), "pip install 'turbotrain[dali]'"),
    "ffcv": (_module_found("ffcv"), "make install builds FFCV (pip install ffcv==1.0.2 "
                                    "--no-build-isolation)"),
    "fashion_mnist": (FASHION_MNIST.is_dir, "apt-get install dataset-fashion-mnist"),
    "native": (_native_built, "make install builds it (python setup.py build_ext --inplace)"),
}


def expected(environ: dict | None = None) -> frozenset[str]:
    """The installs TURBOTRAIN_EXPECT names; a name it does not know is an error (a typo would
    otherwise let its tests skip silently)."""
    value = (os.environ if environ is None else environ).get(ENV, "")
    names = frozenset(n.strip() for n in value.split(",") if n.strip())
    unknown = sorted(names - INSTALLS.keys())
    if unknown:
        raise ValueError(f"{ENV}={value!r}: unknown {', '.join(unknown)}; the names: "
                         f"{', '.join(INSTALLS)}")
    return names


def missing(name: str, why: str) -> NoReturn:
    """A test cannot run because `name` is not installed: a failure where TURBOTRAIN_EXPECT names
    it, a skip elsewhere (module level too: at import, both stop the module's collection)."""
    message = f"{why}; install: {INSTALLS[name][1]}"
    if name in expected():
        pytest.fail(f"{message} ({ENV} says this machine has {name})", pytrace=False)
    pytest.skip(f"{message} (not in {ENV})", allow_module_level=True)


def need(name: str) -> None:
    """Returns when `name` is installed; else `missing`."""
    if not INSTALLS[name][0]():
        missing(name, f"{name} is not installed")


def module(name: str, install: str | None = None) -> ModuleType:
    """`import name` for a test module's top, under `need(install or name)`."""
    need(install or name)
    return importlib.import_module(name)
