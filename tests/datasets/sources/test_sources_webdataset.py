"""WebDataset shards as a SOURCE: brace patterns, split rules, labels, the offset index of a plain
.tar, the in-order stream of a .tar.gz, and prepare-dataset giving what the same images give as
an ImageFolder."""
from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest
from PIL import Image

from turbotrain.datasets.prepare.convert import PrepareError, PrepareOptions, prepare_dataset
from turbotrain.datasets.sources.detect import detect_source
from turbotrain.datasets.sources.source import (IMAGE_EXTENSIONS, WEBDATASET_IMAGE_EXTENSIONS,
                                                SourceError)
from turbotrain.datasets.sources.source_files import expand_braces
from turbotrain.datasets.sources.webdataset import TarSplit, TarStreamSplit

from ..cli_run import cli, one_line_error
from ..prepared_equal import assert_same_dataset
from ..shard_fixtures import CLASSES, image_folder, samples, webdataset_shards

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("child_processes")]


def options(**kw) -> PrepareOptions:
    return PrepareOptions(progress=False, **kw)


# -- brace patterns -------------------------------------------------------------------------------
def test_brace_ranges_keep_padding_and_lists_multiply():
    assert expand_braces("d/t-{000..002}.tar") == ["d/t-000.tar", "d/t-001.tar", "d/t-002.tar"]
    assert expand_braces("{8..10}") == ["8", "9", "10"]
    assert expand_braces("{a,b}-{0..1}") == ["a-0", "a-1", "b-0", "b-1"]
    assert expand_braces("plain.tar") == ["plain.tar"]


@pytest.mark.parametrize("pattern, expect", [
    ("t-{0..999999999}.tar", "more than 100,000 files"),
    ("{0..999}{0..999}", "more than 100,000 files"),
    ("t-{9..1}.tar", "counts down"), ("t-{0..1.tar", "unmatched"), ("t-{x}.tar", "neither"),
])
def test_bad_brace_patterns_are_one_line(pattern, expect):
    with pytest.raises(SourceError, match=expect):
        expand_braces(pattern)


# -- detection, splits and labels -----------------------------------------------------------------
def test_shards_by_name_with_cls_labels(tmp_path):
    webdataset_shards(tmp_path, "train")
    webdataset_shards(tmp_path, "val")
    source = detect_source(tmp_path)
    assert source.kind == "webdataset" and set(source.splits) == {"train", "val"}
    train = source.splits["train"]
    assert isinstance(train, TarSplit) and len(train.files) == 3  # 12 samples, 5 a file
    assert source.classes == ["0", "1", "2"]  # integers: "0".."N-1"
    assert train.labels.tolist() == [c for _, c, _ in samples("train")]
    assert train.load(6) == samples("train")[6][2]
    assert train.name(0).endswith("train-000000.tar:cat00.jpg")


def test_split_folders_pattern_and_names(tmp_path):
    webdataset_shards(tmp_path / "train", "train", label="txt", prefix="shard")
    webdataset_shards(tmp_path / "val", "val", label="json", prefix="shard")
    source = detect_source(tmp_path)
    assert source.classes == CLASSES  # names, sorted, shared by the splits
    assert source.splits["val"].labels.tolist() == [c for _, c, _ in samples("val")]
    one = detect_source(tmp_path / "train" / "shard-{000000..000001}.tar")
    assert len(one.splits["train"]) == 10 and list(one.splits) == ["train"]


def test_a_shard_name_outside_the_rule_is_refused(tmp_path):
    webdataset_shards(tmp_path, "train")
    webdataset_shards(tmp_path, "val", prefix="extra")
    with pytest.raises(SourceError, match="extra-000000.tar does not start with train"):
        detect_source(tmp_path)


