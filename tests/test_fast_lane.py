"""`make test-fast` (tests/fast_lane.py): the tests chosen from their fixtures, and the guard
that fails a test in the fast lane that starts a process anyway. Runs pytest on a small test
file in a child process, with the fast lane as its plugin."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast

TESTS = '''
import subprocess, sys
import pytest
from tests.fast_lane import heavy_fixture

@pytest.fixture
@heavy_fixture
def trained_run():
    return "run"

@pytest.fixture
def uses_a_run(trained_run):  # heavy through the fixture it asks for
    return trained_run

def test_plain():
    assert 1 + 1 == 2

def test_heavy_through_a_fixture(uses_a_run):
    assert uses_a_run == "run"

@pytest.mark.usefixtures("child_processes")
def test_declares_its_child():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_starts_a_child_without_saying_so():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

@pytest.mark.parametrize("mode", ["threads", pytest.param("processes", marks=pytest.mark.heavy)])
def test_one_case_heavy(mode):
    assert mode
'''


def run_pytest(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_lane.py").write_text(TESTS)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.fast_lane", "-q",
                           "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", str(tmp_path),
                           "-rA", *flags, str(tmp_path / "test_lane.py")],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_the_fast_lane_keeps_the_tests_whose_fixtures_neither_train_nor_spawn(tmp_path):
    result = run_pytest(tmp_path, "--fast")
    out = result.stdout
    assert "3 deselected" in out, out
    assert "PASSED" in out and "::test_plain" in out
    assert "test_one_case_heavy[threads]" in out and "[processes]" not in out
    for deselected in ("test_heavy_through_a_fixture", "test_declares_its_child"):
        assert deselected not in out, out
    # A test that starts a process without saying so fails, naming the fixture to ask for.
    assert "FAILED" in out and "test_starts_a_child_without_saying_so" in out
    assert "ask for the `child_processes` fixture" in out
    assert result.returncode == 1


def test_without_fast_every_test_runs(tmp_path):
    result = run_pytest(tmp_path)
    assert result.returncode == 0, result.stdout
    assert "6 passed" in result.stdout
