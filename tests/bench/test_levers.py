"""bench/bench_levers.py's arithmetic: the target is the fixed arm's last accuracy, the speedup
the fixed arm's seconds to it over the levers', the goals as the Goals table reads them."""
from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import bench_levers as levers  # noqa: E402


def _arm(curve, eval_seconds=1.0):
    return {"curve": [[t, a, None] for t, a in curve], "final_accuracy": curve[-1][1],
            "eval_seconds": eval_seconds, "wall_seconds": curve[-1][0] + 1,
            "settings": {"model": "m", "image_size": 128, "eval_res": 160, "tta": True}}


def test_the_levers_time_to_the_fixed_arms_final_accuracy():
    fixed = _arm([(10, 0.80), (20, 0.88), (30, 0.90)])
    ours = _arm([(11, 0.86), (21, 0.905), (31, 0.91)])
    pair = levers.compare(fixed, ours)
    assert pair["target"] == 0.90 and pair["levers_seconds"] == 21 and pair["fixed_seconds"] == 30
    assert abs(pair["speedup"] - 30 / 21) < 1e-12
    assert abs(pair["accuracy_difference"] - 0.01) < 1e-12
    never = levers.compare(fixed, _arm([(10, 0.5), (20, 0.6)]))
    assert never["levers_seconds"] is None and never["speedup"] is None
    assert "error" in levers.compare({"error": "train exited 1"}, ours)


def test_fixed_flags_turn_every_lever_off():
    assert levers.fixed_flags(128, progressive=True) == ["--no-progressive", "--no-tta",
                                                        "--eval-res", "128"]
    assert levers.fixed_flags(28, progressive=False) == ["--no-tta", "--eval-res", "28"]


def test_goals_and_the_table():
    case = {"epochs": 3, "speedup": 1.6, "accuracy_difference": -0.004,
            "eval_seconds": {"levers": 2.0, "fixed": 1.0},
            "levers": [_arm([(10, 0.9)])], "fixed": [_arm([(10, 0.9)])]}
    report = {"photos": case, "fashion": {**case, "speedup": 1.1, "accuracy_difference": 0.0}}
    goals = {g["what"].split(":")[0] + (" accuracy" if "final" in g["what"] else ""): g["met"]
             for g in levers.goals(report)}
    assert goals == {"photos": True, "photos accuracy": False, "fashion": False,
                     "fashion accuracy": True}
    text = levers.markdown(report)
    assert "photos: **1.60x**" in text and "-0.40 pt" in text and "| photos | levers |" in text
