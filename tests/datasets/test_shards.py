"""Sharded splits: the shard plan, the files prepare-dataset writes, reading them back as one
split, inspect/verify, and training on them with each pipeline that reads through the split."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from turbotrain.datasets import BetonFile, DatasetError, open_dataset
from turbotrain.datasets.beton.shards import LocalShard, parse_shard_filename, shard_filename
from turbotrain.datasets.beton.verify import describe, verify
from turbotrain.datasets.prepare.convert import PrepareOptions, prepare_dataset
from turbotrain.datasets.prepare.shard_plan import (ShardPlanError, cut, parse_part,
                                                    parse_shard_size, part_shards, plan_split)
from turbotrain.datasets.prepare.split_order import shuffled_order
from turbotrain.datasets.sources.detect import detect_source
from turbotrain.datasets.synthetic import write_shapes_imagefolder

from .cli_run import cli, one_line_error

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast

# JPEGs of 160x120 are ~7 KB: 30 KB shards hold ~4 images, so 40 train images make ~11 shards.
SMALL_SHARDS = 30_000



def linked_copy(src: Path, dst: Path) -> Path:
    """A copy of a dataset folder made of hard links (shards are sparse 16 MB files)."""
    dst.mkdir()
    for name in os.listdir(src):
        os.link(src / name, dst / name)
    return dst


def options(**kw) -> PrepareOptions:
    return PrepareOptions(**{"workers": 1, "progress": False, **kw})


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    return write_shapes_imagefolder(root, train_per_class=4, val_per_class=2, size=(160, 120))


@pytest.fixture(scope="module")
def sharded(photos, tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded") / "ds"
    prepare_dataset(photos, out, options(shard_size=SMALL_SHARDS))
    return out


@pytest.fixture(scope="module")
def flat(photos, tmp_path_factory):
    out = tmp_path_factory.mktemp("flat") / "ds"
    prepare_dataset(photos, out, options())
    return out


# -- sizes, parts and the plan ------------------------------------------------------------------
def test_parse_shard_size_units_and_refusals():
    assert parse_shard_size("1GB") == 10**9 and parse_shard_size("512MB") == 512 * 10**6
    assert parse_shard_size("64MiB") == 64 << 20 and parse_shard_size("268435456") == 268435456
    assert parse_shard_size("8MiB") == 8 << 20
    for bad in ("1MB", "4MiB", "0", "-1GB", "lots", "1XB", ""):
        with pytest.raises(ShardPlanError, match="--shard-size"):
            parse_shard_size(bad)
    assert parse_part("1/4") == (1, 4)
    for bad in ("4/4", "-1/4", "1", "a/b", "0/0"):
        with pytest.raises(ShardPlanError, match="--part"):
            parse_part(bad)


def test_cut_fills_shards_in_order_and_never_leaves_one_empty():
    sizes = np.array([4, 4, 4, 10, 1, 1, 30, 2], dtype=np.int64)
    assert cut(sizes, 9).tolist() == [0, 2, 3, 4, 6, 7, 8]  # 30 alone: a shard of its own
    assert cut(sizes, 1000).tolist() == [0, 8]
    assert cut(np.zeros(0, dtype=np.int64), 10).tolist() == [0, 0]


def test_parts_cover_every_shard_once_contiguously():
    for shards in (1, 5, 12, 100):
        for parts in (1, 3, 4, 7):
            ranges = [part_shards(shards, i, parts) for i in range(parts)]
            assert [k for r in ranges for k in r] == list(range(shards))


def test_plan_is_a_function_of_the_listing(photos):
    source = detect_source(photos)
    first = plan_split("train", source.splits["train"], SMALL_SHARDS)
    again = plan_split("train", detect_source(photos).splits["train"], SMALL_SHARDS)
    assert first.bounds.tolist() == again.bounds.tolist() and first.digest() == again.digest()
    assert first.num_shards > 3
    sizes = [os.path.getsize(source.splits["train"].name(i)) for i in range(40)]
    for k in range(first.num_shards):  # each shard stays within the size but for one sample
        start, stop = first.bounds[k], first.bounds[k + 1]
        assert stop > start and (sum(sizes[start:stop - 1]) <= SMALL_SHARDS)


# -- what prepare writes ------------------------------------------------------------------------
def test_shard_files_and_index(sharded):
    info = json.loads((sharded / "dataset.json").read_text())
    assert info["format_version"] == 2 and info["encoding"]["shard_size"] == SMALL_SHARDS
    for split, meta in info["splits"].items():
        assert "file" not in meta and meta["num_samples"] == sum(
            s["num_samples"] for s in meta["shards"])
        assert meta["bytes"] == sum(s["bytes"] for s in meta["shards"])
        total = len(meta["shards"])
        for k, entry in enumerate(meta["shards"]):
            assert entry["file"] == shard_filename(split, k, total)
            assert parse_shard_filename(entry["file"]) == (split, k, total)
            beton = BetonFile(sharded / entry["file"])  # each shard is a .beton on its own
            assert len(beton) == entry["num_samples"] and beton.file_size == entry["bytes"]
    files = sorted(os.listdir(sharded))
    assert files[0] == "dataset.json" and all(f.endswith(".beton") for f in files[1:])


def test_sharded_split_reads_like_the_unsharded_one(sharded, flat):
    for split in ("train", "val"):
        a, b = open_dataset(sharded, split), open_dataset(flat, split)
        assert a.num_shards > 1 and b.num_shards == 1 and len(a) == len(b)
        # the sharded train split is stored shuffled (sources.shuffled_train), val as it is
        order = shuffled_order(len(b)) if split == "train" else np.arange(len(b))
        assert (split == "train") == (order.tolist() != sorted(order.tolist()))
        for name in ("labels", "modes", "heights", "widths"):
            assert np.array_equal(getattr(a, name), getattr(b, name)[order])
        for i in range(len(a)):
            (x, y), (u, v) = a.read(i), b.read(int(order[i]))
            assert bytes(x) == bytes(u) and y == v
            assert bytes(a.payload(i)) == bytes(b.payload(int(order[i])))
        assert np.array_equal(a.image(len(a) - 1), b.image(int(order[-1])))
        assert a.mean == b.mean and a.std == b.std and a.classes == b.classes
    info_a = json.loads((sharded / "dataset.json").read_text())
    info_b = json.loads((flat / "dataset.json").read_text())
    assert info_a["pixel_stats"] == info_b["pixel_stats"]  # integer sums: any grouping


def test_train_shards_mix_the_classes_of_a_class_sorted_source(sharded, flat):
    """An ImageFolder lists by class; in source order most of these shards would hold one
    class (4 images a shard, 4 a class), which the quasi-random order's windows would feed."""
    assert np.all(np.diff(open_dataset(flat).labels) >= 0)  # the source order: by class
    ds = open_dataset(sharded)
    bounds = ds.shard_bounds
    mixed = [len(set(ds.labels[bounds[k]:bounds[k + 1]].tolist())) > 1
             for k in range(ds.num_shards)]
    assert sum(mixed) >= ds.num_shards - 1, mixed


