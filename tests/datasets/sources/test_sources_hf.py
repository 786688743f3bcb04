"""Hugging Face datasets on disk as a SOURCE (save_to_disk folders, Parquet, Arrow), written by
the real `datasets` and read with pyarrow alone: columns, class names, splits, and
prepare-dataset giving what the same images give as an ImageFolder."""
from __future__ import annotations

import sys

import pytest

from turbotrain.datasets.prepare.convert import PrepareOptions, prepare_dataset
from turbotrain.datasets.sources.detect import detect_source
from turbotrain.datasets.sources.hf import Columns
from turbotrain.datasets.sources.hf_splits import HFSplit
from turbotrain.datasets.sources.source import SourceError

from ..cli_run import cli, one_line_error
from ..prepared_equal import assert_same_dataset
from ..shard_fixtures import CLASSES, hf_dataset, image_folder, samples

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("child_processes")]


def options(**kw) -> PrepareOptions:
    return PrepareOptions(progress=False, **kw)


def dataset_dict(folder):
    from datasets import DatasetDict
    DatasetDict({"train": hf_dataset("train"), "validation": hf_dataset("val"),
                 "test": hf_dataset("val")}).save_to_disk(str(folder))
    return folder


def test_cli_save_to_disk_dataset_dict_matches_the_image_folder(tmp_path):
    """End to end through the CLI: train + validation of a DatasetDict against train/ + val/."""
    folder = image_folder(tmp_path / "photos", splits=("train", "val"))
    dataset_dict(tmp_path / "hf")
    for src, out in ((folder, "a"), (tmp_path / "hf", "b")):
        done = cli("prepare", src, tmp_path / out, "--workers", "2")
        assert done.returncode == 0, done.stderr
    assert_same_dataset(tmp_path / "a", tmp_path / "b", splits=("train", "val"))


def test_save_to_disk_dataset_class_names_and_rows(tmp_path):
    hf_dataset().save_to_disk(str(tmp_path / "one"))
    source = detect_source(tmp_path / "one")
    split = source.splits["train"]
    assert source.kind == "hf" and source.classes == CLASSES and isinstance(split, HFSplit)
    assert split.labels.tolist() == [c for _, c, _ in samples()]
    assert split.load(5) == samples()[5][2] and split.name(5).endswith(".arrow[row 5]")


def test_parquet_sharded_with_workers_matches(tmp_path):
    """Row groups of 5: a shuffled sharded train split reads them in any order."""
    image_folder(tmp_path / "photos")
    data = tmp_path / "pq"
    data.mkdir()
    dataset = hf_dataset()
    dataset.select(range(0, 7)).to_parquet(str(data / "train-00000-of-00002.parquet"),
                                           batch_size=5)
    dataset.select(range(7, 12)).to_parquet(str(data / "train-00001-of-00002.parquet"))
    source = detect_source(data)
    assert source.classes == CLASSES and len(source.splits["train"]) == 12
    for src, out in ((tmp_path / "photos", "a"), (data, "b")):
        prepare_dataset(src, tmp_path / out, options(workers=2, shard_size=8 << 20))
    assert_same_dataset(tmp_path / "a", tmp_path / "b")


def test_string_labels_and_column_flags(tmp_path):
    image_folder(tmp_path / "photos")
    path = tmp_path / "pics.parquet"
    hf_dataset(string_labels=True, image="picture", label="kind").to_parquet(str(path))
    # The one column of HF's Image feature is the image, whatever its name; a label is not
    # guessed.
    with pytest.raises(SourceError, match="has no label column .*--label-column"):
        detect_source(path)
    columns = Columns(image="picture", label="kind")
    assert detect_source(path, columns=columns).classes == CLASSES  # names, sorted
    prepare_dataset(tmp_path / "photos", tmp_path / "a", options(workers=1))
    prepare_dataset(path, tmp_path / "b", options(workers=1, image_column="picture",
                                                  label_column="kind"))
    assert_same_dataset(tmp_path / "a", tmp_path / "b")
    line = one_line_error(cli("prepare", path, tmp_path / "c", "--image-column", "picture",
                              "--label-column", "nope"))
    assert "has no column 'nope' (--label-column)" in line


def test_column_flags_on_another_kind_are_refused(tmp_path):
    with pytest.raises(SourceError, match="are for Parquet/Arrow"):
        detect_source(image_folder(tmp_path / "photos"), columns=Columns(image="x"))


def test_unlabelled_rows_are_refused(tmp_path):
    from datasets import Dataset, Features, Image, Value
    rows = samples()[:2]
    Dataset.from_dict({"image": [{"bytes": d, "path": None} for _, _, d in rows],
                       "label": [-1, -1]},
                      features=Features({"image": Image(), "label": Value("int64")})
                      ).to_parquet(str(tmp_path / "test.parquet"))
    with pytest.raises(SourceError, match="label -1"):
        detect_source(tmp_path / "test.parquet")


def test_without_pyarrow_the_error_says_what_to_install(tmp_path, monkeypatch):
    hf_dataset().to_parquet(str(tmp_path / "x.parquet"))
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    with pytest.raises(SourceError, match=r"pip install turbotrain\[hf\]"):
        detect_source(tmp_path / "x.parquet")
