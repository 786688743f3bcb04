"""`turbotrain merge OUT` on a folder nobody vouches for: every case of the second safety audit
through the real command in a confined child. A refused merge exits 2 with one line, stays
under a memory cap, and changes nothing at all: no dataset.json written, no manifest deleted,
no file outside OUT touched. Then a seeded fuzz of part manifests and the shard index."""
from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

from turbotrain.cli import main as turbotrain_main
from turbotrain.datasets.synthetic import write_shapes_imagefolder

from .confined import changed, run_confined, run_json_script, tree_state, turbotrain

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("child_processes")]

# merge imports numpy and the dataset reader only: as prepare-dataset's cases
# (test_prepare_safety.py), 2 GiB of address space and 256 MB of RSS leave room; the old
# merge peaked at 1.9 GB on a 120 MiB manifest of empty objects.
ADDRESS_SPACE = 2 << 30
PEAK_RSS = 256 << 20
FUZZ_SCRIPT = Path(__file__).with_name("fuzz_parts.py")
FUZZ_CASES = 300  # ~12 s on the 2-core box


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Path:
    """A --part 0/2 and 1/2 conversion of a small ImageFolder, not merged yet."""
    root = tmp_path_factory.mktemp("parts")
    source, out = root / "src", root / "out"
    write_shapes_imagefolder(source, train_per_class=3, val_per_class=1, size=(24, 24))
    with contextlib.redirect_stdout(io.StringIO()):
        for part in ("0/2", "1/2"):
            assert turbotrain_main(["prepare", str(source), str(out), "--shard-size", "8MiB",
                                    "--part", part, "--workers", "1"]) == 0
    return out


@pytest.fixture
def out(parts, tmp_path) -> Path:
    copy = tmp_path / "work" / "out"
    shutil.copytree(parts, copy)
    return copy


def _edit_manifests(out: Path, edit) -> None:
    for path in sorted((out / "parts").iterdir()):
        manifest = json.loads(path.read_text())
        edit(manifest)
        path.write_text(json.dumps(manifest))


def refused(out: Path, expect: str) -> str:
    work = out.parent
    before = tree_state(work)
    ran = run_confined(turbotrain("merge", out), address_space=ADDRESS_SPACE, timeout=60,
                       cwd=work)
    line = ran.error_line("turbotrain merge: error: ")
    assert expect in line, line
    assert ran.peak_rss < PEAK_RSS, f"peak RSS {ran.peak_rss >> 20} MB"
    assert changed(before, tree_state(work)) == []
    return line


def test_parts_that_is_a_symlink_is_refused_and_nothing_there_is_deleted(out):
    elsewhere = out.parent / "elsewhere"
    shutil.move(out / "parts", elsewhere)
    (elsewhere / ".part-00000-of-00002.json.0123456789abcdef.tmp").write_text("mine\n")
    (out / "parts").symlink_to(elsewhere)
    refused(out, f"{out / 'parts'} is a symlink (to {elsewhere}); merge reads and deletes only "
                 "inside OUT")


def test_a_shard_that_is_a_symlink_out_of_out_is_refused(out):
    shard = sorted(out.glob("train-*.beton"))[0]
    outside = out.parent / shard.name
    shutil.move(shard, outside)
    shard.symlink_to(outside)  # the very bytes the manifest hashed
    refused(out, f"{shard}: a symlink (to {outside}); merge accepts only regular files "
                 "inside OUT")


@pytest.mark.parametrize("field, value", [("encoding", {"encoding": 5, "max_side": "big"}),
                                          ("classes", [1, 2, 3])])
def test_manifests_that_would_make_an_invalid_dataset_json_are_refused_first(out, field,
                                                                             value):
    def edit(m):  # every part alike, so they still agree with each other
        if field == "encoding":
            m["agreement"]["encoding"] = value
        else:
            m["agreement"]["source"]["classes"] = value
    _edit_manifests(out, edit)
    refused(out, f"{out}: the part manifests describe a dataset that is not valid (")


def test_a_manifest_without_classes_is_one_line(out):
    _edit_manifests(out, lambda m: m["agreement"]["source"].pop("classes"))
    refused(out, "has no source (classes, kind, fingerprint, val_fraction and source_path)")


def test_pixel_sums_no_image_can_have_are_one_line(out):
    def edit(m):
        for entry in m["shards"]:
            entry["pixels"]["sums"] = [10**400] * 3  # OverflowError when divided into floats
    _edit_manifests(out, edit)
    refused(out, "has an invalid entry for shard")


def test_a_manifest_of_120_mib_is_not_read(out):
    manifest = sorted((out / "parts").iterdir())[0]
    with open(manifest, "wb") as f:
        f.write(b"[" + b"{}," * (40 << 20) + b"{}]")  # 120 MiB of empty objects
    refused(out, f"{manifest}: is 120 MiB, over the 16 MiB limit for one file")


def test_a_manifest_under_the_cap_under_little_memory_is_one_line(out):
    manifest = sorted((out / "parts").iterdir())[0]
    manifest.write_bytes(b"[" + b"{}," * (5 << 20) + b"{}]")  # 15 MiB: json.loads wants ~0.4 GB
    work = out.parent
    before = tree_state(work)
    # Just above what merge needs to start: the parse may fail for memory (MemoryError) or
    # get through and be refused as no manifest; either way, one line.
    ran = run_confined(turbotrain("merge", out), address_space=900 << 20, timeout=60, cwd=work)
    line = ran.error_line("turbotrain merge: error: ")
    assert line.startswith(f"turbotrain merge: error: {manifest}: "), line
    assert changed(before, tree_state(work)) == []


def test_part_manifests_and_the_shard_index_fuzz(tmp_path):
    result = run_json_script(FUZZ_SCRIPT, tmp_path / "work", FUZZ_CASES, 20261203,
                             address_space=ADDRESS_SPACE, timeout=150, peak_rss=512 << 20)
    assert result["cases"] == FUZZ_CASES
    assert result["problems"] == []