def test_split_maps_global_indices_to_shards(sharded):
    ds = open_dataset(sharded)
    bounds = ds.shard_bounds
    assert bounds.dtype == np.int64 and bounds[0] == 0 and bounds[-1] == len(ds)
    assert len(bounds) == ds.num_shards + 1
    for i in range(len(ds)):
        k = ds.shard_of(i)
        assert bounds[k] <= i < bounds[k + 1]
        assert k == int(np.searchsorted(bounds, i, side="right")) - 1
    ds.will_read([3, 1])  # local shards: a no-op
    with pytest.raises(IndexError):
        ds.read(len(ds))
    with pytest.raises(DatasetError, match="shards, not one .beton"):
        ds.beton
    assert ds.nbytes == sum(s.nbytes for s in ds.shards)


def test_shards_open_lazily_and_the_split_pickles_without_maps(sharded):
    ds = open_dataset(sharded)
    assert all(isinstance(s, LocalShard) for s in ds.shards)
    ds._betons = [None] * ds.num_shards  # as a split whose metadata came without opening
    ds.read(int(ds.shard_bounds[2]))
    assert [b is not None for b in ds._betons].count(True) == 1
    data = pickle.dumps(ds)
    assert len(data) < 100_000  # metadata only: no sample bytes travel
    copy = pickle.loads(data)
    assert bytes(copy.read(7)[0]) == bytes(ds.read(7)[0])


