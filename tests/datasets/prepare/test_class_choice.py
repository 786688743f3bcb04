"""Classes a source declares but has no images of (issue 36, item 1): `prepare-dataset` warns in
one line, `--classes present` keeps only the classes with images (renumbered, the same ids in
every split, recorded in dataset.json), `inspect` lists them; a one-class source warns too. The
real commands run in child processes on a CIFAR-10 folder of 24 generated cats and dogs."""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from turbotrain.datasets import open_dataset
from turbotrain.datasets.beton.dataset_json import check_dataset_info
from turbotrain.datasets.errors import DatasetError
from turbotrain.datasets.prepare.convert import PrepareError, PrepareOptions, prepare_dataset
from turbotrain.datasets.prepare.merge import merge

from ..cli_run import cli

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast

CIFAR10 = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
           "truck"]
CAT, DOG = 3, 5
EMPTY = [name for name in CIFAR10 if name not in ("cat", "dog")]
TRAIN_SMALL = ("--epochs", "1", "--max-steps", "2", "--batch-size", "8", "--image-size", "32",
               "--device", "cpu", "--threads", "1", "--workers", "0", "--pipeline", "pytorch")


def write_cifar(folder: Path, per_batch: int = 4) -> dict[str, tuple[np.ndarray, list[int]]]:
    """A CIFAR-10 "python version" folder whose batches hold only cats and dogs; returns each
    batch's (HWC images, labels)."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    batches = {}
    for name in [f"data_batch_{b}" for b in range(1, 6)] + ["test_batch"]:
        rows = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = [CAT, DOG] * (per_batch // 2)
        (folder / name).write_bytes(pickle.dumps({b"data": rows, b"labels": labels}))
        batches[name] = rows.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels
    (folder / "batches.meta").write_bytes(pickle.dumps(
        {b"label_names": [name.encode() for name in CIFAR10]}))
    return batches


@pytest.fixture(scope="module")
def cats_and_dogs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    return root / "cifar", write_cifar(root / "cifar")


def noise_png(path: Path, seed: int) -> None:
    """A 16 px PNG of noise (a dataset of flat colours has a zero pixel std, refused on read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)


def stderr_lines(result) -> list[str]:
    return [line for line in result.stderr.strip().splitlines() if line]


def test_cifar_subset_warns_and_inspect_lists_the_empty_classes(cats_and_dogs, tmp_path):
    source, _ = cats_and_dogs
    out = tmp_path / "all"
    result = cli("prepare", source, out, "--workers", 1)
    assert result.returncode == 0, result.stderr
    assert "10 classes" in result.stdout
    (warning,) = stderr_lines(result)
    assert warning.startswith("prepare-dataset: warning: ") and str(source) in warning
    assert "8 of 10 classes have no images" in warning and "--classes present" in warning
    assert all(name in warning for name in EMPTY) and "cat" not in warning
    # `all` keeps the source's ids: cat stays 3.
    assert open_dataset(out, "train").labels.tolist()[:2] == [CAT, DOG]
    shown = cli("inspect", out)
    assert shown.returncode == 0, shown.stderr
    (line,) = [line for line in shown.stdout.splitlines() if "empty classes" in line]
    assert "8 of 10 have no images" in line and all(name in line for name in EMPTY)
    assert "--classes present" in line


def test_classes_present_keeps_cat_and_dog_and_evaluates_on_an_imagefolder_copy(
        cats_and_dogs, tmp_path):
    source, batches = cats_and_dogs
    out = tmp_path / "present"
    result = cli("prepare", source, out, "--workers", 1, "--classes", "present")
    assert result.returncode == 0, result.stderr
    assert "2 classes" in result.stdout
    (note,) = stderr_lines(result)  # no warning left: a note of what was left out
    assert note.startswith("prepare-dataset: note: --classes present left out 8 classes")
    info = json.loads((out / "dataset.json").read_text())
    assert info["classes"] == ["cat", "dog"] and info["source"]["dropped_classes"] == EMPTY
    train, val = open_dataset(out, "train"), open_dataset(out, "val")
    assert train.labels.tolist() == [0, 1] * 10 and val.labels.tolist() == [0, 1] * 2
    np.testing.assert_array_equal(train.image(5), batches["data_batch_2"][0][1])  # same samples
    shown = cli("inspect", out)
    assert "left out by --classes present: 8 classes" in shown.stdout
    assert "empty classes" not in shown.stdout

    # The same photos as an ImageFolder: 2 classes, the same names in the same order.
    folder = tmp_path / "photos"
    for k, (image, label) in enumerate(zip(*batches["test_batch"])):
        path = folder / CIFAR10[label] / f"{k}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(path)
    copy = tmp_path / "copy"
    assert cli("prepare", folder, copy, "--workers", 1).returncode == 0
    run = tmp_path / "run"
    trained = cli("train", "--data", out, "--out", run, *TRAIN_SMALL)
    assert trained.returncode == 0, trained.stderr
    evaluated = cli("eval", "--run", run, "--data", copy, "--split", "train", "--device", "cpu")
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads((run / "eval.json").read_text())["images"] == 4


