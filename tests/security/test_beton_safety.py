"""Nothing a `.beton` holds may hang us, exhaust memory or print a traceback: labels that would
size a petabyte output layer, metadata claiming 4.3 Gpx images, JPEGs larger than their metadata
(refused from the header, before decoding, by the reader and by the DALI feed), and a seeded fuzz
of the header, field descriptors, metadata and allocation table in one confined child."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import simplejpeg

from turbotrain.datasets import DatasetError, open_dataset
from turbotrain.datasets.beton import layout
from turbotrain.datasets.beton.split import file_sha256

from .confined import tree_state
from .test_dataset_json import (READER_PEAK_RSS, check_cli, cli, run_fuzz, write_small_dataset,
                                write_split)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("child_processes")]


def raw_sample(label: int, side: int = 8):
    return layout.MODE_RAW, side, side, bytes(side * side * 3), label


def refresh_json(root: Path, split: str = "train") -> None:
    """Makes dataset.json's size and checksum of a rewritten split match again, as an author
    crafting a dataset would."""
    info = json.loads((root / "dataset.json").read_text())
    path = root / f"{split}.beton"
    meta = info["splits"][split]
    meta["bytes"], meta["sha256"] = path.stat().st_size, file_sha256(path)
    meta["num_samples"] = int(np.frombuffer(path.read_bytes()[8:16], "<u8")[0])  # header
    (root / "dataset.json").write_text(json.dumps(info))


# -- labels --------------------------------------------------------------------------------------
def test_huge_label_in_a_bare_beton_is_refused(tmp_path):
    """The class count of a bare .beton is its largest label + 1: 2**40 asked for a 1 PB layer."""
    beton = write_split(tmp_path / "x.beton", [raw_sample(0), raw_sample(2**40)])
    expected = (f"{beton}: sample 1 has label 1099511627776, outside 0..199999 (the most "
                f"classes a dataset may have)")
    with pytest.raises(DatasetError) as error:
        open_dataset(beton)
    assert str(error.value) == expected
    check_cli(tmp_path, ["train"], beton, expected)


def test_negative_label_is_refused(tmp_path):
    beton = write_split(tmp_path / "x.beton", [raw_sample(3), raw_sample(-1)])
    with pytest.raises(DatasetError, match="sample 1 has label -1, outside 0..199999"):
        open_dataset(beton)


def test_bare_beton_class_count_is_bounded(tmp_path):
    beton = write_split(tmp_path / "x.beton", [raw_sample(0), raw_sample(layout.MAX_CLASSES - 1)])
    assert open_dataset(beton).num_classes == layout.MAX_CLASSES


def test_labels_are_checked_against_the_class_names(tmp_path):
    root = write_small_dataset(tmp_path / "ds")
    write_split(root / "train.beton", [raw_sample(0), raw_sample(5)])
    refresh_json(root)
    check_cli(tmp_path, ["inspect"], root,
              f"{root}/train.beton: sample 1 has label 5, but dataset.json lists 3 classes "
              f"(labels 0..2)")


# -- image sizes ---------------------------------------------------------------------------------
def test_metadata_claiming_a_huge_image_is_refused(tmp_path):
    """'<u2' sides allow 65,535 x 65,535 = 4.3 Gpx (12.9 GB decoded)."""
    root = write_small_dataset(tmp_path / "ds")
    jpeg = simplejpeg.encode_jpeg(np.zeros((8, 8, 3), np.uint8))
    write_split(root / "train.beton", [raw_sample(0), (layout.MODE_JPEG, 65535, 65535, jpeg, 1)])
    refresh_json(root)
    expected = (f"{root}/train.beton: sample 1 claims 65535x65535 pixels, over the 100 Mpx "
                f"limit for one image")
    check_cli(tmp_path, ["inspect"], root, expected)
    assert_verify_lists(tmp_path, root, [expected])


def assert_verify_lists(tmp_path: Path, root: Path, problems: list[str]):
    """verify prints each problem, then one summary line; exit 2, no traceback, nothing
    written. Returns the run (for its peak RSS)."""
    before = tree_state(tmp_path)
    ran = cli("verify", root, cwd=tmp_path)
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr[-3000:]
    assert ran.stderr.splitlines() == problems + [
        f"turbotrain verify: error: {len(problems)} problem(s) in {root}"]
    assert ran.peak_rss < READER_PEAK_RSS, ran.peak_rss >> 20
    assert tree_state(tmp_path) == before
    return ran


@pytest.fixture(scope="module")
def big_jpeg() -> bytes:
    """A real 6000 x 6000 JPEG (1 MB on disk, 108 MB decoded)."""
    image = np.empty((6000, 6000, 3), np.uint8)
    ramp = (np.arange(6000) // 24).astype(np.uint8)
    image[..., 0], image[..., 1], image[..., 2] = ramp[None, :], ramp[:, None], 128
    return simplejpeg.encode_jpeg(image, quality=75)


@pytest.fixture
def lying_dataset(tmp_path, big_jpeg) -> Path:
    """A prepared folder whose train sample 0 is that JPEG, labelled 8 x 8 in the metadata."""
    root = write_small_dataset(tmp_path / "ds")
    write_split(root / "train.beton", [(layout.MODE_JPEG, 8, 8, big_jpeg, 0), raw_sample(1)])
    refresh_json(root)
    return root


def test_oversized_jpeg_is_refused_from_its_header(lying_dataset, tmp_path):
    """verify (and PreparedSplit.image) decoded 108 MB before comparing sizes."""
    with pytest.raises(DatasetError) as error:
        open_dataset(lying_dataset).image(0)
    expected = (f"{lying_dataset}/train.beton: sample 0 does not decode (JPEG header declares "
                f"6000x6000, metadata says 8x8)")
    assert str(error.value) == expected
    clean = write_small_dataset(tmp_path / "clean")
    baseline = cli("verify", clean, cwd=tmp_path)
    assert baseline.returncode == 0, baseline.stderr
    ran = assert_verify_lists(tmp_path, lying_dataset, [expected])
    # A decode would add 108 MB (the image) to the clean run's peak.
    assert ran.peak_rss < baseline.peak_rss + (40 << 20), (ran.peak_rss >> 20,
                                                           baseline.peak_rss >> 20)


@pytest.mark.timeout(180)
def test_dali_feed_checks_each_jpeg_header(lying_dataset):
    """nvJPEG (and DALI's CPU decoder) would decode whatever size the header declares: the feed
    refuses the sample first, naming the file and the sample."""
    import torch

    from turbotrain.pipeline import PipelineError, PipelineOptions
    from turbotrain.pipeline.dali import DaliPipeline
    dataset = open_dataset(lying_dataset)
    options = PipelineOptions(train=False, batch_size=2, image_size=8, device=torch.device("cpu"),
                              seed=0, workers=1)
    with DaliPipeline(dataset, options) as pipeline:
        pipeline.set_epoch(0)
        with pytest.raises(PipelineError) as error:
            for _ in pipeline:
                pass
    message = str(error.value)
    assert type(error.value).__name__ == "SampleDecodeError"
    assert f"{lying_dataset}/train.beton: sample 0" in message and "\n" not in message
    assert "declares 6000x6000 pixels, the metadata 8x8; refused before decoding" in message
    assert "DALI:" not in message  # our own error, not re-wrapped as one of DALI's


@pytest.mark.parametrize("name", ["pytorch", "resident"])
def test_cpu_decoder_checks_each_jpeg_header(tmp_path, big_jpeg, name):
    """The CPU decoder's buffer is sized for the split's largest image (here 512 x 512): the
    6000 x 6000 JPEG labelled 8 x 8 would fit at 1/8 scale and be cropped as if it were 8 x 8.
    It is refused from its header instead, naming the sample."""
    import torch

    from turbotrain.pipeline import PipelineError, build_pipeline
    root = write_small_dataset(tmp_path / "ds")
    photo = simplejpeg.encode_jpeg(np.zeros((512, 512, 3), np.uint8), quality=75)
    write_split(root / "train.beton", [(layout.MODE_JPEG, 512, 512, photo, 0),
                                       (layout.MODE_JPEG, 8, 8, big_jpeg, 1)])
    refresh_json(root)
    with pytest.raises(PipelineError) as error:  # resident decodes the split as it is built
        pipeline = build_pipeline(name, open_dataset(root), train=False, batch_size=2,
                                  image_size=64, device=torch.device("cpu"), seed=0, workers=1)
        pipeline.set_epoch(0)
        for _ in pipeline:
            pass
    assert type(error.value).__name__ == "SampleDecodeError"
    assert f"{root}/train.beton: sample 1 does not decode as a JPEG (its JPEG header declares " \
           f"6000x6000 pixels, the metadata 8x8)" == str(error.value)


# -- the fuzz ------------------------------------------------------------------------------------
def test_fuzz_beton_header_and_tables(tmp_path):
    """Hundreds of seeded byte overwrites in the first 4 KB of train.beton (header, field
    descriptors, metadata rows) or its allocation table, and truncations, each through
    open_dataset (folder and bare file, every sample decoded), describe and verify."""
    report = run_fuzz("beton", tmp_path, seed=7, count=300)
    assert report["failures"] == []


def test_a_removed_split_names_the_file(tmp_path):
    root = write_small_dataset(tmp_path / "ds")
    shutil.move(root / "val.beton", tmp_path / "elsewhere.beton")
    check_cli(tmp_path, ["inspect"], root,
              f"{root}/val.beton: missing (dataset.json lists it as the val split); "
              f"re-run prepare-dataset")
