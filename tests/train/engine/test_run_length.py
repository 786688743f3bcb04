"""--time-budget and --target-accuracy through the real `train` command on a tiny dataset."""
from __future__ import annotations

import json

import torch

from turbotrain.train.records import checkpoint as ckpt

from ..conftest import FAST, read_jsonl

SLOW = [a if a != "test-memory" else "test-slow" for a in FAST]  # >= 50 ms a step


def test_a_time_budget_sizes_the_run_and_its_schedule_ends_on_time(train_cli, tiny_dataset,
                                                                   tmp_path):
    out = tmp_path / "run"
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", out, "--batch-size", 8,
                                  "--time-budget", "12s", "--lr", "0.1", *SLOW)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcome"] == "time_budget" and summary["time_budget_seconds"] == 12.0
    # Sized, not cut: fewer than the 1,000 epochs a budget without --epochs allows, yet more
    # than a few steps of 12 a epoch; the run's own time stays near the budget.
    assert 12 < summary["steps"] < 1000 * 12
    assert "fit in the 12 s budget" in summary["budget_reason"]
    assert "time budget 12 s: used" in stdout and "its LR schedule re-planned" in stdout
    steps = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "step"]
    # On time, unless the start-up alone ate most of the budget (10 s of the 12 under a busy
    # pytest -n 2; the sizing then has nothing left to size).
    if steps[0]["time"] < 4:
        assert summary["wall_seconds"] < 12 * 1.25, summary["wall_seconds"]
    # The schedule was planned for that length: its last step's LR is the decay's end, not a
    # cosine cut off half-way.
    peak = max(r["lr"] for r in steps)
    assert steps[-1]["step"] == summary["steps"] and steps[-1]["lr"] < 0.05 * peak
    assert [r["reason"] for r in read_jsonl(out / "metrics.jsonl")
            if r["kind"] == "stop"] == ["time_budget"]
    # The fitted length is in the checkpoint, for a resumed run to keep.
    state = torch.load(ckpt.checkpoint_path(out), weights_only=False)
    assert state["counters"]["budget_total_steps"] == summary["steps"]


def test_epochs_cap_a_time_budget(train_cli, tiny_dataset, tmp_path):
    out = tmp_path / "run"
    code, _, err = train_cli("--data", tiny_dataset, "--out", out, "--batch-size", 8,
                             "--epochs", 2, "--time-budget", "10m", *FAST)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 24 and "the run's 24 steps fit" in summary["budget_reason"]


def test_a_target_accuracy_stops_the_run_at_the_first_evaluation_reaching_it(
        train_cli, tiny_dataset, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", out, "--batch-size", 8,
                                  "--epochs", 30, "--lr", "0.1", "--target-accuracy", "0.9",
                                  *FAST)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    records = read_jsonl(out / "metrics.jsonl")
    accuracies = [r["val_accuracy"] for r in records if r["kind"] == "epoch"]
    # Stopped at the first epoch at or above the target, well before the 30 epochs.
    assert accuracies[-1] >= 0.9 and all(a < 0.9 for a in accuracies[:-1])
    assert summary["outcome"] == "target_accuracy" and summary["schedule_cut"] is True
    assert summary["target_reached_epoch"] == len(accuracies) < 30
    assert summary["steps"] == 12 * len(accuracies)
    assert f"reached at epoch {len(accuracies)}" in stdout and "cut short" in stdout
    assert [r["reason"] for r in records if r["kind"] == "stop"] == ["target_accuracy"]
    assert (out / "curves.png").is_file() and (out / "timeline.png").is_file()


def test_a_target_reached_while_the_budget_s_pace_is_measured_says_so(train_cli, tiny_dataset,
                                                                      tmp_path):
    """The demo's case: the target comes before the budget has timed enough steps to size the
    run. The lines name the provisional schedule it stopped in, not the 1,000 epochs a budget
    allows, and say that the pace was still being measured."""
    out = tmp_path / "run"
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", out, "--batch-size", 8,
                                  "--time-budget", "60s", "--lr", "0.1",
                                  "--target-accuracy", "0.9", *FAST)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    # 36 steps of this tiny net: well inside the 4.8 s (8 % of 60 s) the pace is timed for.
    assert summary["outcome"] == "target_accuracy"
    assert summary["budget_reason"] == ("the run ended while its pace was still being measured "
                                        "(the budget's first 8%, 2 s at least)")
    line = next(x for x in stdout.splitlines() if x.startswith("target accuracy"))
    assert "steps so far, the budget's pace still measured) cut short" in line, line
    provisional = int(line.split("LR schedule (")[1].split()[0])
    assert summary["steps"] <= provisional <= 1000 * 12, line  # sized from the pace so far


def test_a_target_out_of_range_is_one_line(train_cli, tiny_dataset, tmp_path):
    code, _, err = train_cli("--data", tiny_dataset, "--out", tmp_path / "run",
                             "--target-accuracy", "95", *FAST)
    assert code == 2
    assert err.strip() == ("train: error: --target-accuracy must be in (0, 1] (0.95 is 95%), "
                           "not 95.0")
