"""A full disk (ENOSPC) and a read-only one (EROFS) end each writing command in one line on stderr
naming the file, exit code 2, never an OSError traceback (issue 31, part 1; os_failure.py).

The disks are real: a small tmpfs (`mount -t tmpfs -o size=...`), remounted read-only for
EROFS, so the failure comes from the kernel at the real write site (a .beton page flush, a
fresh folder's mkdir, dataset.json, checkpoint.pt, the metrics log). Mounting needs root; CI
runs as root, so these only skip elsewhere.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.datasets.cli_run import cli, one_line_error

from .train_child import FAST, run_train

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("faults_disk"),
              pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root"),
              pytest.mark.usefixtures("child_processes")]

FULL = "No space left on device"
READ_ONLY = "Read-only file system"


@contextlib.contextmanager
def tmpfs(folder: Path, size_kib: int):
    """A tmpfs of size_kib KiB mounted at folder (made if missing), unmounted afterwards."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(folder)],
                   check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def read_only(folder: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)


def fill(folder: Path) -> None:
    """Takes every free block of folder's file system."""
    with contextlib.suppress(OSError), open(folder / "filler", "wb") as f:
        while True:  # until the disk is full (OSError), closing included
            f.write(b"\0" * 4096)
            f.flush()


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """An ImageFolder of 2 x 40 noise PNGs (64 x 64): ~1 MB once prepared, raw."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        (root / label).mkdir()
        for i in range(40):
            Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(
                root / label / f"{i}.png")
    return root


def test_prepare_on_a_full_disk_names_the_beton_file(images, tmp_path):
    with tmpfs(tmp_path / "disk", 64) as disk:
        line = one_line_error(cli("prepare", images, disk / "out", "--workers", "1"))
        assert line.startswith("prepare-dataset: error: cannot write ") and FULL in line, line
        assert "train.beton (a .beton file)" in line and str(disk) in line, line
        assert os.listdir(disk) == []  # the hidden partial folder went too


def test_prepare_on_a_read_only_disk_names_the_folder(images, tmp_path):
    with tmpfs(tmp_path / "disk", 64) as disk:
        read_only(disk)
        line = one_line_error(cli("prepare", images, disk / "out", "--workers", "1"))
        # The first write refused: OUT's lock file (folder_lock.py words it), else the
        # hidden folder the dataset is built in.
        assert line.startswith("prepare-dataset: error: ") and f"{disk}/" in line and \
            READ_ONLY in line, line


@pytest.fixture(scope="module")
def parts(images, tmp_path_factory) -> Path:
    """A finished `--part 0/1` conversion, not merged."""
    out = tmp_path_factory.mktemp("parts") / "out"
    done = cli("prepare", images, out, "--shard-size", "8MiB", "--part", "0/1", "--workers", "1")
    assert done.returncode == 0, done.stderr
    return out


def _parts_on(disk: Path, parts: Path) -> Path:
    # --sparse=always: the shard's page tails are holes, ~1 MB of its 16 MB hold data.
    subprocess.run(["cp", "-a", "--sparse=always", str(parts), str(disk / "out")], check=True)
    return disk / "out"


def test_merge_on_a_full_disk_names_dataset_json(parts, tmp_path):
    with tmpfs(tmp_path / "disk", 1400) as disk:
        out = _parts_on(disk, parts)
        fill(disk)
        line = one_line_error(cli("merge", out))
        assert line == (f"turbotrain merge: error: cannot write {out}/dataset.json: {FULL}; "
                        f"free space on that disk, or write somewhere else"), line


def test_merge_on_a_read_only_disk(parts, tmp_path):
    with tmpfs(tmp_path / "disk", 1400) as disk:
        out = _parts_on(disk, parts)
        read_only(disk)
        line = one_line_error(cli("merge", out))
        assert line.startswith(f"turbotrain merge: error: cannot write {out}/") and \
            READ_ONLY in line, line


# -- train: the run folder on a small disk --------------------------------------------------
def _train(dataset: Path, out: Path, cwd: Path):
    return run_train("--data", dataset, "--out", out, "--epochs", 1, "--batch-size", 16,
                     "--max-steps", 3, *FAST, cwd=cwd, timeout=120)


def test_train_checkpoint_on_a_full_disk(tiny_dataset, tmp_path):
    # 900 KiB: config.yaml, metrics.jsonl and best.safetensors (~550 KB) fit; checkpoint.pt
    # (~1.1 MB: the weights, the optimizer's state) does not. torch.save's own RuntimeError
    # hid the OSError.
    with tmpfs(tmp_path / "disk", 900) as disk:
        line = _train(tiny_dataset, disk / "run", tmp_path).error_line("train: error: ")
        assert line.startswith(f"train: error: cannot write {disk}/run/checkpoint.pt: {FULL}")


def test_train_metrics_log_on_a_full_disk(tiny_dataset, tmp_path):
    # 8 KiB: config.yaml takes one 4 KiB page, the metrics log's first line the last one; the
    # write fails when the appended line is flushed through its descriptor (no file name).
    with tmpfs(tmp_path / "disk", 8) as disk:
        line = _train(tiny_dataset, disk / "run", tmp_path).error_line("train: error: ")
        assert line.startswith(f"train: error: cannot write {disk}/run/metrics.jsonl "
                               f"(the metrics log): {FULL}"), line


def test_train_resume_on_a_read_only_run_folder(tiny_dataset, tmp_path):
    finished = _train(tiny_dataset, tmp_path / "run", tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    with tmpfs(tmp_path / "disk", 4096) as disk:
        shutil.copytree(tmp_path / "run", disk / "run")
        read_only(disk)
        ran = run_train("--out", disk / "run", "--resume", "--epochs", 2, *FAST, cwd=tmp_path)
        line = ran.error_line("train: error: ")
        assert f"{disk}/run" in line and READ_ONLY in line, line
