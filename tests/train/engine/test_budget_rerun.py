"""A --time-budget run's config.yaml reruns the same run (issue 46, item 1).

Both runs go through the real `train` command on a simulated clock (the approach of
test_budget_keeps_time.py): each optimizer step takes STEP_S and each evaluation EVAL_S, so the
budget times the same pace and sizes both runs alike; what could differ is only what
config.yaml tells the rerun. It once saved the warm-up planned for the 1,000 epochs a budget
allows (5 %, 600 steps here) as if asked for, and the rerun's LR crawled up a 600-step ramp
that the first run, sized to ~60 steps, had replaced with a 3-step one.
"""
from __future__ import annotations

import json
import types

import pytest

from turbotrain.train.config.config_files import load_yaml
from turbotrain.train.engine import run_length, trainer
from turbotrain.train.engine.run_length import RunLength

from ..conftest import FAST, read_jsonl

START_S = 1.0  # start-up before the first step
STEP_S = 0.25
EVAL_S = 0.05


@pytest.fixture
def simulated_clock(monkeypatch):
    """The budget's clock reads START_S + STEP_S per step taken + EVAL_S per evaluation."""
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(run_length, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    step_done = RunLength.step_done

    def on_the_clock(self, c, process_steps, elapsed, sync):
        clock.now = START_S + STEP_S * c.step + c.eval_seconds
        return step_done(self, c, process_steps, lambda: clock.now, sync)

    monkeypatch.setattr(RunLength, "step_done", on_the_clock)
    evaluate = trainer.evaluate

    def evaluate_in_eval_s(*args, **kwargs):
        return {**evaluate(*args, **kwargs), "eval_seconds": EVAL_S}

    monkeypatch.setattr(trainer, "evaluate", evaluate_in_eval_s)


def _lrs(run_dir) -> list[tuple[int, float]]:
    return [(r["step"], r["lr"]) for r in read_jsonl(run_dir / "metrics.jsonl")
            if r["kind"] == "step"]


def test_a_budgeted_run_reruns_from_its_config_with_the_same_schedule(
        train_cli, tiny_dataset, tmp_path, simulated_clock):
    first, rerun = tmp_path / "first", tmp_path / "rerun"
    code, _, err = train_cli("--data", tiny_dataset, "--out", first, "--batch-size", 8,
                             "--time-budget", "20s", "--lr", "0.1", *FAST)
    assert code == 0, err
    summary = json.loads((first / "summary.json").read_text())
    assert summary["outcome"] == "time_budget" and 24 < summary["steps"] < 120

    code, _, err = train_cli("--config", first / "config.yaml", "--out", rerun)
    assert code == 0, err
    assert json.loads((rerun / "summary.json").read_text())["steps"] == summary["steps"]
    assert _lrs(rerun) == _lrs(first)
    peak = max(lr for _, lr in _lrs(first))
    assert peak == pytest.approx(0.1)  # the warm-up was fitted to the run: the peak reached
    saved = load_yaml(first / "config.yaml")
    # The budget and the user's settings, not the placeholders planned before the sizing.
    assert saved["time_budget"] == 20.0 and saved["lr"] == 0.1
    assert "warmup_steps" not in saved and "epochs" not in saved
    assert "left to --time-budget" in (first / "config.yaml").read_text()
    assert load_yaml(rerun / "config.yaml") == {**saved, "out": str(rerun)}


def test_a_budget_with_epochs_and_a_warmup_given_saves_them(train_cli, tiny_dataset, tmp_path,
                                                          simulated_clock):
    """What the user gave is theirs: saved, and the rerun keeps it."""
    out = tmp_path / "run"
    code, _, err = train_cli("--data", tiny_dataset, "--out", out, "--batch-size", 8,
                             "--time-budget", "20s", "--epochs", 2, "--warmup-steps", 4,
                             *FAST)
    assert code == 0, err
    saved = load_yaml(out / "config.yaml")
    assert (saved["epochs"], saved["warmup_steps"]) == (2, 4)
    assert "left to --time-budget" not in (out / "config.yaml").read_text()


def test_a_warmup_longer_than_the_sized_run_is_said(train_cli, tiny_dataset, tmp_path,
                                                    simulated_clock):
    """What a config.yaml written before the fix still holds (the warm-up planned for the
    1,000-epoch cap, 600 steps here), or a warm-up asked for that the budget makes too long:
    the sizing line says the LR never reaches its peak, and what to do."""
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", tmp_path / "run",
                                  "--batch-size", 8, "--time-budget", "20s",
                                  "--warmup-steps", 600, *FAST)
    assert code == 0, err
    line = next(x for x in stdout.splitlines() if x.startswith("time budget 20 s:"))
    assert line.endswith("; --warmup-steps 600 outlasts the run, so its LR never reaches the "
                         "peak: leave it out (auto: 5% of the sized run)"), line
