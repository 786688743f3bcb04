"""`--cache-dir` is a shared folder: the shard cache reads, writes, counts and deletes only the
files it made (cache_journal.py), and never follows a link planted there. The first cases run
the real `train --data http://127.0.0.1:PORT/ds` in a confined child over a cache folder that
holds a user's own .beton, links planted under the names anyone can compute from dataset.json
(the old `<key>.beton` and `<key>.beton.part`), and a planted lock file; the last ones drive
ShardCache itself."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from turbotrain.datasets import DatasetError
from turbotrain.datasets.shard_cache import ShardCache, cache_key
from turbotrain.datasets.synthetic import write_random_raw_dataset

from .confined import changed, outside, tree_state
from .http_server import serve
from .model_child import run_cli
from .train_child import FAST

pytestmark = pytest.mark.timeout(240)

VICTIM_TEXT = "export PATH=/usr/bin\n"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_random_raw_dataset(tmp_path_factory.mktemp("cache") / "ds", shards=2,
                                    per_shard=20, val=8)


def _keys(dataset: Path, url: str) -> dict[str, str]:
    """file -> cache key of every object the train split and val read (cache_key(URL, sha))."""
    info = json.loads((dataset / "dataset.json").read_text())
    entries = [*info["splits"]["train"]["shards"], info["splits"]["val"]]
    return {e["file"]: cache_key(f"{url}/{e['file']}", e.get("sha256")) for e in entries}


def _train(server, work: Path, cache: Path, limit: int):
    return run_cli("train", "--data", server.url, "--out", work / "run", "--cache-dir", cache,
                   "--cache-limit", limit, "--epochs", 1, "--batch-size", 8, *FAST, cwd=work)


def test_planted_links_and_a_users_files_are_left_alone(dataset, tmp_path):
    work, cache = tmp_path / "work", tmp_path / "work" / "cache"
    cache.mkdir(parents=True)
    shard_bytes = max(p.stat().st_size for p in dataset.glob("*.beton"))
    limit = 3 * shard_bytes + 4096  # the three objects fit; with the user's file they do not
    mine = cache / "my-experiment.beton"
    mine.write_bytes(b"\1" * limit)  # a user's file, bigger than the whole cache limit
    os.utime(mine, (1, 1))           # and the least recently used of all
    victims = []
    with serve(dataset) as server:
        for name, key in _keys(dataset, server.url).items():
            for planted in (f"{key}.beton", f"{key}.beton.part"):
                victim = work / f"victim-{planted}"
                victim.write_text(VICTIM_TEXT)
                (cache / planted).symlink_to(victim)
                victims.append(victim)
        before = tree_state(work, skip=cache)
        ran = _train(server, work, cache, limit)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert all(v.read_text() == VICTIM_TEXT for v in victims)  # nothing written through
    assert mine.read_bytes() == b"\1" * limit                   # nothing of ours evicted
    assert all((cache / f"{key}.beton").is_symlink() for key in _keys(dataset, server.url).values())
    # Outside the cache only the run folder is new.
    assert not outside(changed(before, tree_state(work, skip=cache)), work / "run")


def test_a_lock_file_planted_as_a_link_is_refused_not_followed(dataset, tmp_path):
    work, cache = tmp_path / "work", tmp_path / "work" / "cache"
    (cache / ".locks").mkdir(parents=True)
    target = work / "created-through-the-link"
    with serve(dataset) as server:
        key = _keys(dataset, server.url)["train-00000-of-00002.beton"]
        (cache / ".locks" / f"{key}.use").symlink_to(target)  # O_CREAT would create it
        ran = _train(server, work, cache, 1 << 30)
    line = ran.error_line("train: error: ")
    assert f"{cache / '.locks' / key}.use: cannot use it as a lock file (a symlink)" in line
    assert not target.exists()


def _write(payload: bytes):
    def download(f) -> None:
        f.write(payload)
    return download


@pytest.mark.parametrize("replacement", ["a link", "another size"])
def test_a_cached_file_replaced_by_someone_else_is_neither_read_nor_deleted(tmp_path,
                                                                           replacement):
    victim = tmp_path / "victim"
    victim.write_bytes(b"v" * 1000)
    cache = ShardCache(tmp_path / "cache", 2500)
    first = cache.acquire("a", 1000, _write(b"a" * 1000), what="a")
    cache.release("a")
    first.unlink()
    if replacement == "a link":
        first.symlink_to(victim)  # the same name, and what it points to has the same size
    else:
        first.write_bytes(b"x" * 999)
    again = cache.acquire("a", 1000, _write(b"A" * 1000), what="a")
    assert again != first and again.read_bytes() == b"A" * 1000  # downloaded anew
    cache.release("a")
    for key in "bcd":  # room is made: the journal's own files go, the stranger's stays
        cache.acquire(key, 1000, _write(key.encode() * 1000), what=key)
        cache.release(key)
    assert os.path.lexists(first) and not again.exists()
    assert victim.read_bytes() == b"v" * 1000


def test_a_failed_download_removes_only_its_own_file(tmp_path):
    cache = ShardCache(tmp_path, 10_000)

    def broken(f) -> None:
        f.write(b"half")
        raise DatasetError("s3://b/x.beton: checksum mismatch")
    with pytest.raises(DatasetError, match="checksum mismatch"):
        cache.acquire("k", 1000, broken, what="k")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".locks"]


def test_locks_that_are_a_link_refuse_the_folder(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / ".locks").symlink_to(elsewhere)
    with pytest.raises(DatasetError, match=r"its \.locks is not a folder"):
        ShardCache(tmp_path / "cache", 10_000)
    assert list(elsewhere.iterdir()) == []
