import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from turbotrain.cli import main as turbotrain_main
from turbotrain.train.records.report import read_metrics

from ..fast_lane import heavy_fixture
from . import memory_pipeline  # noqa: F401  (registers test-memory and test-slow)
from .tiny_data import write_tiny_dataset

REPO = Path(__file__).resolve().parents[2]

# Every test run: one torch thread, no worker threads, so tests never fight the other work on
# the 2-core box; the in-test pipeline; a short log interval. No flip TTA: the in-test pipeline
# draws no flips (the plan's rule assumes the real pipelines' training flips), and a tiny
# square's class is its place, so its mirror is another class.
FAST = ["--threads", "1", "--workers", "0", "--pipeline", "test-memory", "--no-tta",
        "--log-every", "1"]  # (test_doctor drops the last two)


def logged_steps(run_dir: Path) -> int:
    """The last optimizer step logged in RUNDIR/metrics.jsonl (0 before the first)."""
    return max([0] + [record.get("step", 0) for record in read_metrics(run_dir)])


def wait_until(predicate, proc: subprocess.Popen, *, timeout: float,
               log: Path | None = None) -> None:
    """Polls `predicate` while `proc` runs; fails (with the log's tail) if the process ends
    first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    tail = (lambda: "\n" + log.read_text()[-3000:]) if log is not None else (lambda: "")
    while not predicate():
        assert proc.poll() is None, "the run ended before the awaited point" + tail()
        assert time.monotonic() < deadline, f"timed out after {timeout} s" + tail()
        time.sleep(0.01)


def signal_when(predicate, proc: subprocess.Popen, signum: int, *,
                timeout: float = 120) -> tuple[str, str]:
    """Waits (wait_until) for `predicate`, sends `signum` to the run and returns its
    (stdout, stderr); the process is killed whatever happens, so no test leaves it behind."""
    try:
        wait_until(predicate, proc, timeout=timeout)
        proc.send_signal(signum)
        return proc.communicate(timeout=60)
    finally:
        proc.kill()


@pytest.fixture(autouse=True)
def _one_torch_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("tiny") / "ds")


@pytest.fixture
@heavy_fixture
def cli(capsys):
    """Runs `turbotrain ARGS` in this process; returns (exit code, stdout, stderr)."""
    def run(*args):
        code = turbotrain_main([*map(str, args)])
        captured = capsys.readouterr()
        return code, captured.out, captured.err
    return run


@pytest.fixture
def train_cli(cli):
    """Runs `turbotrain train ARGS` in this process; returns (exit code, stdout, stderr)."""
    return lambda *args: cli("train", *args)


def train_subprocess(*args, **popen):
    """Starts `train ARGS` (with the in-test pipelines) in a child process."""
    return subprocess.Popen([sys.executable, "-m", "tests.train.run_with_test_pipelines",
                             *map(str, args)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


def step_losses(run_dir):
    return {r["step"]: r["loss"] for r in read_jsonl(Path(run_dir) / "metrics.jsonl")
            if r["kind"] == "step"}