def test_a_one_class_source_warns(tmp_path):
    folder = tmp_path / "photos"
    for k in range(3):
        noise_png(folder / "cat" / f"{k}.png", k)
    result = cli("prepare", folder, tmp_path / "out", "--workers", 1)
    assert result.returncode == 0, result.stderr
    assert ", 1 class, " in result.stdout, result.stdout  # not "1 classes"
    (warning,) = stderr_lines(result)
    assert warning == (f"prepare-dataset: warning: {folder}: only one class has images (cat); "
                       f"a classifier needs images of at least 2 classes")
    assert "one class only: cat has images" in cli("inspect", tmp_path / "out").stdout


def test_a_class_with_val_images_only_is_kept_and_warned_of(tmp_path):
    folder = tmp_path / "photos"
    for split, names in (("train", ["a", "b"]), ("val", ["a", "b", "c"])):
        for k, name in enumerate(names):
            noise_png(folder / split / name / "0.png", k)
    out = tmp_path / "out"
    result = cli("prepare", folder, out, "--workers", 1, "--classes", "present")
    assert result.returncode == 0, result.stderr
    (warning,) = stderr_lines(result)
    assert warning == (f"prepare-dataset: warning: {folder}: 1 class has val images but no "
                       f"train images (c); the model cannot learn them")
    assert open_dataset(out, "val").classes == ["a", "b", "c"]
    assert "no train images: 1 of 3 classes have val images only: c" in cli("inspect", out).stdout


def test_present_renumbers_integer_labels_and_keeps_the_val_carve(tmp_path):
    """A CSV of labels 0 and 5 declares classes "0".."5"; `present` keeps "0" and "5", and the
    val carve (keyed by the source's ids) picks the same samples as with `all`."""
    rows = []
    for k in range(12):
        noise_png(tmp_path / f"{k}.png", k)
        rows.append(f"{k}.png,{0 if k % 2 else 5}")
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
    kept = {}
    for choice in ("all", "present"):
        out = tmp_path / choice
        prepare_dataset(tmp_path / "list.csv", out, PrepareOptions(
            workers=1, progress=False, val_fraction=0.25, classes=choice))
        kept[choice] = [open_dataset(out, split) for split in ("train", "val")]
    assert kept["all"][0].classes == ["0", "1", "2", "3", "4", "5"]
    assert kept["present"][0].classes == ["0", "5"]
    for before, after in zip(kept["all"], kept["present"]):
        assert (before.labels // 5).tolist() == after.labels.tolist()
        assert [before.image(i).tobytes() for i in range(len(before))] == \
            [after.image(i).tobytes() for i in range(len(after))]
    with pytest.raises(PrepareError, match="--classes must be all or present, not 'some'"):
        prepare_dataset(tmp_path / "list.csv", tmp_path / "x", PrepareOptions(classes="some"))


def test_parts_merge_to_the_same_present_dataset(cats_and_dogs, tmp_path):
    source, _ = cats_and_dogs
    options = dict(workers=1, progress=False, shard_size=30_000, classes="present")
    prepare_dataset(source, tmp_path / "whole", PrepareOptions(**options))
    for i in range(2):
        prepare_dataset(source, tmp_path / "parts", PrepareOptions(**options, part=(i, 2)))
    merged = merge(tmp_path / "parts")
    whole = json.loads((tmp_path / "whole" / "dataset.json").read_text())
    assert merged["source"]["dropped_classes"] == whole["source"]["dropped_classes"] == EMPTY
    assert merged["classes"] == whole["classes"] == ["cat", "dog"]


def test_dataset_json_dropped_classes_must_be_names(tmp_path):
    info = {"format_version": 1, "classes": ["a"], "splits": {"train": {
        "file": "train.beton", "num_samples": 1}}, "source": {"dropped_classes": "b"}}
    with pytest.raises(DatasetError, match=r"source.dropped_classes must be a list of class "
                                           r"names, not 'b'"):
        check_dataset_info(info, tmp_path, check_files=False)


def test_unknown_choice_is_one_line(tmp_path):
    result = cli("prepare", tmp_path, tmp_path / "out", "--classes", "some")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert stderr_lines(result)[-1] == ("turbotrain prepare: error: argument --classes: invalid "
                                        "choice: 'some' (choose from 'all', 'present')")
