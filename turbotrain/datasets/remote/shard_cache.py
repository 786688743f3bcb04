"""A folder of downloaded shards, bounded in size, shared by every process that reads them.

`ShardCache(cache_dir, limit_bytes)` keeps entries under `cache_dir`: an entry is one shard's
whole file as downloaded, named by its key (a hash of the shard's URL and its SHA-256, so a
dataset that changes never serves stale bytes) plus a random part: `<key>.<16 hex
digits>.beton`. The cache's unit is the entry; what it holds is always a whole shard.

* the cache reads, counts and deletes only the entries it made, as its journal records them
  (cache_journal.py): a user's own `.beton`, an older turbotrain's shards or a symlink planted
  under a computable name are never opened, written, counted or deleted. A download is a new
  file (`safe_create.create_unique`: O_EXCL | O_NOFOLLOW under a fresh name), sized to the
  whole shard up front (so the folder's total counts it from its first byte), recorded as
  incomplete, written through the descriptor, checked by its caller, made read-only, then
  recorded as complete with its ctime: a killed download never leaves an entry the cache would
  read, and an entry changed in place since (its ctime moved) is deleted and downloaded again;
* the total of its entries stays <= limit_bytes: before a download, the least-recently-used
  entries (the mtime of their `.use` lock, touched on every use: touching the entry would move
  its ctime) that no process holds are deleted. A shard larger than the limit is one clear
  error naming --cache-limit;
* processes (ranks, DataLoader workers) share the folder through `fcntl.flock` locks in
  `.locks/`: `<key>.dl` (exclusive while one process downloads; a second waits for it, then
  finds the entry), `<key>.use` (shared while a process holds the entry: opened, or prefetched
  for the next reads; eviction takes it exclusive, non-blocking, so it skips a held entry) and
  `cache.lock` (one process at a time changes the journal, counts and evicts);
* a process lets go of the entries it holds only when a read needs the room (a prefetch never
  does), least recently touched first, never those `protect`ed (the next shards of its order):
  reading a shard again costs a reopen, not a download, while its entry stays.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from turbotrain.datasets.errors import DatasetError
from turbotrain.files.safe_create import create_unique, real_folder
from turbotrain.printable import printable

from .cache_journal import Journal, Made, key_is_valid
from .cache_locks import flock, is_held, open_lock

SHARD_SUFFIX = ".beton"
LOCKS = ".locks"
# How long a download waits for other processes to let go of shards when the cache is full
# before it says the limit is too small (they let go as they move on to their next shards).
WAIT_FOR_ROOM_S = 120.0
_POLL_S = 0.2

def shown_size(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.1f} MiB" if nbytes < 2**30 else f"{nbytes / 2**30:,.2f} GiB"


def cache_key(url: str, sha256: str | None) -> str:
    """The file name stem of a shard: its URL and content hash, so nothing else matches it."""
    return hashlib.sha256(f"{url}\n{sha256 or ''}".encode()).hexdigest()[:40]


class _Held:
    """A shard this process holds: the descriptor of its shared `.use` lock, and what to call
    to let go of it (its split drops the opened file)."""

    def __init__(self, fd: int, on_release: Callable[[], None] | None):
        self.fd, self.on_release, self.touched = fd, on_release, time.monotonic()


class ShardCache:
    """See the module docstring. Thread-safe; one instance per process and folder (`shared`)."""

    def __init__(self, cache_dir: str | os.PathLike, limit_bytes: int):
        self.dir = Path(cache_dir).expanduser()
        self.limit = int(limit_bytes)
        locks = self.dir / LOCKS
        try:
            is_folder = real_folder(locks, parents=True)
        except OSError as e:
            raise DatasetError(f"--cache-dir {printable(self.dir)}: cannot create it "
                               f"({e.strerror or e}); pass another --cache-dir") from None
        if not is_folder:  # a symlink: every lock and the journal would live elsewhere
            raise DatasetError(f"--cache-dir {printable(self.dir)}: its {LOCKS} is not a folder "
                               f"(a symlink?); remove it, or pass another --cache-dir")
        self.journal = Journal(self.dir, locks)
        self._reset()
        _INSTANCES.add(self)

    def _reset(self) -> None:
        self._lock = threading.RLock()
        self._held: dict[str, _Held] = {}
        self._protected: dict[object, set[str]] = {}  # by owner (a split's reader)
        self._downloading: set[str] = set()

    def _after_fork(self) -> None:
        """In a forked child (a DataLoader worker): the parent's holds stay the parent's. Our
        copies of its lock descriptors close (the parent's keep the locks), and the locks,
        which another thread may have held at the fork, are new."""
        for held in self._held.values():
            with contextlib.suppress(OSError):
                os.close(held.fd)
        self._reset()

    # -- the one public path: a complete shard file, held ------------------------------------
    def acquire(self, key: str, nbytes: int, download: Callable[[BinaryIO], None], *, what: str,
                on_release: Callable[[], None] | None = None, wait: bool = True) -> Path | None:
        """The path of shard `key` (nbytes long), downloaded first if missing, and held by this
        process until `release(key)` (or until it needs the room). `download(f)` writes the
        shard into f (a new file of nbytes, open for reading and writing, at offset 0) and
        checks it; DatasetError from it propagates. With wait=False (a prefetch) it returns
        None instead of waiting for room."""
        if not key_is_valid(key):
            raise ValueError(f"not a cache key: {key!r}")
        if nbytes > self.limit:
            raise DatasetError(f"{what} is {shown_size(nbytes)}, more than the whole shard "
                               f"cache ({shown_size(self.limit)}): raise --cache-limit to at "
                               f"least {shown_size(2 * nbytes)}")
        # A failed call lets go only of a hold it made: a prefetch that finds no room must not
        # drop the hold of a read in another thread.
        made = self._hold(key, on_release)
        try:
            path = self._present(key, nbytes)
            if path is None:
                with flock(self._lock_path(key, "dl"), fcntl.LOCK_EX):
                    # Another process may have downloaded it while we waited for its lock.
                    path = self._present(key, nbytes)
                    if path is None:
                        path = self._download(key, nbytes, download, what, wait)
                        if path is None:
                            if made:
                                self.release(key)
                            return None
            self._touch(key)
            return path
        except BaseException:
            if made:
                self.release(key)
            raise

    def release(self, key: str) -> None:
        """Lets go of shard `key`: other processes may now evict it."""
        with self._lock:
            held = self._held.pop(key, None)
        if held is not None:
            os.close(held.fd)

    def protect(self, owner: object, keys) -> None:
        """The shards `owner` (a split) reads next: never evicted or let go of to make room."""
        with self._lock:
            self._protected[owner] = set(keys)

    def _is_protected(self, key: str) -> bool:
        with self._lock:
            return any(key in keys for keys in self._protected.values())

    def holds(self, key: str) -> bool:
        with self._lock:
            return key in self._held

    def unchanged(self, path: Path, info: os.stat_result) -> bool:
        """Whether info (an fstat of the file a reader opened at `path`, which acquire gave)
        is that shard as its checked download left it: a name swapped or a file changed
        between acquire and the open is caught here."""
        made = self.journal.read().get(Path(path).name)
        return made is not None and Path(path).parent == self.dir and Journal.unchanged(made, info)

    # -- what `turbotrain cache` shows and clears ---------------------------------------------
    def contents(self) -> tuple[list[tuple[Made, bool]], list[Path]]:
        """(the cache's own files, each with whether a process holds it now; every other name
        in the folder: never read, counted or deleted by the cache)."""
        ours = [(made, is_held(self._lock_path(made.key, "use" if made.complete else "dl")))
                for made in self.journal.read().values() if self.journal.intact(made)]
        names = {made.name for made, _ in ours} | {LOCKS}
        return ours, sorted(p for p in self.dir.iterdir() if p.name not in names)

    def clear(self) -> tuple[int, int]:
        """Deletes every file of the cache's that no process holds: (files, bytes) deleted."""
        with flock(self.dir / LOCKS / "cache.lock", fcntl.LOCK_EX):
            entries = self.journal.read()
            deleted = [made for made, _ in self._entries(entries) if self._evict(made)]
            for made in deleted:
                del entries[made.name]
            self.journal.write(entries)
        return len(deleted), sum(made.bytes for made in deleted)

    # -- internals ----------------------------------------------------------------------------
    def _lock_path(self, key: str, kind: str) -> Path:
        return self.dir / LOCKS / f"{key}.{kind}"

    def _present(self, key: str, nbytes: int) -> Path | None:
        """A complete shard `key` of nbytes that the cache made, still as it was checked."""
        for made in self.journal.read().values():
            if made.key == key and made.bytes == nbytes:
                info = self.journal.intact(made)
                if info is not None and Journal.unchanged(made, info):
                    return self.dir / made.name
        return None

    def _touch(self, key: str) -> None:
        """Marks shard key used now: the mtime of its `.use` lock (least recently used =
        oldest), set through the descriptor we hold, so never through a link."""
        with self._lock:
            held = self._held.get(key)
        if held is not None:
            with contextlib.suppress(OSError):
                os.utime(held.fd)

    def _last_use(self, key: str) -> float:
        try:
            return os.lstat(self._lock_path(key, "use")).st_mtime
        except OSError:
            return 0.0

    def _hold(self, key: str, on_release: Callable[[], None] | None) -> bool:
        """Holds shard key (a shared `.use` lock); False if this process already held it."""
        with self._lock:
            held = self._held.get(key)
            if held is not None:
                held.touched = time.monotonic()
                held.on_release = on_release or held.on_release
                return False
        fd = open_lock(self._lock_path(key, "use"))
        # Blocks only while another process evicts this shard (a moment): then we download it.
        fcntl.flock(fd, fcntl.LOCK_SH)
        with self._lock:
            if key in self._held:  # another thread got there first
                os.close(fd)
                self._held[key].touched = time.monotonic()
                return False
            self._held[key] = _Held(fd, on_release)
            return True

    def _download(self, key: str, nbytes: int, download: Callable[[BinaryIO], None],
                  what: str, wait: bool) -> Path | None:
        """Makes room, creates and records a new file, lets `download` fill it, records it
        complete. None when there is no room and wait is False."""
        deadline = time.monotonic() + WAIT_FOR_ROOM_S
        while True:
            with flock(self.dir / LOCKS / "cache.lock", fcntl.LOCK_EX):
                entries = self.journal.read()
                known = set(entries)
                self._remove_unusable(key, entries)
                # A prefetch only takes room nobody holds: letting go of this process's shards
                # could drop one its reader is still in (a window of the quasi-random order).
                room = self._make_room(entries, nbytes, exclude=key, may_let_go=wait)
                made, fd = self._create(key, nbytes, entries) if room else (None, -1)
                try:
                    if set(entries) != known:
                        self.journal.write(entries)
                except BaseException:
                    if made is not None:
                        os.close(fd)
                        (self.dir / made.name).unlink(missing_ok=True)
                    raise
                if room:
                    break
            if not wait:
                return None
            if time.monotonic() > deadline:
                raise DatasetError(
                    f"{what}: the shard cache {printable(self.dir)} ({shown_size(self.limit)}) "
                    f"is full of shards that readers hold; raise --cache-limit (each reading "
                    f"process holds its order's window of shards plus the prefetched ones)")
            time.sleep(_POLL_S)
        with self._lock:
            self._downloading.add(key)
        try:
            with os.fdopen(fd, "r+b") as f:
                download(f)
                f.flush()
                os.fchmod(f.fileno(), 0o444)  # nobody writes a checked shard, by mistake either
                checked = os.fstat(f.fileno()).st_ctime_ns
            self._change(made.name, complete=True, ctime_ns=checked)
        except BaseException:
            if self.journal.intact(made):
                with contextlib.suppress(OSError):
                    os.unlink(self.dir / made.name)
            self._change(made.name, complete=None)
            raise
        finally:
            with self._lock:
                self._downloading.discard(key)
        return self.dir / made.name

    def _remove_unusable(self, key: str, entries: dict[str, Made]) -> None:
        """Files of shard key that cannot be read (we hold its `.dl` lock, so an incomplete one
        is the part of a download that was killed; a complete one was changed since it was
        checked, or predates the ctime record): removed while still the cache's own, and
        forgotten."""
        for name, made in list(entries.items()):
            if made.key != key:
                continue
            info = self.journal.intact(made)
            if info is not None and Journal.unchanged(made, info):
                continue
            if info is not None:
                if made.complete and made.ctime_ns:
                    print(f"turbotrain: {printable(self.dir / name)} changed since the cache "
                          f"downloaded and checked it; deleting it and downloading it again "
                          f"(does someone else write into --cache-dir?)", file=sys.stderr)
                with contextlib.suppress(OSError):
                    os.unlink(self.dir / name)
            del entries[name]

    def _create(self, key: str, nbytes: int, entries: dict[str, Made]) -> tuple[Made, int]:
        """A new file for shard key, sized (inside cache.lock: every other process now counts
        it) and added to entries as incomplete."""
        try:
            fd, path = create_unique(self.dir, f"{key}.", SHARD_SUFFIX, 0o644, readable=True)
        except OSError as e:
            raise DatasetError(f"--cache-dir {printable(self.dir)}: cannot create a shard file "
                               f"({e.strerror or e}); pass another --cache-dir") from None
        try:
            os.ftruncate(fd, nbytes)
            made = Made(path.name, key, nbytes, os.fstat(fd).st_ino)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        entries[made.name] = made
        return made, fd

    def _change(self, name: str, complete: bool | None, ctime_ns: int = 0) -> None:
        """Records file `name` as complete (with its ctime once checked), or (None) forgets
        it."""
        with flock(self.dir / LOCKS / "cache.lock", fcntl.LOCK_EX):
            entries = self.journal.read()
            if complete is None:
                entries.pop(name, None)
            elif name in entries:
                entries[name].complete, entries[name].ctime_ns = complete, ctime_ns
            self.journal.write(entries)

    def _entries(self, entries: dict[str, Made]) -> list[tuple[Made, float]]:
        """(file, last use) of every file the journal lists that is still the cache's own; the
        entries of files removed or replaced by someone else are dropped (nothing is deleted:
        what is there now is not ours)."""
        found = []
        for name, made in list(entries.items()):
            info = self.journal.intact(made)
            if info is None:
                del entries[name]
            else:
                found.append((made, self._last_use(made.key)))
        return found

    def _make_room(self, entries: dict[str, Made], nbytes: int, exclude: str,
                   may_let_go: bool) -> bool:
        """Under cache.lock: deletes parts of killed downloads and least-recently-used shards
        nobody holds until nbytes more fit (entries is updated); if may_let_go, lets go of this
        process's unprotected shards when that is not enough. False when it still does not
        fit."""
        for attempt in range(2):
            found = self._entries(entries)
            total = sum(made.bytes for made, _ in found)
            for made, _ in sorted(found, key=lambda e: e[1]):
                if total + nbytes <= self.limit:
                    return True
                if made.key != exclude and not self._is_protected(made.key) \
                        and self._evict(made):
                    del entries[made.name]
                    total -= made.bytes
            if total + nbytes <= self.limit:
                return True
            if attempt == 0 and not (may_let_go and self._let_go_of_some(exclude)):
                return False
        return False

    def _evict(self, made: Made) -> bool:
        """Deletes a shard (or the part of a killed download) that no process holds."""
        fd = open_lock(self._lock_path(made.key, "use" if made.complete else "dl"))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False  # held, or being downloaded
        try:
            if self.journal.intact(made):  # still ours, now that nobody can hold it
                os.unlink(self.dir / made.name)
            return True
        finally:
            os.close(fd)

    def _let_go_of_some(self, exclude: str) -> bool:
        """Releases every shard this process holds that is not protected nor being downloaded
        (their splits drop the opened files; a later read reopens or downloads). False if
        there was none."""
        with self._lock:
            busy = self._downloading | {exclude}
            victims = [(key, held) for key, held in self._held.items()
                       if key not in busy and not self._is_protected(key)]
        for key, held in sorted(victims, key=lambda kv: kv[1].touched):
            if held.on_release is not None:
                held.on_release()
            self.release(key)
        return bool(victims)


_INSTANCES: "weakref.WeakSet[ShardCache]" = weakref.WeakSet()
_SHARED: dict[tuple[str, int], ShardCache] = {}
_SHARED_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    global _SHARED_LOCK
    _SHARED_LOCK = threading.Lock()
    for cache in list(_INSTANCES):
        cache._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def shared(cache_dir: str | os.PathLike, limit_bytes: int) -> ShardCache:
    """This process's one ShardCache for a folder and limit (splits and workers share it, so
    their holds and protections are seen together)."""
    key = (os.path.realpath(Path(cache_dir).expanduser()), int(limit_bytes))
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = ShardCache(cache_dir, limit_bytes)
        return _SHARED[key]
