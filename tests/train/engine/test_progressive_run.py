"""`train` with progressive resizing end to end: each epoch trains at its size, which
metrics.jsonl, summary.json and the timeline record, and a run killed mid-epoch before the size
changes resumes with the same per-step losses, bit for bit, across the change."""
from __future__ import annotations

import json
import signal

import pytest
import torch

from turbotrain.train.records.checkpoint import checkpoint_path
from turbotrain.train.records.report import read_metrics, size_starts

from ..conftest import logged_steps, signal_when, step_losses, train_subprocess
from ..tiny_data import write_tiny_dataset

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("child_processes")]

# 72 px raw images are photos to the pipelines (> 64 px): resized crops, which a schedule
# resizes to 16 px up to its ramp's start (epoch 1) and to 32 px from its end (epoch 2) on.
ARGS = ("--pipeline", "pytorch", "--model", "airbench", "--image-size", 32, "--min-res", 16,
        "--res-ramp", 1, 2, "--epochs", 3, "--batch-size", 8, "--log-every", 1,
        "--checkpoint-every", 5, "--threads", 1, "--workers", 1, "--deterministic",
        "--lr", "0.05", "--device", "cpu")
STEPS_PER_EPOCH = 12  # 96 images / 8
SIZES = [16, 16, 32]


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("photos72") / "ds", size=72)


def test_each_epoch_is_recorded_at_its_size(photos, tmp_path, train_cli):
    out = tmp_path / "run"
    code, stdout, err = train_cli("--data", photos, "--out", out, *ARGS)
    assert code == 0, err
    assert "progressive: 16 -> 32 px between epochs 1 and 2" in stdout
    assert "epoch 2 (16 px) step 24" in stdout + err and "epoch 3 (32 px)" in stdout + err
    records = read_metrics(out)
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert [r["image_size"] for r in epochs] == SIZES
    steps = [r for r in records if r["kind"] == "step"]
    assert {r["image_size"] for r in steps if r["epoch"] == 0} == {16}
    assert {r["image_size"] for r in steps if r["epoch"] == 2} == {32}
    assert size_starts(epochs, "epoch_float") == [(0.0, 16), (2.0, 32)]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["epoch_sizes"] == SIZES and summary["image_size"] == 32
    timeline = torch.load(checkpoint_path(out), weights_only=True)["timeline"]
    assert timeline["sizes"] == [[1, 16], [2 * STEPS_PER_EPOCH + 1, 32]]
    assert "min-res: 16" in (out / "config.yaml").read_text()


def _checkpoint_step(run_dir) -> int:
    try:
        return torch.load(checkpoint_path(run_dir), weights_only=False)["counters"]["step"]
    except (FileNotFoundError, EOFError, RuntimeError, KeyError):
        return -1


def _run_to_end(*args):
    proc = train_subprocess(*args)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err


@pytest.mark.slow
def test_a_run_killed_before_the_size_changes_resumes_the_same(photos, tmp_path):
    full = tmp_path / "full"
    _run_to_end("--data", photos, "--out", full, *ARGS)
    total = len(SIZES) * STEPS_PER_EPOCH
    assert sorted(step_losses(full)) == list(range(1, total + 1))

    killed = tmp_path / "killed"
    proc = train_subprocess("--data", photos, "--out", killed, *ARGS)
    signal_when(lambda: _checkpoint_step(killed) >= 5 and logged_steps(killed) >= 7, proc,
                signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert 7 <= logged_steps(killed) < STEPS_PER_EPOCH  # in the first 16 px epoch
    _run_to_end("--out", killed, "--resume")
    assert step_losses(killed) == step_losses(full)
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["epoch_sizes"] == SIZES
