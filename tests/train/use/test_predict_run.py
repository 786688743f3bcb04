"""`predict --run` on a small run (issue 36): the run's precision is taken only where it is not
emulated (a bf16 run predicted on a CPU without native bf16 runs in fp32, 3-6x faster there,
and says so; bf16 asked for is kept, with a warning), and a CSV list may name files by absolute
path."""
from __future__ import annotations

import numpy as np
import pytest

from turbotrain.train.plan import hardware

from ..conftest import FAST


@pytest.fixture(scope="module")
def bf16_run(tiny_dataset, tmp_path_factory):
    """A 1-step run whose config.yaml says it trained in bf16, and two images to predict."""
    from PIL import Image

    from turbotrain.cli import main
    root = tmp_path_factory.mktemp("bf16")
    run = root / "run"
    assert main(["train", "--data", str(tiny_dataset), "--out", str(run), "--epochs", "1",
                 "--max-steps", "1", "--batch-size", "8", "--precision", "bf16", "--device",
                 "cpu", *FAST]) == 0
    assert "precision: bf16" in (run / "config.yaml").read_text()
    for i in range(2):
        Image.fromarray(np.full((16, 16, 3), 90 * i, np.uint8)).save(root / f"{i}.png")
    return run, root


@pytest.mark.parametrize("native", [False, True])
def test_predict_does_not_inherit_an_emulated_precision(cli, bf16_run, monkeypatch, native):
    run, images = bf16_run
    monkeypatch.setattr(hardware, "cpu_native_bf16", lambda: native)
    code, _, err = cli("predict", "--run", run, images / "0.png", images / "1.png",
                       "--device", "cpu")
    assert code == 0, err
    described = next(line for line in err.splitlines() if "loaded in" in line)
    if native:
        assert "cpu, bf16" in described and "note" not in err
    else:
        assert ("turbotrain predict: note: the run's precision bf16 is emulated on this CPU "
                "(3-6x slower than fp32); running in fp32 (--precision bf16 keeps the run's)"
                in err.splitlines())
        assert "cpu, fp32" in described


def test_an_emulated_precision_asked_for_is_kept_with_a_warning(cli, bf16_run, monkeypatch):
    run, images = bf16_run
    monkeypatch.setattr(hardware, "cpu_native_bf16", lambda: False)
    code, _, err = cli("predict", "--run", run, images / "0.png", "--device", "cpu",
                       "--precision", "bf16")
    assert code == 0, err
    assert ("turbotrain predict: warning: --precision bf16 is 3-6x slower than fp32 here: this "
            "CPU has no native bf16 (avx512_bf16/amx_bf16); use --precision auto or fp32"
            in err.splitlines())
    assert "cpu, bf16" in next(line for line in err.splitlines() if "loaded in" in line)


def test_a_csv_of_absolute_paths_is_read_as_written(cli, bf16_run, tmp_path):
    """A list the user wrote names files as the command line does: absolute rows are read as
    they are; a relative row still resolves from the list's folder and may not leave it."""
    run, images = bf16_run
    listed = tmp_path / "list.csv"
    listed.write_text(f"path\n{images / '1.png'}\n{images / '0.png'}\n")
    code, stdout, err = cli("predict", "--run", run, listed, "--device", "cpu", "--top-k", 1)
    assert code == 0, err
    assert [row.split(",")[0] for row in stdout.splitlines()] == [
        "path", str(images / "1.png"), str(images / "0.png")]
    (tmp_path / "escape.csv").write_text(f"path\n../{images.name}/0.png\n")
    code, stdout, err = cli("predict", "--run", run, tmp_path / "escape.csv", "--device", "cpu")
    assert code == 2 and "outside the source folder" in err and "--allow-outside-root" in err
