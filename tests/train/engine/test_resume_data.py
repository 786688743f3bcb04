"""`train --resume` with another `--data`: refused in one line that names the run's dataset and
classes and what to do (it was a state_dict message cut off after its first line), before the
run's config.yaml is rewritten. The refused command runs in a child process; the runs it
refuses to continue are trained in this one (seconds: the in-test pipeline)."""
from __future__ import annotations

import subprocess

import pytest
import torch

from tests.datasets.cli_run import one_line_error
from turbotrain.train.records.checkpoint import checkpoint_path, save_atomic

from ..tiny_data import write_tiny_dataset

from ..conftest import FAST, train_subprocess

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast


def _train_in_a_child(*args) -> subprocess.CompletedProcess:
    """`train ARGS` in a child process (with the in-test pipelines the runs were trained with)."""
    proc = train_subprocess(*args)
    out, err = proc.communicate(timeout=240)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _trained(train_cli, tmp_path):
    """(a finished 3-step run on a 4-class dataset, a 3-class dataset)."""
    four = write_tiny_dataset(tmp_path / "four", num_classes=4)
    three = write_tiny_dataset(tmp_path / "three", num_classes=3, seed=1)
    run = tmp_path / "run"
    code, _, err = train_cli("--data", four, "--out", run, "--epochs", 1, "--batch-size", 32,
                             *FAST)
    assert code == 0, err
    return four, three, run


def test_resume_on_other_data_names_the_run_s_dataset_and_classes(train_cli, tmp_path):
    four, three, run = _trained(train_cli, tmp_path)
    saved = (run / "config.yaml").read_text()
    line = one_line_error(_train_in_a_child("--out", run, "--resume", "--data", three))
    assert f"was trained on {four} (4 classes: class0, class1, class2, class3)" in line, line
    assert f"not on --data {three} (3 classes: class0, class1, class2)" in line, line
    assert f"resume with --data {four}" in line and f"--init-from {run}" in line, line
    assert (run / "config.yaml").read_text() == saved  # the run is as it was
    # The run's own data still resumes (its config.yaml was not rewritten with the other's).
    code, _, err = train_cli("--out", run, "--resume", *FAST)
    assert code == 0, err


def test_a_checkpoint_from_before_classes_were_saved_names_the_tensor_that_does_not_fit(
        train_cli, tmp_path):
    four, three, run = _trained(train_cli, tmp_path)
    path = checkpoint_path(run)
    state = torch.load(path, weights_only=True)
    del state["classes"]  # as a trainer before them wrote it
    save_atomic({k: v for k, v in state.items() if k != "format_version"}, path)
    line = one_line_error(_train_in_a_child("--out", run, "--resume", "--data", three))
    assert "does not fit model compact28 with the 3 classes of --data" in line, line
    assert "in the checkpoint" in line and "[4" in line and "[3" in line, line  # the head
    assert f"was trained on {four}: resume with --data {four}" in line, line
    assert "Error(s) in loading state_dict" not in line
