"""`train --init-from FILE` with weights nobody vouches for: a .pt that asks to run code, a
zip bomb's deflated entries, a raw pickle, a named pipe. Each is refused in one line naming the
file (exit code 2), runs nothing, and leaves no run folder behind. The first case goes through
the real command in a confined child; the others call the loader (the same one line)."""
from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import pytest
import torch

from turbotrain.train.errors import TrainError
from turbotrain.train.weights.weights_in import init_start, load_state_file

from .confined import changed, outside, tree_state
from .test_checkpoint import Payload
from .train_child import FAST, run_train

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("child_processes")]


def test_a_pt_that_runs_a_command_is_refused_and_the_command_never_runs(tiny_dataset,
                                                                         tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    marker, weights = work / "MARKER", work / "weights.pt"
    torch.save({"conv.weight": torch.zeros(2), "x": Payload(os.system, f"touch {marker}")},
               weights)
    before = tree_state(work) | tree_state(tiny_dataset)
    ran = run_train("--data", tiny_dataset, "--out", work / "run", "--init-from", weights,
                    "--epochs", 1, "--batch-size", 16, *FAST, cwd=work)
    assert ran.error_line("train: error: ") == (
        f"train: error: --init-from {weights} asks to run code (os.system) when loaded; "
        "refusing it (weights are loaded with weights_only=True)")
    assert not marker.exists() and not (work / "run").exists()
    assert not outside(changed(before, tree_state(work) | tree_state(tiny_dataset)), work)


def test_deflated_raw_and_unreadable_files_are_one_line(tmp_path):
    marker = tmp_path / "MARKER"
    good = tmp_path / "good.pt"
    torch.save({"w": torch.zeros(1000)}, good)
    deflated = tmp_path / "deflated.pt"  # how a zip bomb stays small: torch would inflate it
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            z.writestr(info.filename, src.read(info))
    raw = tmp_path / "raw.pt"  # the legacy format, a bare pickle: never unpickled
    raw.write_bytes(pickle.dumps({"w": Payload(os.system, f"touch {marker}")}))
    fifo = tmp_path / "fifo.pt"
    os.mkfifo(fifo)
    for path, reason in ((deflated, "is compressed; torch.save stores its entries uncompressed"),
                         (raw, ": not a torch.save zip file"),
                         (fifo, " is a named pipe, not a regular file; refusing to read it"),
                         (tmp_path / "none.pt", ": no such file")):
        with pytest.raises(TrainError) as exc:
            load_state_file(path, "--init-from")
        assert str(exc.value).startswith(f"--init-from {path}") and reason in str(exc.value)
        assert "\n" not in str(exc.value)
    assert not marker.exists()
    assert load_state_file(good, "--init-from")["w"].shape == (1000,)


def test_a_safetensors_file_that_is_not_one(tmp_path):
    fifo = tmp_path / "w.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(TrainError, match="is a named pipe"):
        init_start(str(fifo))
    junk = Path(tmp_path / "junk.safetensors")
    junk.write_bytes(b"\xff" * 64)
    with pytest.raises(TrainError, match="not a readable safetensors file"):
        init_start(str(junk))