def test_byte_identical_for_any_worker_count(photos, sharded, tmp_path):
    out = tmp_path / "two"
    prepare_dataset(photos, out, options(shard_size=SMALL_SHARDS, workers=2))
    names = sorted(os.listdir(sharded))
    assert sorted(os.listdir(out)) == names
    for name in names:
        assert (out / name).read_bytes() == (sharded / name).read_bytes(), name


def test_array_source_shards_by_pixel_bytes(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (50, 16, 16, 3), dtype=np.uint8)
    np.savez(tmp_path / "src.npz", images=images, labels=rng.integers(0, 3, 50))
    out = tmp_path / "ds"
    prepare_dataset(tmp_path / "src.npz", out, options(shard_size=16 * 16 * 3 * 8))
    ds = open_dataset(out)
    assert np.diff(ds.shard_bounds).tolist() == [8] * 6 + [2]
    order = shuffled_order(50)  # stored shuffled
    assert all(np.array_equal(ds.read(i)[0], images[order[i]]) for i in range(50))


# -- the CLI ------------------------------------------------------------------------------------
def test_cli_refuses_bad_shard_size_and_part_without_it(photos, tmp_path):
    line = one_line_error(cli("prepare", photos, tmp_path / "a", "--shard-size", "1MB"))
    assert "--shard-size 1MB" in line and "8 MiB" in line
    line = one_line_error(cli("prepare", photos, tmp_path / "a", "--shard-size", "huge"))
    assert "--shard-size" in line
    line = one_line_error(cli("prepare", photos, tmp_path / "a", "--part", "0/2"))
    assert "--part needs --shard-size" in line
    line = one_line_error(cli("prepare", photos, tmp_path / "a", "--shard-size", "1GB",
                              "--part", "2/2"))
    assert "--part" in line
    assert not (tmp_path / "a").exists()


def test_cli_shard_size_writes_one_shard_for_small_data(photos, tmp_path):
    out = tmp_path / "ds"
    result = cli("prepare", photos, out, "--shard-size", "8MiB", "--workers", "1")
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(out)) == ["dataset.json", "train-00000-of-00001.beton",
                                       "val-00000-of-00001.beton"]
    # --overwrite replaces a sharded dataset it made (shard names are its own).
    result = cli("prepare", photos, out, "--shard-size", "8MiB", "--workers", "1", "--overwrite")
    assert result.returncode == 0, result.stderr


def test_inspect_and_verify_sharded(sharded, tmp_path):
    text = describe(sharded)
    assert "shards" in text and "40 images" in text
    assert verify(sharded, progress=False) == []
    copy = linked_copy(sharded, tmp_path / "copy")
    victim = copy / "train-00002-of-00011.beton"
    data = bytearray(victim.read_bytes())
    beton = BetonFile(sharded / victim.name)
    data[int(beton.data_ptrs[0]) + 100] ^= 0xFF  # same size, other bytes
    victim.unlink()  # a hard link: write a new file, not through to the original
    victim.write_bytes(bytes(data))
    problems = verify(copy, progress=False)
    assert any(victim.name in p and "checksum mismatch" in p for p in problems)
    result = cli("verify", copy)
    assert result.returncode == 2 and victim.name in result.stderr


def test_truncated_or_missing_shard_is_one_line(sharded, tmp_path):
    copy = linked_copy(sharded, tmp_path / "copy")
    victim = copy / "train-00004-of-00011.beton"
    data = victim.read_bytes()
    victim.unlink()
    victim.write_bytes(data[:-10])
    with pytest.raises(DatasetError, match="/train-00004-of-00011.beton: ") as exc:
        open_dataset(copy)
    assert "\n" not in str(exc.value)
    victim.unlink()
    line = one_line_error(cli("inspect", copy))
    assert "train-00004-of-00011.beton: missing" in line


