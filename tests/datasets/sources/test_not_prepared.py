"""A raw folder, or a path that does not exist, given where a prepared dataset is expected
(`train --data`): the one line says what the path is and gives the exact commands, and those
commands run (the old hint, `prepare-dataset SOURCE imgfolder`, named the SOURCE as OUT, which
prepare then refused as SOURCE itself). The real commands, in child processes."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from turbotrain.datasets import DatasetError, open_dataset

from ..cli_run import one_line_error

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast


def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    """`turbotrain ARGS` in a child process, in `cwd` (the commands use relative paths)."""
    return subprocess.run([sys.executable, "-m", "turbotrain", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=240)


def _image_folder(root):
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i in range(4):
            pixels = rng.integers(0, 256, (64, 80, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.jpg")
    return root


@pytest.mark.timeout(300)
def test_a_raw_image_folder_as_data_gives_the_two_commands_that_work(tmp_path):
    _image_folder(tmp_path / "imgfolder")
    line = one_line_error(cli("train", "--data", "imgfolder", cwd=tmp_path))
    assert line == ("train: error: imgfolder is not a prepared dataset but a SOURCE: class "
                    "subfolders (ImageFolder); run `prepare-dataset imgfolder "
                    "imgfolder-prepared`, then `train --data imgfolder-prepared`"), line
    prepared = cli("prepare-dataset", "imgfolder", "imgfolder-prepared", "--workers", 1,
                   cwd=tmp_path)
    assert prepared.returncode == 0, prepared.stderr
    trained = cli("train", "--data", "imgfolder-prepared", "--max-steps", 1, "--batch-size", 4,
                  "--threads", 1, "--workers", 0, "--device", "cpu", "--out", "run",
                  cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_inspect_and_verify_of_a_raw_folder_give_the_same_commands(command, tmp_path):
    _image_folder(tmp_path / "imgfolder")
    line = one_line_error(cli(command, "imgfolder", cwd=tmp_path))
    assert line == (f"turbotrain {command}: error: imgfolder is not a prepared dataset but a "
                    "SOURCE: class subfolders (ImageFolder); run `prepare-dataset imgfolder "
                    "imgfolder-prepared`, then `train --data imgfolder-prepared`"), line


def test_a_path_that_does_not_exist_says_so(tmp_path):
    line = one_line_error(cli("train", "--data", tmp_path / "nope"))
    assert line == (f"train: error: {tmp_path / 'nope'}: no such dataset: nothing exists at "
                    "that path (a prepared dataset is the OUT folder that `prepare-dataset "
                    "SOURCE OUT` writes)")


def test_other_paths_say_what_they_are(tmp_path):
    """In process, through open_dataset (eval, tune, info and a Loader open data so too)."""
    np.savez(tmp_path / "a.npz", images=np.zeros((4, 8, 8, 3), np.uint8),
             labels=np.array([0, 1, 0, 1]))
    (tmp_path / "empty").mkdir()
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "train.beton").write_bytes(b"")
    (tmp_path / "spaced dir").mkdir()
    _image_folder(tmp_path / "spaced dir" / "photos")
    said = {}
    for name in ("a.npz", "empty", "half", "spaced dir/photos"):
        with pytest.raises(DatasetError) as caught:
            open_dataset(tmp_path / name)
        said[name] = str(caught.value)
    assert said["a.npz"].endswith(f"a SOURCE: a .npz; run `prepare-dataset {tmp_path}/a.npz "
                                  f"{tmp_path}/a-prepared`, then `train --data "
                                  f"{tmp_path}/a-prepared`")
    assert "no dataset.json) and no images found in it" in said["empty"]
    assert ".beton files but no dataset.json" in said["half"]
    assert f"run `prepare-dataset '{tmp_path}/spaced dir/photos' " in said["spaced dir/photos"]
    # A file that is no SOURCE keeps the .beton reader's own words, and a prepared dataset
    # that is damaged its own error.
    (tmp_path / "junk.bin").write_bytes(b"hello")
    with pytest.raises(DatasetError, match="not a dataset"):
        open_dataset(tmp_path / "junk.bin")
    (tmp_path / "half" / "dataset.json").write_text("{")
    with pytest.raises(DatasetError, match="dataset.json: not valid"):
        open_dataset(tmp_path / "half")
