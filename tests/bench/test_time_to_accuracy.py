"""bench/bench_time_to_accuracy.py: the speedup against a user's recipe, the metrics parsing,
the summary line, and its --quick run end to end (both sides, the plot, the section)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests import expect

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_time_to_accuracy as tta  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_user_recipe_speedup_is_exact_or_a_lower_bound():
    reached = {"seconds_to_target": 100.0, "curve": [[50.0, 0.88], [100.0, 0.9]]}
    assert tta.user_recipe_speedup(reached, 25.0) == {
        "speedup_vs_user_recipe": 4.0, "speedup_vs_user_recipe_is_lower_bound": False}
    # Never reached: its whole training time over ours is the most it can be held to.
    missed = {"seconds_to_target": None, "curve": [[50.0, 0.8], [150.0, 0.89]]}
    assert tta.user_recipe_speedup(missed, 30.0) == {
        "speedup_vs_user_recipe": 5.0, "speedup_vs_user_recipe_is_lower_bound": True}
    assert tta.user_recipe_speedup(missed, None)["speedup_vs_user_recipe"] is None


def test_time_to_target_parsing_of_a_metrics_file(tmp_path):
    lines = [{"kind": "step", "epoch": 0, "step": 20, "loss": 1.8, "time": 8.0},
             {"kind": "epoch", "epoch": 0, "step": 469, "val_accuracy": 0.871, "time": 40.2},
             {"kind": "epoch", "epoch": 1, "step": 938, "val_accuracy": 0.9004, "time": 80.7},
             {"kind": "epoch", "epoch": 2, "step": 1407, "val_accuracy": 0.8999, "time": 120.0}]
    text = "\n".join(json.dumps(line) for line in lines) + "\n{\"kind\": \"epo"  # torn last line
    (tmp_path / "metrics.jsonl").write_text(text)
    records = tta.epoch_records(tmp_path)
    assert [r["epoch"] for r in records] == [0, 1, 2]
    assert tta.first_reaching(records, 0.9) == (80.7, 2)
    assert tta.first_reaching(records, 0.95) == (None, None)
    assert tta.curve(records) == [[40.2, 0.871], [80.7, 0.9004], [120.0, 0.8999]]
    assert tta.seconds_per_epoch(records) == pytest.approx((120.0 - 40.2) / 2)
    assert tta.seconds_per_epoch(records[:1]) == 40.2 and tta.seconds_per_epoch([]) is None
    assert tta.epoch_records(tmp_path / "absent") == []


def test_time_to_target_summary_line_and_fastest_round():
    ours = [{"seconds_to_target": 90.0, "epochs_to_target": 2, "final_accuracy": 0.91},
            {"seconds_to_target": 80.0, "epochs_to_target": 2, "final_accuracy": 0.912}]
    best = tta.fastest(ours)
    assert best["seconds_to_target"] == 80.0 and best["rounds_seconds_to_target"] == [90.0, 80.0]
    line = tta.summary_line({
        "target": 0.9, "epochs": 3, "speedup": 3.5, "speedup_with_prepare": 3.3,
        "turbotrain": {**best, "prepare_seconds": 5.0},
        "plain_pytorch": {"seconds_to_target": 280.0, "epochs_to_target": 2,
                          "final_accuracy": 0.91}})
    assert "turbotrain 80.0 s (2 epochs" in line and "speedup 3.50x" in line and "met" in line
    assert "per epoch" not in line  # not in the report: not said
    missed = tta.summary_line({
        "target": 0.9, "epochs": 3, "speedup": None, "speedup_with_prepare": None,
        "turbotrain": {**best, "prepare_seconds": 5.0},
        "plain_pytorch": {"seconds_to_target": None, "epochs_to_target": None,
                          "final_accuracy": 0.88}})
    assert "plain PyTorch did not reach 90% in 3 epochs (final 88.00%)" in missed
    assert "speedup n/a" in missed


@pytest.mark.usefixtures("child_processes")
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_time_to_accuracy_quick_runs_both_sides_end_to_end(tmp_path):
    """~30 s on a quiet 2-core machine; minutes when the machine is busy."""
    expect.need("fashion_mnist")
    out = tmp_path / "tta.json"
    assert tta.main(["--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["quick"] and result["train_images"] == tta.QUICK["train"]
    for side in ("turbotrain", "plain_pytorch", "plain_pytorch_user_recipe"):
        r = result[side]
        assert 0.2 < r["final_accuracy"] <= 1.0  # learnt something in 15 steps
        assert r["images_per_second"] > 0 and len(r["curve"]) == result["epochs"]
    assert result["turbotrain"]["settings"]["precision"] in ("bf16", "fp32")
    assert result["turbotrain"]["prepare_seconds"] > 0
    assert (tmp_path / result["plot"]).read_bytes()[:4] == b"\x89PNG"
    assert "Smoke run (--quick)" in tta.markdown(result)
