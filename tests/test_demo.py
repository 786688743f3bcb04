"""`turbotrain demo`: the whole main job (generate, prepare, train, report) at a tiny size.

The full-size demo (>= 90 % val accuracy) is what `make demo` runs; here it only has to work
end to end and report."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_demo_runs_end_to_end_and_reports(tmp_path):
    out = tmp_path / "demo"
    demo = [sys.executable, "-m", "turbotrain", "demo", "--out", str(out),
            "--train-per-class", "8", "--val-per-class", "2", "--size", "96x80", "--epochs", "1",
            "--train-arg=--threads=1", "--train-arg=--workers=1"]
    result = subprocess.run(demo, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stderr[-2000:]
    for line in ("val accuracy", "throughput", "data wait", "curves", "verdict"):
        assert line in result.stdout, result.stdout
    assert (out / "run" / "curves.png").is_file()
    assert (out / "prepared" / "dataset.json").is_file()
    # A rerun reuses the images and starts a fresh run instead of refusing the old one.
    again = subprocess.run(demo, capture_output=True, text=True, timeout=280)
    assert again.returncode == 0, again.stderr[-2000:]


def test_demo_rejects_a_bad_size(tmp_path):
    result = subprocess.run([sys.executable, "-m", "turbotrain", "demo", "--out", str(tmp_path),
                             "--size", "big"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "--size" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_demo_s_own_flags_replace_the_plan_s_and_train_args_come_last():
    import argparse
    from turbotrain.demo import _train_flags
    planned = ["--model=compact28", "--time-budget=80s", "--target-accuracy=0.98"]
    args = argparse.Namespace(time_budget="30s", target_accuracy="1", epochs=None,
                              train_arg=["--target-accuracy=0.9"])
    assert _train_flags(planned, args) == ["--model=compact28", "--time-budget=30s",
                                           "--target-accuracy=1", "--target-accuracy=0.9"]
    plain = argparse.Namespace(time_budget=None, target_accuracy=None, epochs=3, train_arg=[])
    assert _train_flags(planned, plain) == [*planned, "--epochs", "3"]


@pytest.mark.parametrize("summary, said", [
    ({"outcome": "target_accuracy", "target_reached_epoch": 6, "target_accuracy": 0.98,
      "time_budget_seconds": 80.0},
     " (stopped at epoch 6: val accuracy reached the 98 % target; time budget 80 s)"),
    ({"outcome": "time_budget", "time_budget_seconds": 90.0}, " (time budget 90 s)"),
    ({"outcome": "completed"}, "")])
def test_the_report_says_why_the_training_ended(summary, said):
    from turbotrain.demo import _why_it_ended
    assert _why_it_ended(summary) == said
