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
