"""Damage inside a stored JPEG's entropy data decodes without an error, into wrong pixels, so
only the checksum can find it: `train` checks each file's SHA-256 against dataset.json once when
it opens it (--verify-data, on by default) and refuses a damaged file in one line naming it."""
from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest

from tests.security.train_child import FAST, run_train
from turbotrain.datasets import DatasetError, open_dataset
from turbotrain.datasets.beton import layout
from turbotrain.datasets.beton.reader import BetonFile

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A real prepare-dataset output: 32 JPEG train samples (48 x 64 gradients), 8 val."""
    # lazy: prepare (cv2, PIL, the writer) is only this fixture's business
    from turbotrain.datasets.prepare.convert import PrepareOptions, prepare_dataset
    root = tmp_path_factory.mktemp("prepared")
    y, x = np.mgrid[0:48, 0:64]
    images = np.stack([np.clip(np.stack([x * 3 + 5 * k, y * 4 + 3 * k, (x + y) * 2 + k], -1),
                               0, 255) for k in range(40)]).astype(np.uint8)
    np.savez(root / "src.npz", images=images[:32], labels=np.arange(32) % 4,
             val_images=images[32:], val_labels=np.arange(8) % 4,
             classes=np.array(["a", "b", "c", "d"]))
    prepare_dataset(root / "src.npz", root / "out",
                    PrepareOptions(encoding="jpeg", workers=1, progress=False))
    return root / "out"


def flip_entropy_byte(beton: Path, sample: int = 0) -> None:
    """Flips one bit of a byte in the middle of sample `sample`'s entropy-coded data (after its
    SOS segment; never making or unmaking a 0xFF marker byte)."""
    f = BetonFile(beton)
    assert f.modes[sample] == layout.MODE_JPEG
    start, size = int(f.data_ptrs[sample]), int(f.sizes[sample])
    payload = bytes(f.payload(sample))
    del f
    sos = payload.index(b"\xff\xda")
    scan = sos + 2 + int.from_bytes(payload[sos + 2:sos + 4], "big")
    at = scan + (size - 2 - scan) // 2
    while payload[at] in (0xFE, 0xFF) or payload[at - 1] == 0xFF:
        at += 1
    with open(beton, "r+b") as out:
        out.seek(start + at)
        out.write(bytes([payload[at] ^ 0x01]))


def test_the_decoder_does_not_notice_but_train_refuses_the_file(prepared, tmp_path):
    data = Path(shutil.copytree(prepared, tmp_path / "ds"))
    before = open_dataset(data).image(0)
    flip_entropy_byte(data / "train.beton")
    # The damage is silent to the decoder: the sample decodes, to other pixels.
    damaged = open_dataset(data).image(0)
    assert damaged.shape == before.shape and not np.array_equal(damaged, before)
    ran = run_train("--data", str(data), "--out", str(tmp_path / "run"), *FAST, "--epochs", "1",
                    cwd=tmp_path)
    assert ran.returncode == 2, ran.stderr
    assert ran.error_line("train: error: ") == (
        f"train: error: {data / 'train.beton'}: its SHA-256 is not the one dataset.json records "
        "(the file was damaged or changed after prepare-dataset); run `turbotrain verify "
        f"{data}`, then prepare the dataset again or restore the file (train --no-verify-data "
        "skips this check)")


def test_an_intact_file_passes_and_the_check_can_be_skipped(prepared, tmp_path):
    assert len(open_dataset(prepared, verify=True)) == 32  # the intact file passes
    data = Path(shutil.copytree(prepared, tmp_path / "ds"))
    flip_entropy_byte(data / "train.beton")
    with pytest.raises(DatasetError, match="SHA-256"):
        open_dataset(data, verify=True)
    assert len(open_dataset(data)) == 32  # verify=False: what --no-verify-data does
