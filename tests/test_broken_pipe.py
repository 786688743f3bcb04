"""`turbotrain inspect OUT | head`, `info | head`, `predict ... | head`: when the reader of stdout
goes away, the command ends quietly with status 141, as a Unix tool killed by SIGPIPE does,
instead of a BrokenPipeError traceback or predict's "Broken pipe" error (issue 36, item 10;
process_end.py). The real commands run in child processes whose stdout is a pipe with its
reading end already closed, so every write to it fails, whatever the timing."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from turbotrain.process_end import READER_GONE_STATUS, stdout_reader_gone

from .train.tiny_data import write_tiny_dataset

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def prepared_and_run(tmp_path_factory):
    """A tiny prepared dataset, a 1-step run on it and 3 PNG files to predict."""
    from PIL import Image

    from turbotrain.cli import main
    root = tmp_path_factory.mktemp("pipe")
    data = write_tiny_dataset(root / "ds")
    run = root / "run"
    assert main(["train", "--data", str(data), "--out", str(run), "--epochs", "1",
                 "--max-steps", "1", "--batch-size", "8", "--threads", "1", "--workers", "0",
                 "--pipeline", "resident", "--device", "cpu"]) == 0
    images = root / "images"
    images.mkdir()
    for i in range(3):
        Image.fromarray(np.full((16, 16, 3), 40 * i, np.uint8)).save(images / f"{i}.png")
    return data, run, images


def _with_reader_gone(*args) -> subprocess.CompletedProcess:
    read_end, write_end = os.pipe()
    os.close(read_end)  # `head` has exited: every write to stdout fails with EPIPE
    try:
        return subprocess.run([sys.executable, "-m", "turbotrain", *map(str, args)],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=240,
                              cwd=REPO)
    finally:
        os.close(write_end)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("command", ["inspect", "info", "predict"])
def test_a_reader_that_goes_away_ends_the_command_quietly(prepared_and_run, command):
    data, run, images = prepared_and_run
    argv = {"inspect": ["inspect", data], "info": ["info"],
            "predict": ["predict", "--run", run, images, "--device", "cpu"]}[command]
    done = _with_reader_gone(*argv)
    assert done.returncode == READER_GONE_STATUS == 141, done.stderr
    for noise in ("Traceback", "BrokenPipeError", "Broken pipe", "Exception ignored"):
        assert noise not in done.stderr, done.stderr


def test_only_a_closed_stdout_counts_as_the_reader_gone(monkeypatch, tmp_path):
    """A write that failed on a socket (a URL's connection) is still an error: only stdout's
    own reader leaving is quiet."""
    read_end, write_end = os.pipe()
    with open(write_end, "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        assert not stdout_reader_gone()  # the reader is there
        os.close(read_end)
        assert stdout_reader_gone()
    with open(tmp_path / "file.txt", "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        assert not stdout_reader_gone()
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # no file descriptor at all
    assert not stdout_reader_gone()
