"""Memory that runs out under an address-space limit (`ulimit -v`, RLIMIT_AS) ends in one line
naming the limit and what was being done, exit code 2, never a MemoryError or ImportError
traceback (issue 31, part 2; os_failure.py).

The limit is real: confined.run_confined sets RLIMIT_AS in the child before it runs the
command, so the failure comes from the allocator or dlopen where it really happens.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from .confined import REPO, run_confined, turbotrain

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("child_processes")]

GIB = 1 << 30


@pytest.fixture(scope="module")
def huge_png(tmp_path_factory):
    """A one-class ImageFolder: a 7000 x 7000 PNG (147 MB of pixels, 140 KB of file) and a
    small one. Decoding the big one takes more than 1 GiB of address space once numpy, PIL
    and the encoder are loaded; the whole conversion fits in 1.5 GiB."""
    root = tmp_path_factory.mktemp("huge")
    (root / "a").mkdir()
    Image.fromarray(np.zeros((7000, 7000, 3), np.uint8)).save(root / "a" / "huge.png")
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(root / "a" / "small.png")
    return root


@pytest.mark.parametrize("workers", ["1", "2"])
def test_prepare_names_the_image_and_the_limit(huge_png, tmp_path, workers):
    ran = run_confined(turbotrain("prepare", huge_png, tmp_path / "out", "--workers", workers),
                       address_space=GIB, timeout=60, cwd=REPO)
    line = ran.error_line("prepare-dataset: error: ")
    assert line.startswith(f"prepare-dataset: error: {huge_png}/a/huge.png: out of memory "
                           f"decoding it under the address-space limit of 1.0 GiB (ulimit -v)"), \
        line
    assert "--workers" in line and not (tmp_path / "out").exists()


def test_prepare_skips_the_image_with_on_error_skip(huge_png, tmp_path):
    ran = run_confined(turbotrain("prepare", huge_png, tmp_path / "out", "--workers", "1",
                                  "--on-error", "skip"), address_space=GIB, timeout=60, cwd=REPO)
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr[-3000:]
    skipped = (tmp_path / "out" / "skipped.txt").read_text()
    assert skipped.startswith(f"{huge_png}/a/huge.png\tout of memory decoding it"), skipped


def test_train_names_the_library_it_could_not_load(tmp_path):
    # 2 GiB: too little to map torch's shared libraries (train needs about 4 GiB of address
    # space on the CPU); dlopen's ImportError is the symptom, the limit the cause.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    ran = run_confined(turbotrain("train", "--data", tmp_path / "none", "--out", tmp_path / "run",
                                  "--device", "cpu"),
                       address_space=2 * GIB, timeout=60, cwd=REPO, env=env)
    line = ran.error_line("train: error: ")
    assert line.startswith("train: error: out of memory loading lib") and \
        "(importing torch) under the address-space limit of 2.0 GiB (ulimit -v)" in line, line
    assert "--batch-size" in line
