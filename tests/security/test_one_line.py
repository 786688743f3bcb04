"""Inputs that used to end in a raw traceback end in one line naming the file or flag, exit
code 2: a config.yaml (read by eval --run and train --resume) holding a 5,000-digit integer or
nesting 200,000 deep, `--part 1/<5,000 digits>`, a `--cache-limit` that overflows a float.
Each through the real command in a confined child."""
from __future__ import annotations

import pytest

from tests.train.tiny_data import write_tiny_dataset

from .confined import run_confined, turbotrain
from .model_child import make_run, run_cli
from .train_child import FAST

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("child_processes")]

BAD_YAML = {
    "digits": "epochs: " + "9" * 5000 + "\n",
    "nesting": "data: " + "[" * 200_000 + "]" * 200_000 + "\n",
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("data") / "ds")


@pytest.mark.parametrize("content", list(BAD_YAML))
@pytest.mark.parametrize("command", ["eval", "train --resume"])
def test_a_config_yaml_that_python_cannot_read_is_one_line(dataset, tmp_path, content,
                                                           command):
    run = make_run(tmp_path / "run", dataset, [f"class{k}" for k in range(4)])
    (run / "checkpoint.pt").write_bytes(b"never read")
    (run / "config.yaml").write_text(BAD_YAML[content])
    if command == "eval":
        ran = run_cli("eval", "--run", run, "--device", "cpu", cwd=tmp_path)
        prefix = "turbotrain eval: error: "
    else:
        ran = run_cli("train", "--out", run, "--resume", *FAST, cwd=tmp_path)
        prefix = "train: error: "
    line = ran.error_line(prefix)
    assert line.startswith(f"{prefix}config {run / 'config.yaml'} is not valid YAML: ")


def test_a_part_number_of_5000_digits_is_one_line(tmp_path):
    ran = run_confined(turbotrain("prepare", tmp_path, tmp_path / "out", "--part",
                                  "1/" + "9" * 5000), address_space=2 << 30, timeout=60,
                       cwd=tmp_path)
    assert ran.error_line("prepare-dataset: error: ").startswith(
        "prepare-dataset: error: --part '1/99999")


def test_a_cache_limit_beyond_any_disk_is_one_line(tmp_path):
    ran = run_cli("train", "--data", "s3://bucket/ds", "--cache-limit", "9" * 400, *FAST,
                  cwd=tmp_path)
    assert ran.error_line("train: error: ").startswith("train: error: --cache-limit '9999")