def tar_of(path, members):
    """A plain .tar at path holding (name, bytes) members, in order."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(out.getvalue())
    return path


def test_sample_without_label_and_two_images(tmp_path):
    def shard(members):
        return tar_of(tmp_path / "x.tar", members)
    jpg = samples()[0][2]
    with pytest.raises(SourceError, match="sample 'a' has no label"):
        detect_source(shard([("a.jpg", jpg), ("b.jpg", jpg), ("b.cls", b"1")]))
    with pytest.raises(SourceError, match="has two images"):
        detect_source(shard([("a.jpg", jpg), ("a.png", jpg), ("a.cls", b"1")]))
    # Names are only names: nothing is extracted, the key keeps its folder.
    source = detect_source(shard([("../../up/a.jpg", jpg), ("../../up/a.seg.cls", b"0"),
                                  ("../../up/a.cls", b"2")]))
    assert source.splits["train"].labels.tolist() == [2] and source.classes == ["0", "1", "2"]


def test_what_is_an_image_has_one_home(tmp_path):
    """Issue 33: sources/source.py says what is an image, once. An ImageFolder reads every
    IMAGE_EXTENSIONS file (.tif, .bmp and .gif too); a WebDataset sample's image is its member
    with one of WEBDATASET_IMAGE_EXTENSIONS, four of those: a .tif beside a sample's .jpg (a
    mask) is not a second image, and a sample whose only picture is a .tif has none."""
    assert {f".{ext}" for ext in WEBDATASET_IMAGE_EXTENSIONS} < IMAGE_EXTENSIONS
    tif = io.BytesIO()
    Image.new("RGB", (8, 6), (10, 20, 30)).save(tif, "TIFF")
    (tmp_path / "folder" / "a").mkdir(parents=True)
    (tmp_path / "folder" / "a" / "x.tif").write_bytes(tif.getvalue())
    assert detect_source(tmp_path / "folder").splits["train"].relpaths == ["a/x.tif"]
    jpg = samples()[0][2]
    source = detect_source(tar_of(tmp_path / "a.tar", [("a.jpg", jpg), ("a.tif", tif.getvalue()),
                                                       ("a.cls", b"1")]))
    assert len(source.splits["train"]) == 1
    assert source.splits["train"].name(0).endswith("a.tar:a.jpg")
    with pytest.raises(SourceError, match=r"sample 'b' has no image \(\.jpg, \.jpeg, \.png, \.webp\)"):
        detect_source(tar_of(tmp_path / "b.tar", [("b.tif", tif.getvalue()), ("b.cls", b"0")]))


# -- prepare-dataset end to end --------------------------------------------------------------------
def test_cli_prepares_what_the_image_folder_gives(tmp_path):
    """End to end through the CLI: a folder of train/val shards (ShardWriter) against the same
    JPEGs as an ImageFolder with train/ and val/."""
    folder = image_folder(tmp_path / "photos", splits=("train", "val"))
    webdataset_shards(tmp_path / "wds", "train", label="txt")
    webdataset_shards(tmp_path / "wds", "val", label="txt")
    for src, out in ((folder, "a"), (tmp_path / "wds", "b")):
        done = cli("prepare", src, tmp_path / out, "--workers", "2")
        assert done.returncode == 0, done.stderr
    assert_same_dataset(tmp_path / "a", tmp_path / "b", splits=("train", "val"))


def test_tar_gz_is_streamed_in_order_and_matches(tmp_path):
    webdataset_shards(tmp_path / "plain", "train")
    webdataset_shards(tmp_path / "gz", "train", compress=True)
    split = detect_source(tmp_path / "gz").splits["train"]
    assert isinstance(split, TarStreamSplit) and split.in_order_only
    assert split.load(7) == samples()[7][2]  # the slow path streams up to it
    prepare_dataset(tmp_path / "plain", tmp_path / "a", options(workers=1))
    prepare_dataset(tmp_path / "gz", tmp_path / "b", options(workers=2, val_fraction=0.25))
    prepare_dataset(tmp_path / "gz", tmp_path / "c", options(workers=2))
    assert_same_dataset(tmp_path / "a", tmp_path / "c")
    with pytest.raises(PrepareError, match="can only be read in order.*gunzip the shards"):
        prepare_dataset(tmp_path / "gz", tmp_path / "d", options(shard_size=8 << 20))


def test_plain_tar_shards_and_parts(tmp_path):
    """Read by offset: --shard-size (a shuffled train split) and --part work as for files."""
    image_folder(tmp_path / "photos")
    webdataset_shards(tmp_path / "wds", "train", label="json")
    for src, out in ((tmp_path / "photos", "a"), (tmp_path / "wds", "b")):
        prepare_dataset(src, tmp_path / out, options(workers=2, shard_size=8 << 20))
    assert_same_dataset(tmp_path / "a", tmp_path / "b")
    prepare_dataset(tmp_path / "wds", tmp_path / "parts", options(shard_size=8 << 20,
                                                                 part=(0, 1)))
    done = cli("merge", tmp_path / "parts")
    assert done.returncode == 0, done.stderr
    assert_same_dataset(tmp_path / "a", tmp_path / "parts")


def test_cli_error_for_a_missing_shard_is_one_line(tmp_path):
    webdataset_shards(tmp_path, "train")
    line = one_line_error(cli("prepare", tmp_path / "train-{000000..000009}.tar",
                              tmp_path / "out"))
    assert "train-000003.tar, which does not exist" in line