@pytest.mark.parametrize("change, message", [
    (lambda s: s["shards"][0].update(num_samples=s["shards"][0]["num_samples"] + 1),
     "its shards hold"),
    (lambda s: s["shards"][1].update(file="../x.beton"), "shards[1].file"),
    (lambda s: s["shards"][0].update(sha256="zz"), "shards[0].sha256"),
    (lambda s: s["shards"][0].pop("bytes"), "shards[0].bytes"),
    (lambda s: s.update(shards=[]), "1 to 100,000 shard entries"),
    (lambda s: s.update(file="train.beton"), "either a file or shards"),
    (lambda s: s.update(shards=s["shards"] + s["shards"][:1],
                        num_samples=s["num_samples"] + s["shards"][0]["num_samples"],
                        bytes=s["bytes"] + s["shards"][0]["bytes"]), "lists one file twice"),
])
def test_schema_checks_the_shard_index(sharded, tmp_path, change, message):
    copy = linked_copy(sharded, tmp_path / "copy")
    (copy / "dataset.json").unlink()
    info = json.loads((sharded / "dataset.json").read_text())
    change(info["splits"]["train"])
    (copy / "dataset.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError) as exc:
        open_dataset(copy)
    assert "\n" not in str(exc.value)
    assert message in str(exc.value)


def test_sharded_dataset_needs_format_version_2(sharded, tmp_path):
    copy = linked_copy(sharded, tmp_path / "copy")
    (copy / "dataset.json").unlink()
    info = json.loads((sharded / "dataset.json").read_text())
    info["format_version"] = 1
    (copy / "dataset.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match="format_version must be 2"):
        open_dataset(copy)
    info["format_version"] = 3
    (copy / "dataset.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match="reads versions 1 and 2"):
        open_dataset(copy)


# -- training on shards -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sharded_tiny(tmp_path_factory):
    """16x16 raw squares (learnable), train in 6 shards and val in 2."""
    from tests.train.tiny_data import tiny_images
    root = tmp_path_factory.mktemp("tiny")
    images, labels = tiny_images(96, 16, 4, seed=0)
    np.savez(root / "src.npz", images=images, labels=labels)
    out = root / "ds"
    prepare_dataset(root / "src.npz", out, options(shard_size=16 * 16 * 3 * 16, val_fraction=0.25))
    assert open_dataset(out).num_shards > 2 and open_dataset(out, "val").num_shards > 1
    return out


@pytest.mark.parametrize("pipeline, worker_mode", [
    ("pytorch", "threads"), ("pytorch", "processes"), ("resident", "auto"), ("dali", "auto")])
def test_train_one_epoch_on_shards(pipeline, worker_mode, sharded_tiny, tmp_path):
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "turbotrain", "train", "--data", str(sharded_tiny), "--out",
         str(out), "--epochs", "1", "--batch-size", "8", "--threads", "1", "--workers", "1",
         "--pipeline", pipeline, "--worker-mode", worker_mode, "--device", "cpu"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pipeline"] == pipeline and summary["epochs"] == 1
    assert summary["steps"] == 72 // 8 and summary["val_loss"] is not None


def test_ffcv_refuses_shards_in_one_line_and_auto_picks_another(sharded_tiny, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "turbotrain", "train", "--data", str(sharded_tiny), "--out",
         str(tmp_path / "run"), "--epochs", "1", "--batch-size", "8", "--threads", "1",
         "--workers", "1", "--pipeline", "ffcv", "--device", "cpu"],
        capture_output=True, text=True, timeout=300)
    line = one_line_error(result)
    assert "FFCV's Loader reads one .beton file" in line and "shards" in line
    from turbotrain.pipeline import PipelineOptions
    from turbotrain.pipeline.auto import choose_pipeline, unavailable_reason
    ds = open_dataset(sharded_tiny)
    opts = PipelineOptions(batch_size=8, image_size=16, device="cpu", train=True)
    assert "FFCV's Loader reads one .beton file" in unavailable_reason("ffcv", ds, opts)
    assert choose_pipeline(ds, opts)[0] != "ffcv"


def test_cpu_decode_workers_reopen_the_shards(sharded_tiny):
    """The process-mode decoder pickles the split (not its maps) and reads every shard."""
    from turbotrain.pipeline.cpu_decode import BatchDecoder
    ds = open_dataset(sharded_tiny)
    decoder = BatchDecoder(ds, image_size=16, train=False, seed=0)
    copy = pickle.loads(pickle.dumps(decoder))
    indices = np.arange(len(ds))
    a = np.zeros((len(ds), 16, 16, 3), np.uint8)
    b = np.zeros_like(a)
    decoder.decode(indices, 0, a)
    copy.decode(indices, 0, b)
    assert np.array_equal(a, b) and a.any()
