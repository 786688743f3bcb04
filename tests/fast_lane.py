"""`make test-fast` (`pytest --fast`): every test that needs no training run and no child
process, for a contributor's inner loop.

Which tests those are follows from the fixtures a test uses, not from a list kept by hand: a
fixture that trains or starts a child process is declared so where it is defined
(`@heavy_fixture`), and a test whose fixtures (with theirs, transitively) include one is marked
`heavy`. A test that starts a child process itself asks for the `child_processes` fixture
(`@pytest.mark.usefixtures("child_processes")`, or a module's `pytestmark`); one case of a
parametrized test, which cannot ask for a fixture, is `pytest.param(..., marks=pytest.mark.heavy)`.
Under --fast the heavy tests are deselected and each remaining test runs guarded: starting a
process or a training fails it with the line that says which fixture to ask for, so a test
cannot slip into the fast lane by forgetting to say what it does.
"""
from __future__ import annotations

import multiprocessing.process
import os
import subprocess

import pytest

HEAVY = "_turbotrain_heavy"


def heavy_fixture(function):
    """Declares a fixture (put it under @pytest.fixture) as training or starting processes."""
    setattr(function, HEAVY, True)
    return function


@pytest.fixture
@heavy_fixture
def child_processes():
    """This test starts child processes (a CLI command, a worker pool, torchrun)."""


def is_heavy(item) -> bool:
    if item.get_closest_marker("heavy") is not None:
        return True
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in item.fixturenames:
        for fixturedef in info.name2fixturedefs.get(name, ()):
            if getattr(fixturedef.func, HEAVY, False):
                return True
    return False


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help="only the tests that need no training run and no child process "
                          "(make test-fast); the others are deselected")


def pytest_configure(config):
    config.addinivalue_line("markers", "heavy: trains or starts child processes (fast_lane.py)")


def select(config, items) -> None:
    """Marks the heavy tests; under --fast, deselects them."""
    heavy = [item for item in items if is_heavy(item)]
    for item in heavy:
        item.add_marker("heavy")
    if not config.getoption("--fast"):
        return
    names = {id(item) for item in heavy}
    config.hook.pytest_deselected(items=heavy)
    items[:] = [item for item in items if id(item) not in names]


def _refuse(what: str):
    def refused(*args, **kwargs):
        pytest.fail(f"under --fast this test {what}: ask for the `child_processes` fixture "
                    "(@pytest.mark.usefixtures(\"child_processes\")) or a fixture that trains, "
                    "so that it runs in `make test` only", pytrace=False)
    return refused


@pytest.fixture(autouse=True)
def _fast_lane_guard(request, monkeypatch):
    if not request.config.getoption("--fast"):
        yield
        return
    # Imported before the guard is up: importing torch may itself start a process.
    from turbotrain.train.engine import trainer  # lazy: only a --fast run guards training
    monkeypatch.setattr(trainer.Trainer, "fit", _refuse("trains"))
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("starts a child process"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start",
                        _refuse("starts a child process"))
    monkeypatch.setattr(os, "fork", _refuse("forks"))
    yield


def pytest_collection_modifyitems(config, items):
    """As a plugin of its own (`-p tests.fast_lane`, tests/test_fast_lane.py); the suite's
    conftest calls `select` from its own hook."""
    select(config, items)
