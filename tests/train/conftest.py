import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from turbotrain.cli import main as turbotrain_main

from . import memory_pipeline  # noqa: F401  (registers test-memory and test-slow)
from .tiny_data import write_tiny_dataset

REPO = Path(__file__).resolve().parents[2]

# Every test run: one torch thread, no worker threads, so tests never fight the other work on
# the 2-core box; the in-test pipeline; a short log interval.
FAST = ["--threads", "1", "--workers", "0", "--pipeline", "test-memory", "--log-every", "1"]


def logged_steps(run_dir: Path) -> int:
    """The last optimizer step logged in RUNDIR/metrics.jsonl (0 before the first)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    steps = [0]
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line).get("step", 0))
        except json.JSONDecodeError:  # a line being written
            pass
    return max(steps)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("tiny") / "ds")


@pytest.fixture
def train_cli(capsys):
    """Runs `turbotrain train ARGS` in this process; returns (exit code, stdout, stderr)."""
    def run(*args):
        code = turbotrain_main(["train", *map(str, args)])
        captured = capsys.readouterr()
        return code, captured.out, captured.err
    return run


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
