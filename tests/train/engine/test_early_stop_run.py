"""Early stopping and the learning-curve advice through the real `train` command: the tiny
dataset reaches 100 % val accuracy at its first epoch (deterministic under the seed)."""
from __future__ import annotations

import json

from turbotrain.train.config.config_files import load_yaml

from ..conftest import FAST, read_jsonl


def test_without_epochs_a_run_stops_when_val_accuracy_cannot_improve(train_cli, tiny_dataset,
                                                                      tmp_path):
    out = tmp_path / "run"
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", out, "--batch-size", 8,
                                  "--lr", "0.1", *FAST)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    epochs = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "epoch"]
    assert epochs[-1]["val_accuracy"] == 1.0 and len(epochs) < 10
    assert summary["outcome"] == "early_stop" and summary["early_stop_epoch"] == len(epochs)
    assert summary["steps"] == 12 * len(epochs)
    assert "reached 100 %" in summary["early_stop_reason"]
    assert summary["decisions"]["early_stop"].startswith("True: no --epochs")
    assert f"early stop after epoch {len(epochs)} of 10" in stdout
    assert [r["reason"] for r in read_jsonl(out / "metrics.jsonl")
            if r["kind"] == "stop"] == ["early_stop"]
    # config.yaml reruns the same run: 10 epochs with the early stop.
    saved = load_yaml(out / "config.yaml")
    assert saved["epochs"] == 10 and saved["early_stop"] is True


def test_given_epochs_are_trained_and_the_advice_reads_the_curve(train_cli, tiny_dataset,
                                                                  tmp_path):
    out = tmp_path / "run"
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", out, "--batch-size", 8,
                                  "--lr", "0.1", "--epochs", 3, *FAST)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    accuracies = [r["val_accuracy"] for r in read_jsonl(out / "metrics.jsonl")
                  if r["kind"] == "epoch"]
    assert summary["outcome"] == "completed" and len(accuracies) == 3
    best = accuracies.index(max(accuracies)) + 1
    assert best < 3  # the curve's best came early: the end says so, with the flags
    advice = (f"val accuracy reached its best ({max(accuracies):.2%}) at epoch {best} of 3: "
              f"`--epochs {best}` or `--target-accuracy")
    assert advice in stdout and summary["curve_advice"].startswith(advice)
    assert "early_stop_epoch" not in summary


def test_no_early_stop_or_max_steps_train_the_whole_length(train_cli, tiny_dataset, tmp_path):
    for flags in (["--no-early-stop", "--max-steps", 36], ["--max-steps", 36]):
        out = tmp_path / "-".join(map(str, flags))
        code, _, err = train_cli("--data", tiny_dataset, "--out", out, "--batch-size", 8,
                                 "--lr", "0.1", *flags, *FAST)
        assert code == 0, err
        summary = json.loads((out / "summary.json").read_text())
        assert summary["steps"] == 36 and summary["outcome"] == "max_steps", flags
