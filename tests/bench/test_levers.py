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
    assert "photos: **1.60x**" in text and "-0.40 pt" in text and "| photos | levers | 0 |" in text


def test_round_r_is_seed_r_in_every_arm_and_an_extra_arm_is_compared_too(monkeypatch, tmp_path):
    flags_run = []
    final = {"levers": 0.91, "fixed": 0.90, "levers_progressive": 0.89}

    def run_arm(data, out, flags, timeout):
        flags_run.append(flags)
        arm = out.name.split("-", 1)[1]
        return _arm([(10, 0.5), (20, final[arm])])
    monkeypatch.setattr(levers, "run_arm", run_arm)
    case = levers.run_case("fashion", tmp_path, [], 28, 4, 2, True, tmp_path, 60,
                           {"levers_progressive": ["--progressive"]})
    seeds = [f[f.index("--seed") + 1] for f in flags_run]
    assert sorted(seeds) == ["0", "0", "0", "1", "1", "1"]  # 3 arms x 2 rounds
    assert sum("--progressive" in f for f in flags_run) == 2  # the extra arm, each round
    assert case["speedup"] == 1.0 and case["levers_progressive_speedup"] is None
    assert abs(case["levers_progressive_accuracy_difference"] + 0.01) < 1e-12
    text = levers.markdown({"fashion": case})
    assert "| fashion | levers_progressive | 1 |" in text
    assert "fashion, progressive resizing turned on (--progressive): n/a sooner, final " \
           "accuracy -1.00 pt" in text
