"""Every pipeline against every other: nothing is trained or evaluated, only compared.

For the same split, options and seed, `pytorch`, `resident`, `dali` and `ffcv` (all registered
pipelines) must deliver the same labels in the same order, and images that agree:

* evaluation: each pipeline's image of sample i vs ``ds.image(i)`` centre-cropped (the square of
  side crop_ratio * min(h, w)) and resized to S with cv2 INTER_AREA. Tolerance: mean absolute
  difference <= EVAL_TOLERANCE grey levels per image. What differs legitimately: the JPEG
  decoder's IDCT (libjpeg-turbo accurate vs FFCV's fast IDCT, nvJPEG on GPUs: ~1 level), the
  resize filter (cv2 INTER_LINEAR / INTER_AREA in `pytorch`, DALI's antialiased linear, FFCV's
  INTER_AREA) and `resident`'s two-step resize (square -> S / crop_ratio -> centre crop).
* training, photo-sized: `pytorch`, `dali` and `ffcv` use the same boxes and flips (augment.py),
  so their images agree within TRAIN_TOLERANCE; `resident` draws its boxes on the centre square
  it keeps (see resident.py), so only its labels are compared.
* small images (pad-crop + flip, identity for eval): bit-exact across all pipelines.

bench/gpu_check.py, which compares the pipelines against a synthetic-data bound on a GPU, is
run here in its CPU smoke mode, with and without the optional engines.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from turbotrain.datasets import open_dataset
from turbotrain.datasets.beton import layout
from turbotrain.datasets.beton.writer import BetonWriter
from turbotrain.pipeline import PipelineOptions, augment

from .conftest import PHOTO_SIZES, build, photo_image, product_pipelines, run_epoch

# One pytest worker runs this whole module (make test: --dist loadgroup), so its module-scoped
# fixture runs once, not once per worker: photo_runs trains on every pipeline.
pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("parity"),
              pytest.mark.usefixtures("child_processes")]

NAMES = product_pipelines()
# Grey levels, mean |difference| per image (see the module docstring). Measured worst cases on
# this split: eval dali 0.4, ffcv 0.9, pytorch 1.5, resident 3.2; train vs pytorch: dali 2.1,
# ffcv 2.2 (resident 41: other boxes).
EVAL_TOLERANCE = 4.0
TRAIN_TOLERANCE = 3.5
SAME_BOXES = {"pytorch", "dali", "ffcv"}  # pipelines that crop the stored pixels


# -- references, also used by test_dali.py and test_ffcv.py ------------------------------------
def reference(dataset, family: str, indices, *, seed: int, epoch: int, size: int,
              **ranges):
    """What the shared boxes mean, in numpy/cv2: crop (or reflect-pad-crop), resize, flip.
    `ranges`: RandomResizedCrop's scale= and ratio=, when not the defaults."""
    import cv2
    indices = np.asarray(indices)
    boxes = augment.crop_boxes(family, seed=seed, epoch=epoch, indices=indices,
                               heights=dataset.heights[indices], widths=dataset.widths[indices],
                               image_size=size, **ranges)
    out = []
    for k, i in enumerate(indices.tolist()):
        top, left, h, w, flip = boxes.row(k)
        image = dataset.image(i)
        if family in (augment.PAD_CROP, augment.IDENTITY):
            if image.shape[:2] != (size, size):
                image = cv2.resize(image, (size, size), interpolation=cv2.INTER_AREA)
            p = augment.SMALL_IMAGE_PADDING
            padded = np.pad(image, ((p, p), (p, p), (0, 0)), mode="reflect")
            crop = padded[top + p:top + p + h, left + p:left + p + w]
        else:
            crop = cv2.resize(image[top:top + h, left:left + w], (size, size),
                              interpolation=cv2.INTER_AREA)
        out.append(crop[:, ::-1] if flip else crop)
    return np.stack(out)


def write_mixed_split(path, count: int = 20) -> str:
    """Every third sample raw, the rest JPEG, photo-sized; labels are the indices."""
    import simplejpeg
    with BetonWriter(path, count, page_size=layout.MIN_PAGE_SIZE) as writer:
        for i in range(count):
            h, w = PHOTO_SIZES[i % len(PHOTO_SIZES)]
            image = photo_image(i, h, w)
            if i % 3 == 0:
                writer.append(layout.MODE_RAW, h, w, image.tobytes(), i)
            else:
                writer.append(layout.MODE_JPEG, h, w, simplejpeg.encode_jpeg(image, quality=95), i)
    return str(path)


