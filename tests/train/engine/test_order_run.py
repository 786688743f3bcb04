"""`train --order quasi-random` end to end: the decision is recorded, and a run killed with
SIGKILL mid-epoch resumes with the same per-step losses, bit for bit (as tests/train/
engine/test_resume.py checks for the random order), through a real pipeline that uses the order."""
from __future__ import annotations

import json
import signal

import pytest
import torch

from turbotrain.train.records.checkpoint import checkpoint_path

from ..conftest import logged_steps, signal_when, step_losses, train_subprocess

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("child_processes")]

# resnet18 at 64 px keeps a CPU step near 0.1 s, time enough to kill the run mid-epoch.
ARGS = ("--order", "quasi-random", "--order-window", 2, "--pipeline", "pytorch",
        "--model", "resnet18", "--image-size", 64, "--epochs", 2, "--batch-size", 8,
        "--log-every", 1, "--checkpoint-every", 5, "--threads", 1, "--workers", 1,
        "--deterministic", "--lr", "0.05", "--device", "cpu")
TOTAL_STEPS = 24  # 96 images / 8 x 2 epochs


def _run_to_end(*args):
    proc = train_subprocess(*args)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err


def _checkpoint_step(run_dir) -> int:
    try:
        return torch.load(checkpoint_path(run_dir), weights_only=False)["counters"]["step"]
    except (FileNotFoundError, EOFError, RuntimeError):
        return -1


@pytest.mark.slow
def test_quasi_random_run_resumes_with_the_same_losses(tiny_dataset, tmp_path):
    full = tmp_path / "full"
    _run_to_end("--data", tiny_dataset, "--out", full, *ARGS)
    summary = json.loads((full / "summary.json").read_text())
    assert summary["steps"] == TOTAL_STEPS
    assert summary["decisions"]["order"] == "quasi-random: asked for"
    assert "order: quasi-random" in (full / "config.yaml").read_text()
    assert sorted(step_losses(full)) == list(range(1, TOTAL_STEPS + 1))

    killed = tmp_path / "killed"
    proc = train_subprocess("--data", tiny_dataset, "--out", killed, *ARGS)
    signal_when(lambda: _checkpoint_step(killed) >= 5 and logged_steps(killed) >= 7, proc,
                signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert 7 <= logged_steps(killed) < TOTAL_STEPS
    _run_to_end("--out", killed, "--resume")
    assert step_losses(killed) == step_losses(full)
