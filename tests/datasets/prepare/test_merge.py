"""`prepare-dataset --part i/N` on many machines, then `turbotrain merge OUT`: the merged folder
equals a one-machine run byte for byte, and every way the parts can disagree is one line."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from turbotrain.datasets import open_dataset
from turbotrain.datasets.prepare.convert import PrepareError, PrepareOptions, prepare_dataset
from turbotrain.datasets.prepare.merge import MergeError, merge
from turbotrain.datasets.synthetic import write_shapes_imagefolder

from ..cli_run import cli, one_line_error

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast

SMALL_SHARDS = 30_000  # ~4 photos of 160x120 per shard: 11 train + 6 val shards


def options(**kw) -> PrepareOptions:
    return PrepareOptions(**{"workers": 1, "progress": False, "shard_size": SMALL_SHARDS, **kw})


def run_parts(source, out, parts: int, **kw) -> None:
    for i in range(parts):
        prepare_dataset(source, out, options(part=(i, parts), **kw))


def same_folders(a: Path, b: Path) -> None:
    names = sorted(os.listdir(a))
    assert names == sorted(os.listdir(b))
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    source = write_shapes_imagefolder(root, train_per_class=4, val_per_class=2, size=(160, 120))
    # One unreadable file, so skipped.txt and the skipped counts go through the parts too.
    (source / "train" / "circle" / "zz-broken.jpg").write_bytes(b"not a jpeg")
    # Files the listing passes over are skipped.txt lines too, listed once whatever the parts.
    (source / "train" / "circle" / "notes.txt").write_text("drawn by hand")
    (source / "README.md").write_text("shapes")
    return source


@pytest.fixture(scope="module")
def whole(photos, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "ds"
    prepare_dataset(photos, out, options(on_error="skip"))
    return out


def test_parts_in_one_folder_merge_to_the_one_machine_bytes(photos, whole, tmp_path):
    out = tmp_path / "shared"
    run_parts(photos, out, 3, on_error="skip", workers=2)
    assert not (out / "dataset.json").exists()
    assert sorted(os.listdir(out / "parts")) == [f"part-0000{i}-of-00003.json" for i in range(3)]
    result = cli("merge", out)
    assert result.returncode == 0, result.stderr
    assert "merged" in result.stdout and "17 shards" in result.stdout
    same_folders(out, whole)  # dataset.json, skipped.txt and every shard; no parts/ left
    assert (out / "skipped.txt").read_text().count("\n") == 3
    assert len(open_dataset(out)) == 40


def test_parts_in_separate_folders_copied_together(photos, whole, tmp_path):
    for i in range(3):
        prepare_dataset(photos, tmp_path / f"machine{i}", options(part=(i, 3), on_error="skip"))
    together = tmp_path / "together"
    for i in range(3):  # as `cp -r machine*/. together/` would
        shutil.copytree(tmp_path / f"machine{i}", together, dirs_exist_ok=True)
    merge(together)
    same_folders(together, whole)


def test_more_parts_than_shards_and_one_part(photos, whole, tmp_path):
    run_parts(photos, tmp_path / "many", 20, on_error="skip")  # some parts get no shard
    merge(tmp_path / "many")
    same_folders(tmp_path / "many", whole)
    run_parts(photos, tmp_path / "one", 1, on_error="skip")
    merge(tmp_path / "one")
    same_folders(tmp_path / "one", whole)


def test_missing_part_is_one_line(photos, tmp_path):
    out = tmp_path / "ds"
    for i in (0, 2):
        prepare_dataset(photos, out, options(part=(i, 3), on_error="skip"))
    line = one_line_error(cli("merge", out))
    assert "part(s) 1 of 3 missing" in line and "--part 1/3" in line
    assert not (out / "dataset.json").exists()


def test_interrupted_part_leaves_nothing_that_looks_finished(photos, tmp_path):
    """A part killed mid-way leaves at most its hidden folder and no manifest; its re-run
    replaces them without --overwrite, and merge then succeeds."""
    out = tmp_path / "ds"
    run_parts(photos, out, 3, on_error="skip")
    manifest = out / "parts" / "part-00001-of-00003.json"
    manifest.unlink()  # as if part 1 died before its manifest was written
    (out / ".part-00001-of-00003.partial-otherhost-1").mkdir()  # and left its hidden folder
    with pytest.raises(MergeError, match="part\\(s\\) 1 of 3 missing"):
        merge(out)
    prepare_dataset(photos, out, options(part=(1, 3), on_error="skip"))
    assert not (out / ".part-00001-of-00003.partial-otherhost-1").exists()
    merge(out)
    assert len(open_dataset(out, "val")) == 20


def test_a_done_part_is_skipped_redone_with_overwrite_never_a_merged_dataset(photos, tmp_path):
    """A part done with the same inputs is skipped (an engine's retry, a rerun after a crash);
    --overwrite redoes it."""
    out = tmp_path / "ds"
    first = prepare_dataset(photos, out, options(part=(0, 2), on_error="skip"))
    assert not first.get("skipped_as_done")
    manifest = out / "parts" / "part-00000-of-00002.json"
    made = manifest.stat().st_mtime_ns
    again = prepare_dataset(photos, out, options(part=(0, 2), on_error="skip"))
    assert again["skipped_as_done"] and manifest.stat().st_mtime_ns == made
    prepare_dataset(photos, out, options(part=(0, 2), on_error="skip", overwrite=True))
    assert manifest.stat().st_mtime_ns != made
    (out / "notes.txt").write_text("mine")
    with pytest.raises(PrepareError, match="did not write \\(notes.txt\\)"):
        prepare_dataset(photos, out, options(part=(1, 2), on_error="skip"))
    (out / "notes.txt").unlink()
    prepare_dataset(photos, out, options(part=(1, 2), on_error="skip"))
    merge(out)
    with pytest.raises(PrepareError, match="holds a merged dataset"):
        prepare_dataset(photos, out, options(part=(1, 2), on_error="skip", overwrite=True))
    for check in ([], ["--check"]):
        assert "already merged" in one_line_error(cli("merge", out, *check))


def test_a_part_done_with_other_settings_is_refused_in_one_line(photos, tmp_path):
    out = tmp_path / "ds"
    prepare_dataset(photos, out, options(part=(0, 2), on_error="skip"))
    with pytest.raises(PrepareError, match="part 0/2 in .* is done with other encoding.quality"):
        prepare_dataset(photos, out, options(part=(0, 2), on_error="skip", quality=80))
    line = one_line_error(cli("prepare", photos, out, "--shard-size", "8MiB", "--part", "0/2",
                              "--on-error", "skip", "--workers", "1"))
    assert "is done with other encoding.shard_size" in line and "--overwrite" in line
    assert cli("merge", out, "--check").stdout.splitlines() == [
        "done: 0", "part 1/2: missing (not run)", "1 of 2 parts done, 1 missing, 0 damaged"]


def test_check_lists_done_missing_and_damaged_parts(photos, tmp_path):
    """`merge --check` (`--parts-status`): what merge would find, by manifests and shard sizes
    (nothing read, nothing written); exit code 0 only when every part is done."""
    out = tmp_path / "ds"
    run_parts(photos, out, 5, on_error="skip")
    result = cli("merge", out, "--parts-status")
    assert result.returncode == 0
    assert result.stdout.splitlines() == ["done: 0-4",
                                          "5 of 5 parts done, 0 missing, 0 damaged; ready to merge"]
    (out / "parts" / "part-00001-of-00005.json").unlink()
    (out / ".part-00001-of-00005.partial-otherhost-7").mkdir()  # as a killed part leaves it
    (out / "parts" / "part-00003-of-00005.json").write_text("{not json")
    victim = out / "val-00005-of-00006.beton"  # the last shard: part 4/5's
    victim.write_bytes(victim.read_bytes()[:-5])
    result = cli("merge", out, "--check")
    assert result.returncode == 1 and not (out / "dataset.json").exists()
    lines = result.stdout.splitlines()
    assert lines[0] == "done: 0, 2"
    assert lines[1] == ("part 1/5: missing (interrupted: .part-00001-of-00005.partial-otherhost-7 "
                        "is its unfinished folder)")
    assert lines[2].startswith("part 3/5: damaged (not a readable part manifest")
    assert lines[3].startswith(f"part 4/5: damaged ({victim}: ") and "manifest says" in lines[3]
    assert lines[4] == "2 of 5 parts done, 1 missing, 2 damaged"


def test_part_with_other_options_is_one_line(photos, tmp_path):
    out = tmp_path / "ds"
    prepare_dataset(photos, out, options(part=(0, 2), on_error="skip"))
    prepare_dataset(photos, out, options(part=(1, 2), on_error="skip", quality=80))
    line = one_line_error(cli("merge", out))
    assert "part-00001-of-00002.json: made with different encoding.quality" in line


def test_part_with_another_shard_size_is_one_line(photos, tmp_path):
    out = tmp_path / "ds"
    prepare_dataset(photos, out, options(part=(0, 2), on_error="skip"))
    prepare_dataset(photos, out, options(part=(1, 2), on_error="skip",
                                         shard_size=SMALL_SHARDS * 2))
    line = one_line_error(cli("merge", out))
    assert "made with different encoding.shard_size" in line


def test_parts_of_different_counts_are_one_line(photos, tmp_path):
    out = tmp_path / "ds"
    prepare_dataset(photos, out, options(part=(0, 2), on_error="skip"))
    prepare_dataset(photos, out, options(part=(1, 3), on_error="skip"))
    line = one_line_error(cli("merge", out))
    assert "manifests of 2 and 3 parts" in line


def test_corrupted_or_missing_shard_is_one_line(photos, tmp_path):
    out = tmp_path / "ds"
    run_parts(photos, out, 3, on_error="skip")
    victim = out / "train-00005-of-00011.beton"
    data = bytearray(victim.read_bytes())
    data[-30] ^= 0xFF  # same size: only the checksum can tell
    victim.write_bytes(bytes(data))
    line = one_line_error(cli("merge", out))
    assert "train-00005-of-00011.beton: its checksum is not the one part 1/3 recorded" in line
    victim.write_bytes(bytes(data[:-8]))
    line = one_line_error(cli("merge", out))
    assert "train-00005-of-00011.beton:" in line and "bytes, part 1/3's manifest says" in line
    victim.unlink()
    line = one_line_error(cli("merge", out))
    assert "train-00005-of-00011.beton: missing (part 1/3 lists it)" in line
    assert not (out / "dataset.json").exists()


def test_stray_shard_and_bad_manifest_are_one_line(photos, tmp_path):
    out = tmp_path / "ds"
    run_parts(photos, out, 2, on_error="skip")
    (out / "train-00000-of-00002.beton").write_bytes(b"old")
    line = one_line_error(cli("merge", out))
    assert "no part manifest lists (train-00000-of-00002.beton)" in line
    (out / "train-00000-of-00002.beton").unlink()
    manifest = out / "parts" / "part-00000-of-00002.json"
    data = json.loads(manifest.read_text())
    data["shards"][0]["file"] = "../../etc/passwd"
    manifest.write_text(json.dumps(data))
    line = one_line_error(cli("merge", out))
    assert "part-00000-of-00002.json: has an invalid entry" in line
    manifest.write_text("{not json")
    line = one_line_error(cli("merge", out))
    assert "part-00000-of-00002.json: not a readable part manifest" in line
    line = one_line_error(cli("merge", tmp_path / "nothing"))
    assert "no parts/ folder" in line


def test_cli_parts_with_the_smallest_shard_size(tmp_path):
    """The real flags end to end: 6,000 raw 32x32 images are ~17 MiB of pixels, 3 shards of
    8 MiB, prepared as 2 parts and merged, equal to the one-machine run."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "src.npz", images=rng.integers(0, 255, (6000, 32, 32, 3), np.uint8),
             labels=rng.integers(0, 10, 6000))
    common = ["--shard-size", "8MiB", "--workers", "1"]
    assert cli("prepare", tmp_path / "src.npz", tmp_path / "whole", *common).returncode == 0
    for i in range(2):
        result = cli("prepare", tmp_path / "src.npz", tmp_path / "parts", *common,
                     "--part", f"{i}/2")
        assert result.returncode == 0, result.stderr
        assert f"prepared part {i}/2" in result.stdout and "turbotrain merge" in result.stdout
    assert cli("merge", tmp_path / "parts").returncode == 0
    same_folders(tmp_path / "parts", tmp_path / "whole")
    assert open_dataset(tmp_path / "whole").num_shards == 3


@pytest.mark.parametrize("part", [[], ["--part", "0/2"]])
def test_an_object_storage_out_is_refused_in_one_line(photos, tmp_path, monkeypatch, part):
    """Path('s3://b/x') would be the local folder ./s3:/b/x: refused before anything is made."""
    monkeypatch.chdir(tmp_path)
    line = one_line_error(cli("prepare", photos, "s3://bucket/x", "--shard-size", "8MiB", *part))
    assert line.startswith("prepare-dataset: error: s3://bucket/x: OUT must be a folder") and "upload" in line, line
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("check", [[], ["--check"]])
def test_merge_of_an_object_storage_out_is_refused_in_one_line(tmp_path, monkeypatch, check):
    """Path('s3://b/x') would be the local s3:/b/x: the line named that and no upload."""
    monkeypatch.chdir(tmp_path)
    line = one_line_error(cli("merge", "s3://bucket/x", *check))
    assert line.startswith("turbotrain merge: error: s3://bucket/x: merge works on a folder")
    assert "upload" in line and os.listdir(tmp_path) == []