def options(size: int, train: bool, **extra) -> dict:
    return dict(train=train, batch_size=8, image_size=size, seed=11, workers=2,
                drop_last=False, device=torch.device("cpu"), **extra)


def epoch_of(name: str, dataset, size: int, train: bool, epoch: int, **extra):
    with build(name, dataset, **options(size, train, **extra)) as pipeline:
        batches = run_epoch(pipeline, epoch)
    images = torch.cat([b[0] for b in batches]).permute(0, 2, 3, 1).numpy()
    labels = torch.cat([b[1] for b in batches]).numpy()
    return images, labels


@pytest.fixture(scope="module")
def photo_runs(photo_path):
    """{(name, train): (images NHWC, labels)} for epoch 1 of the photo split, 32 px."""
    dataset = open_dataset(photo_path)
    return {(name, train): epoch_of(name, dataset, 32, train, epoch=1)
            for name in NAMES for train in (True, False)}


@pytest.mark.parametrize("train", [True, False])
def test_same_labels_in_the_same_order(train, photo_runs):
    reference = photo_runs[("pytorch", train)][1]
    assert len(reference) == 40
    for name in NAMES:
        assert photo_runs[(name, train)][1].tolist() == reference.tolist(), name


def centre_crop_reference(dataset, i: int, size: int, crop_ratio: float = 0.875) -> np.ndarray:
    import cv2
    box = augment.centre_crop(dataset.heights[i:i + 1], dataset.widths[i:i + 1], crop_ratio)
    top, left, h, w, _ = box.row(0)
    crop = dataset.image(i)[top:top + h, left:left + w]
    return cv2.resize(crop, (size, size), interpolation=cv2.INTER_AREA)


def test_eval_images_agree_with_the_stored_image(photo_path, photo_runs):
    dataset = open_dataset(photo_path)
    worst = {}
    for name in NAMES:
        images, labels = photo_runs[(name, False)]
        diffs = [np.abs(image.astype(np.float32) - centre_crop_reference(dataset, i, 32)).mean()
                 for image, i in zip(images, labels.tolist())]
        worst[name] = max(diffs)
    assert all(d <= EVAL_TOLERANCE for d in worst.values()), worst


def test_train_images_agree_where_boxes_are_shared(photo_runs):
    names = sorted(SAME_BOXES & set(NAMES))
    base = photo_runs[(names[0], True)][0].astype(np.float32)
    for name in names[1:]:
        per_image = np.abs(photo_runs[(name, True)][0] - base).mean(axis=(1, 2, 3))
        assert per_image.max() <= TRAIN_TOLERANCE, (name, per_image.max())


# train --scale 0.25 0.5 --ratio 0.5 2: small, far from square boxes, unlike the defaults'.
CROP_RANGES = dict(scale=(0.25, 0.5), ratio=(0.5, 2.0))


def test_every_pipeline_crops_the_same_boxes_with_other_scale_and_ratio(photo_path,
                                                                        monkeypatch):
    """--scale / --ratio reach every pipeline: each draws its boxes with them, and those that
    crop the stored pixels deliver what those boxes mean (the numpy/cv2 reference) and agree
    with each other; the crops differ from the default ranges' crops."""
    dataset = open_dataset(photo_path)
    asked, current = {}, [""]
    original = augment.crop_boxes

    def spy(family, **kwargs):
        if family == augment.RESIZED_CROP:  # resident also decodes its store (centre crops)
            asked.setdefault(current[0], set()).add((kwargs["scale"], kwargs["ratio"]))
        return original(family, **kwargs)
    monkeypatch.setattr(augment, "crop_boxes", spy)
    runs = {}
    for name in NAMES:
        current[0] = name
        runs[name] = epoch_of(name, dataset, 32, True, epoch=1, **CROP_RANGES)
    assert asked == {name: {(CROP_RANGES["scale"], CROP_RANGES["ratio"])} for name in NAMES}
    images, labels = runs["pytorch"]
    for name in NAMES:
        assert np.array_equal(runs[name][1], labels), name
    expected = reference(dataset, augment.RESIZED_CROP, labels, seed=11, epoch=1, size=32,
                         **CROP_RANGES).astype(np.float32)
    for name in sorted(SAME_BOXES & set(NAMES)):
        per_image = np.abs(runs[name][0] - expected).mean(axis=(1, 2, 3))
        assert per_image.max() <= TRAIN_TOLERANCE, (name, per_image.max())
    current[0] = "default"
    default, _ = epoch_of("pytorch", dataset, 32, True, epoch=1)
    # The default ranges' crops fail that check: 37 of these 40 images (the photos are smooth
    # gradients, so some boxes look alike).
    per_image = np.abs(default - expected).mean(axis=(1, 2, 3))
    assert (per_image > TRAIN_TOLERANCE).mean() >= 0.75, sorted(per_image.tolist())


