"""`--cache-dir` is a shared folder: the shard cache reads, writes, counts and deletes only the
files it made (cache_journal.py), and never follows a link planted there. The first cases run
the real `train --data http://127.0.0.1:PORT/ds` in a confined child over a cache folder that
holds a user's own .beton, links planted under the names anyone can compute from dataset.json
(the old `<key>.beton` and `<key>.beton.part`), and a planted lock file; the last ones drive
ShardCache itself."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from turbotrain.datasets import DatasetError
from turbotrain.datasets.remote.shard_cache import ShardCache, cache_key
from turbotrain.datasets.synthetic import write_random_raw_dataset

from .confined import changed, outside, tree_state
from .http_server import serve
from .model_child import run_cli
from .train_child import FAST

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("child_processes")]

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


def _changed_in_place(path: Path, offset: int, data: bytes) -> None:
    """What someone allowed to write our file does: chmod it back, write, restore the times."""
    before = os.stat(path)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
    os.chmod(path, 0o444)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_a_checked_shard_is_read_only(tmp_path):
    cache = ShardCache(tmp_path, 10_000)
    path = cache.acquire("a", 1000, _write(b"a" * 1000), what="a")
    assert os.stat(path).st_mode & 0o777 == 0o444


def test_a_shard_changed_in_place_is_downloaded_again(tmp_path, capsys):
    cache = ShardCache(tmp_path / "cache", 10_000)
    first = cache.acquire("a", 1000, _write(b"a" * 1000), what="a")
    cache.release("a")
    inode = os.stat(first).st_ino
    _changed_in_place(first, 500, b"EVIL")  # same inode, size and mtime: only ctime moved
    assert (os.stat(first).st_ino, os.stat(first).st_size) == (inode, 1000)
    again = cache.acquire("a", 1000, _write(b"A" * 1000), what="a")
    assert again != first and again.read_bytes() == b"A" * 1000
    assert not os.path.lexists(first)  # it was the cache's own file: deleted, not left to count
    assert "changed since the cache downloaded and checked it" in capsys.readouterr().err
    assert sorted(cache.journal.read()) == [again.name]


def test_a_shard_changed_after_acquire_is_refused_when_opened(tmp_path):
    """Between acquire and the reader's open the name can be swapped or the file written:
    the reader checks what it opened (BetonFile.opened) against the journal."""
    cache = ShardCache(tmp_path, 10_000)
    path = cache.acquire("a", 1000, _write(b"a" * 1000), what="a")
    assert cache.unchanged(path, os.stat(path))
    _changed_in_place(path, 0, b"x")
    assert not cache.unchanged(path, os.stat(path))
    assert not cache.unchanged(tmp_path / "elsewhere" / path.name, os.stat(path))


def test_a_version_1_journals_files_are_evicted_but_never_read(tmp_path):
    cache = ShardCache(tmp_path, 2500)
    old = cache.acquire("a", 1000, _write(b"a" * 1000), what="a")
    cache.release("a")
    journal = cache.journal.path
    raw = json.loads(journal.read_text())
    for entry in raw["files"].values():
        del entry["ctime_ns"]
    journal.write_text(json.dumps({"version": 1, "files": raw["files"]}))
    again = cache.acquire("a", 1000, _write(b"A" * 1000), what="a")  # not served from `old`
    assert again != old and again.read_bytes() == b"A" * 1000 and not old.exists()
    cache.release("a")
    assert list(cache.journal.read()) == [again.name]


def test_a_remote_shard_changed_in_the_cache_is_downloaded_again(dataset, tmp_path):
    """The whole path: train reads shards over HTTP into the cache; one is then changed in
    place; the next run downloads it again and reads the right samples."""
    from turbotrain.datasets import open_dataset
    cache = tmp_path / "cache"
    with serve(dataset) as server:
        def whole_downloads() -> int:  # a shard's download asks for no range, or from 0 on
            return sum(1 for method, _, asked in server.requests
                       if method == "GET" and asked in (None, "bytes=0-"))
        split = open_dataset(server.url, "train", cache_dir=cache, cache_limit="1GB")
        expected = [bytes(split.read(i)[0]) for i in range(len(split))]
        del split
        first = whole_downloads()
        shard = sorted(cache.glob("*.beton"))[0]
        _changed_in_place(shard, shard.stat().st_size - 64, b"\xff" * 64)  # sample bytes
        split = open_dataset(server.url, "train", cache_dir=cache, cache_limit="1GB")
        assert [bytes(split.read(i)[0]) for i in range(len(split))] == expected
        assert whole_downloads() == first + 1  # that shard again, and only that one
    assert not shard.exists()


def _cache_command(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "turbotrain", "cache", *map(str, args)],
                          capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])


def test_the_cache_command_reports_and_clears_only_the_caches_own_files(tmp_path):
    """`turbotrain cache` reclaims what the cache made (not held by a run) and only names the
    rest: a user's file, an older turbotrain's shard, a file whose record was lost."""
    folder = tmp_path / "cache"
    cache = ShardCache(folder, 10_000)
    for key in "ab":
        cache.acquire(key, 1000, _write(key.encode() * 1000), what=key)
    cache.release("a")  # b stays held by this process, as by a running train
    mine = folder / "my-experiment.beton"
    mine.write_bytes(b"mine")
    (folder / f"{cache_key('s3://b/old', None)}.beton").write_bytes(b"old")
    shown = _cache_command("--cache-dir", folder, "--cache-limit", "10kB")
    assert shown.returncode == 0, shown.stderr
    assert "2 file(s) of the cache, 0.0 MiB of its 0.0 MiB limit; 1 held by a running " \
           "process" in shown.stdout
    assert "2 other name(s)" in shown.stdout and "  my-experiment.beton" in shown.stdout
    cleared = _cache_command("--cache-dir", folder, "--clear")
    assert cleared.returncode == 0, cleared.stderr
    assert cleared.stdout.startswith("deleted 1 file(s) of the cache")
    assert "1 file(s) of the cache" in cleared.stdout and "1 held" in cleared.stdout
    left = sorted(p.name for p in folder.iterdir() if p.name != ".locks")
    assert len(left) == 3 and mine.read_bytes() == b"mine"
    assert [m.key for m in cache.journal.read().values()] == ["b"]
    cache.release("b")
    assert _cache_command("--cache-dir", folder, "--clear").stdout.startswith(
        "deleted 1 file(s)")
    for nowhere in (tmp_path / "nowhere", tmp_path / "a-folder-of-mine"):
        if nowhere.name == "a-folder-of-mine":
            nowhere.mkdir()
        assert _cache_command("--cache-dir", nowhere).stdout.endswith(
            "no shard cache there (nothing was downloaded into it)\n")
    assert not (tmp_path / "nowhere").exists()
    assert list((tmp_path / "a-folder-of-mine").iterdir()) == []  # no .locks made there
