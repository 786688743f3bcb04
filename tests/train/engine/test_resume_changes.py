"""--resume with other settings is said, not silent (issue 46, item 4; resume_changes.py):
a changed --epochs names what it does to the LR schedule in one line, a run stopped at its
--target-accuracy is not silently "done" again when asked for more epochs, and the decision
lines name where each setting came from (this command, the saved run, the plan)."""
from __future__ import annotations

import json

import pytest

from turbotrain.train.config.config import TrainConfig
from turbotrain.train.config.config_files import load_yaml
from turbotrain.train.plan import decision
from turbotrain.train.step.schedule import lr_at

from ..conftest import FAST, read_jsonl

STEPS_PER_EPOCH = 12  # the tiny dataset at --batch-size 8


def _decision_lines(stdout: str) -> dict[str, str]:
    return dict(line.strip().split(": ", 1) for line in stdout.splitlines()
                if line.startswith("  ") and ": " in line and not line.startswith("   "))


def test_more_epochs_stretch_the_schedule_said_in_one_line_with_each_setting_s_source(
        train_cli, tiny_dataset, tmp_path):
    out = tmp_path / "run"
    code, _, err = train_cli("--data", tiny_dataset, "--out", out, "--batch-size", 8,
                             "--epochs", 2, "--lr", "0.1", "--warmup-steps", 3, *FAST)
    assert code == 0, err
    code, stdout, err = train_cli("--out", out, "--resume", "--epochs", 3,
                                  "--pipeline", "test-memory")
    assert code == 0, err
    # (b) The rest of the run is what --epochs 3 would have done from the start, and it says so.
    after = lr_at(24, total=36, warmup=3, kind="cosine", peak=0.1)
    before = lr_at(23, total=24, warmup=3, kind="cosine", peak=0.1)
    changed = [line for line in stdout.splitlines() if line.startswith("--epochs")]
    assert changed == [
        "--epochs 3 (was 2): the cosine LR schedule is stretched to end at epoch 3 (step 36): "
        f"the LR goes from {before:.4g}, where it stopped (step 24), up to {after:.4g}, the "
        "3-epoch schedule's LR there, then to 0"], stdout
    steps = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "step"]
    assert [r["step"] for r in steps][-12:] == list(range(25, 37))
    logged = {r["step"]: r["lr"] for r in steps}
    assert logged[25] == pytest.approx(lr_at(25, total=36, warmup=3, kind="cosine", peak=0.1))
    # (c) The settings lines: the one given now, the saved run's, the plan's own reasons.
    lines = _decision_lines(stdout)
    saved = f"kept from the saved run ({out / 'config.yaml'})"
    assert lines["pipeline"] == "test-memory: asked for in this command"
    assert lines["threads"].endswith(saved)  # --threads 1, given to the first command
    assert not [line for line in lines.values() if line.endswith(": asked for")], lines
    assert "this resume changes" not in stdout  # --epochs has its own line; nothing else

    # Another --lr and --weight-decay take effect (the restored optimizer brought the saved
    # ones back), and the line says what changed; another --optimizer is refused.
    decay = load_yaml(out / "config.yaml")["weight_decay"]
    code, stdout, err = train_cli("--out", out, "--resume", "--epochs", 4, "--lr", "0.05",
                                  "--weight-decay", "0.001")
    assert code == 0, err
    assert ("this resume changes the saved run's lr 0.1 -> 0.05, weight-decay "
            f"{decay} -> 0.001") in stdout.splitlines(), stdout
    logged = {r["step"]: r["lr"] for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "step"}
    assert logged[37] == pytest.approx(lr_at(37, total=48, warmup=3, kind="cosine", peak=0.05))
    code, _, err = train_cli("--out", out, "--resume", "--epochs", 5, "--optimizer", "adamw")
    assert code == 2 and err.strip().splitlines() == [
        f"train: error: --optimizer adamw: the run in {out} trained with sgd, whose state does "
        f"not carry over to adamw; resume with --optimizer sgd, or start a new run from its "
        f"weights: --out NEWDIR --init-from {out} --optimizer adamw"]


def test_a_run_stopped_at_its_target_says_what_to_pass_to_train_on(train_cli, tiny_dataset,
                                                                   tmp_path):
    out = tmp_path / "run"
    code, _, err = train_cli("--data", tiny_dataset, "--out", out, "--batch-size", 8,
                             "--epochs", 30, "--lr", "0.1", "--target-accuracy", "0.9", *FAST)
    assert code == 0, err
    done = json.loads((out / "summary.json").read_text())["target_reached_epoch"]
    saved = (out / "config.yaml").read_text()
    more = done + 1
    code, stdout, err = train_cli("--out", out, "--resume", "--epochs", more)
    assert code == 2 and "done:" not in stdout
    assert err.strip().splitlines() == [
        f"train: error: --epochs {more}: the run in {out} stopped after epoch {done}, whose "
        f"val_accuracy 100.00% reached --target-accuracy 90.00%, and it stops there whatever "
        f"--epochs says; to train on to epoch {more}, also pass --target-accuracy none"]
    assert (out / "config.yaml").read_text() == saved  # refused before it was rewritten
    # The same command as the run's (a requeued `--resume auto`) is still a quiet "done".
    code, stdout, err = train_cli("--out", out, "--resume", "auto", "--epochs", 30)
    assert code == 0 and "done:" in stdout, err
    code, stdout, err = train_cli("--out", out, "--resume", "--epochs", more,
                                  "--target-accuracy", "none")
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == more * STEPS_PER_EPOCH and summary["outcome"] == "completed"