def test_pipeline_options_refuse_bad_crop_ranges():
    for bad in (dict(scale=(0.0, 1.0)), dict(scale=(0.5, 0.4)), dict(scale=(0.5, 1.2)),
                dict(ratio=(0.0, 1.0)), dict(ratio=(2.0, 1.0))):
        with pytest.raises(ValueError, match="scale needs|ratio needs"):
            PipelineOptions(**options(32, True, **bad))


@pytest.mark.parametrize("train", [True, False])
def test_small_images_are_identical_everywhere(train, small_path):
    dataset = open_dataset(small_path)
    runs = {name: epoch_of(name, dataset, 16, train, epoch=2) for name in NAMES}
    images, labels = runs["pytorch"]
    for name, (other_images, other_labels) in runs.items():
        assert np.array_equal(other_labels, labels), name
        assert np.array_equal(other_images, images), name


# -- bench/gpu_check.py: the GPU script must at least run here, in its CPU smoke mode -------------
GPU_CHECK = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


def run_gpu_check(tmp_path, prelude: str = "", *args: str) -> dict:
    """Runs the script in a child process (fresh DALI/FFCV/numba state); returns its JSON."""
    out = tmp_path / "gpu_check.json"
    argv = ["gpu_check.py", "--smoke", "--json", str(out), *args]
    code = (f"import runpy, sys\n{prelude}\nsys.argv = {argv!r}\n"
            f"runpy.run_path({str(GPU_CHECK)!r}, run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "of bound" in done.stdout  # the table
    result = json.loads(out.read_text())
    result["stdout"] = done.stdout
    return result


@pytest.mark.timeout(300)
def test_gpu_check_says_which_engines_are_missing(tmp_path):
    """The GPU box has neither DALI nor FFCV (nor simplejpeg): it must say so and go on."""
    hide = "for m in ('nvidia.dali', 'ffcv', 'simplejpeg'):\n    sys.modules[m] = None"
    result = run_gpu_check(tmp_path, hide)
    assert result["engines"]["dali"] is None and result["engines"]["ffcv"] is None
    assert any("dali is MISSING" in note for note in result["notes"])
    names = {row["pipeline"] for row in result["rows"] if not row.get("error")}
    assert {"pytorch (cv2 decode)", "resident (cv2 decode)", "plain_torchvision_nvjpeg"} <= names


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gpu_check_all_smoke_runs_every_stage_on_cpu(tmp_path):
    """`make gpu-check` (--all) in its CPU smoke form: the CUDA tests of one file (skipped
    here), `train` on resident/dali and its synthetic bound through bench/gpu_train.py, the
    pytorch scaling, the table with every pipeline, and one verdict line per goal. (The
    table alone is `gpu_check.py --smoke`, which the missing-engines test runs.)"""
    result = run_gpu_check(tmp_path, "", "--all", "--tests",
                           "tests/train/engine/test_batch_finder.py")
    measured = {row["pipeline"]: row for row in result["rows"]}
    expected_rows = {"synthetic", "pytorch", "resident", "plain_torchvision_nvjpeg"}
    expected_rows |= {name for name in ("dali", "ffcv") if result["engines"][name]}
    assert expected_rows <= set(measured), measured
    assert all(measured[name]["train"] > 0 for name in expected_rows), measured
    tests = result["tests"]
    assert tests["returncode"] == 0 and tests["counts"].get("skipped", 0) >= 1
    runs = {row["run"]: row for row in result["train_runs"]}
    expected = {"default-resident", "default-synthetic-0"}
    expected |= {"default-dali"} if result["engines"]["dali"] else set()
    assert expected <= set(runs), runs
    assert all(runs[name]["images_per_second"] > 0 for name in expected), runs
    assert runs["default-resident"]["bound_images_per_second"] > 0
    assert runs["default-synthetic-0"]["pipeline"] == "gpu-check-synthetic"
    assert result["scaling"]["one_thread"] > 0 and result["scaling"]["efficiency"] > 0
    lines = [line for line in result["stdout"].splitlines() if line.startswith("goal: ")]
    assert len(lines) == len(result["goals"]) >= 10
    assert all(line.endswith(("-> met", "-> MISSED", "-> not measured")) for line in lines)
    assert "train defaults on resident" in result["stdout"]
