"""`train --mixup --cutmix --clip-grad --scale --ratio` end to end: the flags reach the step, are
saved in config.yaml and kept by --resume, and a run killed with SIGKILL and resumed logs the
same losses as one that never stopped (the mixing is a function of the position, not of an RNG
state)."""
from __future__ import annotations

import signal

import pytest
import torch

from turbotrain.train.config.config_files import load_yaml
from turbotrain.train.records.checkpoint import checkpoint_path
from turbotrain.train.step import mixing

from ..conftest import (FAST, logged_steps, read_jsonl, signal_when, step_losses,
                        train_subprocess)

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast

MIX = ("--mixup", "0.2", "--cutmix", "1.0", "--clip-grad", "1.0", "--scale", "0.5", "1",
       "--ratio", "0.8", "1.25")
# test-slow: 50 ms a micro-batch, time to kill between checkpoints. 96 images / 8 / 2 = 6 steps
# an epoch; checkpoints every 2 steps, so the kill lands mid-epoch.
ARGS = ("--pipeline", "test-slow", "--epochs", 2, "--batch-size", 8, "--accum-steps", 2,
        "--log-every", 1, "--checkpoint-every", 2, "--threads", 1, "--workers", 0,
        "--deterministic", "--lr", "0.1", "--device", "cpu", *MIX)
TOTAL_STEPS = 12


def test_the_trainer_mixes_each_micro_batch_by_its_position(train_cli, tiny_dataset, tmp_path,
                                                            monkeypatch):
    seen = []
    original = mixing.Mixer.__call__

    def spy(self, images, labels, *, epoch, micro):
        seen.append((epoch, micro))
        return original(self, images, labels, epoch=epoch, micro=micro)
    monkeypatch.setattr(mixing.Mixer, "__call__", spy)
    code, _, err = train_cli("--data", tiny_dataset, "--out", tmp_path / "run", "--max-steps", 3,
                             "--batch-size", 8, "--accum-steps", 2, *MIX, *FAST)
    assert code == 0, err
    assert seen == [(0, m) for m in range(6)]
    assert all("grad_norm" in r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")
               if r["kind"] == "step")


def _checkpoint_step(run_dir) -> int:
    try:
        return torch.load(checkpoint_path(run_dir), weights_only=False)["counters"]["step"]
    except (FileNotFoundError, EOFError, RuntimeError):
        return -1


def _run_to_end(*args):
    proc = train_subprocess(*args)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err


@pytest.mark.timeout(300)
def test_resume_after_kill_repeats_the_mixed_losses(tiny_dataset, tmp_path):
    full = tmp_path / "full"
    _run_to_end("--data", tiny_dataset, "--out", full, *ARGS)
    assert sorted(step_losses(full)) == list(range(1, TOTAL_STEPS + 1))

    killed = tmp_path / "killed"
    proc = train_subprocess("--data", tiny_dataset, "--out", killed, *ARGS)
    signal_when(lambda: _checkpoint_step(killed) >= 2 and logged_steps(killed) >= 3, proc,
                signal.SIGKILL)
    assert logged_steps(killed) < TOTAL_STEPS
    _run_to_end("--out", killed, "--resume")  # every other setting comes from config.yaml
    assert step_losses(killed) == step_losses(full)

    saved = load_yaml(killed / "config.yaml")
    assert (saved["mixup"], saved["cutmix"], saved["clip_grad"]) == (0.2, 1.0, 1.0)
    assert saved["scale"] == (0.5, 1.0) and saved["ratio"] == (0.8, 1.25)
    norms = [r["grad_norm"] for r in read_jsonl(killed / "metrics.jsonl") if r["kind"] == "step"]
    assert len(norms) == TOTAL_STEPS and all(n > 0 for n in norms)