def test_labelled_names_where_an_asked_for_setting_came_from():
    Decision, labelled = decision.Decision, decision.labelled
    decisions = {"pipeline": Decision("resident", "asked for"),
                 "threads": Decision("1 + 1", "asked for (oversubscribed: 2 + 1 > 2 cores)"),
                 "order": Decision("random", "the split fits in memory")}
    out = labelled(decisions, {"pipeline": "asked for in this command",
                               "workers": "kept from the saved run (R/config.yaml)",
                               "order": "kept from the saved run (R/config.yaml)"})
    assert out["pipeline"].reason == "asked for in this command"
    assert out["threads"].reason == ("kept from the saved run (R/config.yaml) (oversubscribed: "
                                     "2 + 1 > 2 cores)")
    assert out["order"].reason == "the split fits in memory"  # the plan's: its own reason
    assert labelled(decisions, {}) == decisions


def test_none_drops_a_setting_whose_default_is_none():
    from turbotrain.train.config.config_flags import parse_value
    assert parse_value("target_accuracy", "none") is None
    assert parse_value("time_budget", "None") is None
    assert TrainConfig(data="d").target_accuracy is None


def test_a_budgeted_run_resumed_as_it_was_is_neither_refused_nor_told_of_a_change(tmp_path):
    """Its checkpoint holds the epochs the budget sized (3), its config the 1,000-epoch cap a
    budget without --epochs plans with: no --epochs was changed (a requeued `--resume auto` of
    the demo's `--time-budget 60s --target-accuracy 0.9` must stay a quiet "done")."""
    from turbotrain.train.engine.resume_changes import check_target_stop, length_change
    from turbotrain.train.step.schedule import LRSchedule

    state = {"config": {"epochs": 3, "warmup_steps": 2},
             "counters": {"epoch": 3, "val": {"val_accuracy": 0.95}, "budget_total_steps": 36}}
    resumed = TrainConfig(data="d", time_budget=60.0, epochs=1000, target_accuracy=0.9)
    check_target_stop(state, resumed, tmp_path)  # no TrainError
    schedule = LRSchedule(total=36, warmup=2, kind="cosine")
    kwargs = dict(schedule=schedule, total_steps=36, steps_per_epoch=12, step=36, peak=0.1)
    assert length_change(state, resumed, budget_sized=True, **kwargs) is None
    # With --epochs given, the budget's length still holds; said in one line.
    line = length_change(state, resumed.replace(epochs=5), budget_sized=True, **kwargs)
    assert line == ("--epochs 5 (was 3): no change: --time-budget sized this run to 36 steps "
                    "and keeps that length on resume")
    # The same checkpoint without a budget: 5 epochs are more than the 3 it stopped at.
    with pytest.raises(Exception, match="also pass --target-accuracy none"):
        state["counters"]["budget_total_steps"] = -1
        check_target_stop(state, resumed.replace(time_budget=None, epochs=5), tmp_path)


def test_fewer_epochs_shrink_the_schedule_or_say_nothing_is_left():
    from turbotrain.train.engine.resume_changes import length_change
    from turbotrain.train.step.schedule import LRSchedule

    state = {"config": {"epochs": 10, "warmup_steps": 6, "schedule": "linear"}}
    config = TrainConfig(data="d", epochs=4, schedule="linear")
    schedule = LRSchedule(total=48, warmup=6, kind="linear")
    kwargs = dict(schedule=schedule, total_steps=48, steps_per_epoch=12, budget_sized=False,
                  peak=1.0)
    before = LRSchedule(total=120, warmup=6, kind="linear").lr(23)
    assert length_change(state, config, step=24, **kwargs) == (
        "--epochs 4 (was 10): the linear LR schedule is shrunk to end at epoch 4 (step 48): "
        f"the LR goes from {before:.4g}, where it stopped (step 24), down to "
        f"{schedule.lr(24):.4g}, the 4-epoch schedule's LR there, then to 0")
    ramped = config.replace(progressive=True, min_res=96, image_size=128, res_ramp=(4.0, 9.0))
    assert length_change(state, ramped, step=24, **kwargs).endswith(
        "then to 0; progressive resizing keeps its ramp (epochs 4-9)")
    assert length_change(state, config, step=60, **kwargs) == (
        "--epochs 4 (was 10): the run has already trained 60 steps (epoch 5): nothing left to "
        "train")
    assert length_change(state, config.replace(epochs=10), step=24, **kwargs) is None


def test_the_sources_of_settings_name_this_command_the_config_file_and_the_saved_run(tmp_path):
    from turbotrain.train.config.config_files import config_and_sources, save_yaml

    from ..config.test_config import parse

    save_yaml(TrainConfig(data="d", out=str(tmp_path), lr=0.2, batch_size=16), tmp_path /
              "config.yaml")
    extra = tmp_path / "extra.yaml"
    extra.write_text("ema: true\n")
    config, sources = config_and_sources(parse("--out", tmp_path, "--resume", "--config",
                                                extra, "--lr", "0.1"))
    assert (config.lr, config.batch_size, config.ema) == (0.1, 16, True)
    assert sources["lr"] == "asked for in this command"
    assert sources["batch_size"] == f"kept from the saved run ({tmp_path / 'config.yaml'})"
    assert sources["ema"] == f"from --config {extra}"
    # Flags alone: "asked for" needs no naming (the plan's lines stay as they were).
    assert config_and_sources(parse("--data", "d", "--lr", "0.1"))[1] == {}
