"""Convergence on real data with the real flow and the default recipe: Fashion-MNIST
(Debian's dataset-fashion-mnist) through `prepare-dataset`, then `train` with the `pytorch`
pipeline, reaches >= 88% val accuracy within 2 epochs (about 90%: ~90 s on a 2-core CPU with native bf16,
~300 s in fp32 on one without)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import expect
from tests.expect import FASHION_MNIST as FASHION

from ..conftest import REPO

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast


def turbotrain(*args, timeout):
    result = subprocess.run([sys.executable, "-m", "turbotrain", *map(str, args)], cwd=REPO,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    return result.stdout


@pytest.mark.slow
@pytest.mark.timeout(560)
def test_fashion_mnist_reaches_88_percent_in_2_epochs(tmp_path):
    expect.need("fashion_mnist")
    data = tmp_path / "fashion"
    turbotrain("prepare", FASHION, data, timeout=120)
    out = tmp_path / "run"
    # Every other setting is the default: model, image size, batch, LR, warm-up, precision.
    stdout = turbotrain("train", "--data", data, "--pipeline", "pytorch", "--epochs", 2,
                        "--out", out, "--threads", 1, "--workers", 1, timeout=400)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["epochs"] == 2
    assert summary["val_accuracy"] >= 0.88, stdout[-2000:]
