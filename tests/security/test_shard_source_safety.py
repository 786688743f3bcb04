"""`prepare-dataset` on WebDataset shards and Hugging Face files nobody vouches for, through the
real CLI in a confined child (test_prepare_safety.py's `refused`): one line naming the file,
no hang, memory under the cap, nothing changed outside OUT. Each case fails without its check:
the line names what that check says."""
from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from .test_prepare_safety import prepare, refused, write_tar_gz_bomb
from tests.datasets.shard_fixtures import hf_dataset, jpeg

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("child_processes")]


def shard(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]],
          mode: str = "w") -> Path:
    """A tar of (name, data) members, or of TarInfos written as they are (headers only)."""
    with tarfile.open(path, mode) as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                tar.addfile(info, io.BytesIO(member[1]))
    return path


def test_symlink_member_is_refused(tmp_path):
    link = tarfile.TarInfo("b.jpg")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    src = shard(tmp_path / "train-0.tar", [("a.jpg", jpeg(0)), ("a.cls", b"0"), link])
    line = refused(tmp_path, src, tmp_path / "ds", expect="member 'b.jpg' is a symbolic link")
    assert "train-0.tar" in line


def test_member_declaring_more_than_the_file_holds(tmp_path):
    """A header saying 100 GB, and no data: without the check tarfile lists it, and a worker
    would ask pread for 100 GB."""
    huge = tarfile.TarInfo("b.jpg")
    huge.size = 100 << 30
    src = shard(tmp_path / "train-0.tar", [("a.jpg", jpeg(0)), ("a.cls", b"0"), huge])
    refused(tmp_path, src, tmp_path / "ds", expect="past the file's end")


def test_member_over_the_file_cap(tmp_path):
    src = shard(tmp_path / "train-0.tar", [("a.jpg", bytes(3 << 20)), ("a.cls", b"0")])
    refused(tmp_path, src, tmp_path / "ds", "--max-file-mb", "2",
            expect="over the 2 MiB limit for one image")


def test_tar_gz_bomb(tmp_path):
    """300 MB of zeros as one image member, 0.3 MB gzipped: refused from its header."""
    path = write_tar_gz_bomb(tmp_path / "train-0.tar.gz", "a.jpg")
    refused(tmp_path, path, tmp_path / "ds", expect="a decompression bomb?")


def test_label_that_is_not_an_integer(tmp_path):
    src = shard(tmp_path / "train-0.tar", [("a.jpg", jpeg(0)), ("a.cls", b"cat")])
    refused(tmp_path, src, tmp_path / "ds", expect="label 'cat' is not an integer")


@pytest.mark.parametrize("label, expect", [
    (b"[" * 50_000 + b"]" * 50_000, "over the 64 KiB a label may be"),
    (b"[" * 30_000 + b"]" * 30_000, "the JSON is nested too deeply"),
    (b"[1, 2]", "expected a JSON object"),
    (b"{\"label\": " + b"9" * 5000 + b"}", "not a readable label"),
    (b"{\"label\": true}", "expected an integer or a class name"),
])
def test_json_labels_that_are_not_labels(tmp_path, label, expect):
    src = shard(tmp_path / "train-0.tar", [("a.jpg", jpeg(0)), ("a.json", label)])
    refused(tmp_path, src, tmp_path / "ds", expect=expect)


def test_fifo_shard_is_refused_not_waited_on(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    shard(folder / "train-0.tar", [("a.jpg", jpeg(0)), ("a.cls", b"0")])
    os.mkfifo(folder / "train-1.tar")
    line = refused(tmp_path, folder, tmp_path / "ds", expect="is a named pipe")
    assert "train-1.tar" in line
    refused(tmp_path, folder / "train-1.tar", tmp_path / "ds", expect="neither a regular file")


def test_symlinked_shard_outside_the_folder(tmp_path):
    outside = shard(tmp_path / "elsewhere.tar", [("a.jpg", jpeg(0)), ("a.cls", b"0")])
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "train-0.tar").symlink_to(outside)
    refused(tmp_path, folder, tmp_path / "ds", expect="outside the source folder")
    assert prepare(tmp_path, folder, tmp_path / "ds", "--allow-outside-root").returncode == 0


def test_damaged_header_is_not_the_end_of_the_shard(tmp_path):
    """tarfile stops quietly at a header it cannot parse: the rest of the shard would be lost
    without a word."""
    src = shard(tmp_path / "train-0.tar", [("a.jpg", jpeg(0)), ("a.cls", b"0"),
                                           ("b.jpg", jpeg(1)), ("b.cls", b"1")])
    data = bytearray(src.read_bytes())
    second = 512 + (len(jpeg(0)) + 511) // 512 * 512 + 1024  # a.jpg, a.cls: the header of b.jpg
    data[second + 148:second + 156] = b"garbage!"  # its checksum
    src.write_bytes(bytes(data))
    refused(tmp_path, src, tmp_path / "ds", expect="damaged tar header at offset")


def test_truncated_parquet(tmp_path):
    path = tmp_path / "train.parquet"
    hf_dataset().to_parquet(str(path))
    path.write_bytes(path.read_bytes()[:-100])
    refused(tmp_path, path, tmp_path / "ds", expect="is not a readable parquet file")


def test_parquet_row_group_over_the_cap(tmp_path):
    from datasets import Dataset, Features, Image, Value
    path = tmp_path / "train.parquet"
    big = {"bytes": os.urandom(3 << 20), "path": None}  # random: it does not compress
    Dataset.from_dict({"image": [big], "label": [0]},
                      features=Features({"image": Image(), "label": Value("int64")})
                      ).to_parquet(str(path))
    refused(tmp_path, path, tmp_path / "ds", "--max-file-mb", "2",
            expect="row group 0 is 3 MiB decoded, over the 2 MiB")


def test_state_json_naming_a_file_outside(tmp_path):
    folder = tmp_path / "hf"
    hf_dataset().save_to_disk(str(folder))
    state = json.loads((folder / "state.json").read_text())
    state["_data_files"] = [{"filename": "../../secret.arrow"}]
    (folder / "state.json").write_text(json.dumps(state))
    refused(tmp_path, folder, tmp_path / "ds", expect="not a bare name")
