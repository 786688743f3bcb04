"""A folder of downloaded shards, bounded in size, shared by every process that reads them.

`ShardCache(cache_dir, limit_bytes)` keeps whole shard files under `cache_dir`, each named by a
hash of its URL and its SHA-256 (a dataset that changes never serves stale bytes):

* a download is written to `<key>.beton.part`, sized to the whole shard up front (so the
  folder's total counts it from its first byte), checked by its caller, then renamed: a killed
  download never leaves a file under the final name;
* the total of `.beton` and `.beton.part` files stays <= limit_bytes: before a download, the
  least-recently-used shards (file mtime, touched on every use) that no process holds are
  deleted. A shard larger than the limit is one clear error naming --cache-limit;
* processes (ranks, DataLoader workers) share the folder through `fcntl.flock` locks in
  `.locks/`: `<key>.dl` (exclusive while one process downloads; a second waits for it, then
  finds the file), `<key>.use` (shared while a process holds the shard: opened, or prefetched
  for the next reads; eviction takes it exclusive, non-blocking, so it skips a held shard) and
  `cache.lock` (one process at a time counts and evicts);
* a process lets go of the shards it holds only when a read needs the room (a prefetch never
  does), least recently touched first, never those `protect`ed (the next shards of its order):
  reading a shard again costs a reopen, not a download, while it fits.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from turbotrain.printable import printable

from .reader import DatasetError

SHARD_SUFFIX = ".beton"
PART_SUFFIX = ".beton.part"
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


@contextlib.contextmanager
def _flock(path: Path, mode: int):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        os.close(fd)  # closing the descriptor drops its lock


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
        try:
            (self.dir / LOCKS).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DatasetError(f"--cache-dir {printable(self.dir)}: cannot create it "
                               f"({e.strerror or e}); pass another --cache-dir") from None
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
    def acquire(self, key: str, nbytes: int, download: Callable[[Path], None], *, what: str,
                on_release: Callable[[], None] | None = None, wait: bool = True) -> Path | None:
        """The path of shard `key` (nbytes long), downloaded first if missing, and held by this
        process until `release(key)` (or until it needs the room). `download(part)` writes the
        shard into the existing file `part` and checks it; DatasetError from it propagates.
        With wait=False (a prefetch) it returns None instead of waiting for room."""
        path = self.dir / (key + SHARD_SUFFIX)
        if nbytes > self.limit:
            raise DatasetError(f"{what} is {shown_size(nbytes)}, more than the whole shard "
                               f"cache ({shown_size(self.limit)}): raise --cache-limit to at "
                               f"least {shown_size(2 * nbytes)}")
        # A failed call lets go only of a hold it made: a prefetch that finds no room must not
        # drop the hold of a read in another thread.
        made = self._hold(key, on_release)
        try:
            if not self._present(path, nbytes):
                with _flock(self._lock_path(key, "dl"), fcntl.LOCK_EX):
                    # Another process may have downloaded it while we waited for its lock.
                    if not self._present(path, nbytes):
                        if not self._download(key, nbytes, download, what, wait):
                            if made:
                                self.release(key)
                            return None
            with contextlib.suppress(OSError):
                os.utime(path)  # least recently used = oldest mtime
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

    # -- internals ----------------------------------------------------------------------------
    def _lock_path(self, key: str, kind: str) -> Path:
        return self.dir / LOCKS / f"{key}.{kind}"

    def _present(self, path: Path, nbytes: int) -> bool:
        try:
            return path.stat().st_size == nbytes
        except OSError:
            return False

    def _hold(self, key: str, on_release: Callable[[], None] | None) -> bool:
        """Holds shard key (a shared `.use` lock); False if this process already held it."""
        with self._lock:
            held = self._held.get(key)
            if held is not None:
                held.touched = time.monotonic()
                held.on_release = on_release or held.on_release
                return False
        fd = os.open(self._lock_path(key, "use"),
                     os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        # Blocks only while another process evicts this shard (a moment): then we download it.
        fcntl.flock(fd, fcntl.LOCK_SH)
        with self._lock:
            if key in self._held:  # another thread got there first
                os.close(fd)
                self._held[key].touched = time.monotonic()
                return False
            self._held[key] = _Held(fd, on_release)
            return True

    def _download(self, key: str, nbytes: int, download: Callable[[Path], None], what: str,
                  wait: bool) -> bool:
        """Makes room, writes `<key>.beton.part` through `download`, renames it. False when
        there is no room and wait is False."""
        part = self.dir / (key + PART_SUFFIX)
        deadline = time.monotonic() + WAIT_FOR_ROOM_S
        while True:
            with _flock(self.dir / LOCKS / "cache.lock", fcntl.LOCK_EX):
                # A prefetch only takes room nobody holds: letting go of this process's shards
                # could drop one its reader is still in (a window of the quasi-random order).
                if self._make_room(nbytes, exclude=key, may_let_go=wait):
                    # Sized up front, inside the lock: every other process now counts it.
                    with open(part, "wb") as f:
                        f.truncate(nbytes)
                    break
            if not wait:
                return False
            if time.monotonic() > deadline:
                raise DatasetError(
                    f"{what}: the shard cache {printable(self.dir)} ({shown_size(self.limit)}) "
                    f"is full of shards that readers hold; raise --cache-limit (each reading "
                    f"process holds its order's window of shards plus the prefetched ones)")
            time.sleep(_POLL_S)
        with self._lock:
            self._downloading.add(key)
        try:
            download(part)
            os.replace(part, self.dir / (key + SHARD_SUFFIX))
        except BaseException:
            with contextlib.suppress(OSError):
                part.unlink()
            raise
        finally:
            with self._lock:
                self._downloading.discard(key)
        return True

    def _entries(self) -> list[tuple[Path, int, float]]:
        """(path, size, mtime) of every shard and part file in the folder."""
        entries = []
        with os.scandir(self.dir) as it:
            for entry in it:
                if entry.name.endswith((SHARD_SUFFIX, PART_SUFFIX)):
                    with contextlib.suppress(FileNotFoundError):
                        info = entry.stat(follow_symlinks=False)
                        entries.append((Path(entry.path), info.st_size, info.st_mtime))
        return entries

    def _make_room(self, nbytes: int, exclude: str, may_let_go: bool) -> bool:
        """Under cache.lock: deletes leftover parts and least-recently-used shards nobody holds
        until nbytes more fit; if may_let_go, lets go of this process's unprotected shards when
        that is not enough. False when it still does not fit."""
        for attempt in range(2):
            entries = self._entries()
            total = sum(size for _, size, _ in entries)
            for path, size, _ in sorted(entries, key=lambda e: e[2]):
                if total + nbytes <= self.limit:
                    return True
                key = path.name.split(".", 1)[0]
                if key != exclude and not self._is_protected(key) and self._evict(path, key):
                    total -= size
            if total + nbytes <= self.limit:
                return True
            if attempt == 0 and not (may_let_go and self._let_go_of_some(exclude)):
                return False
        return False

    def _evict(self, path: Path, key: str) -> bool:
        """Deletes a shard (or a part left by a killed download) that no process holds."""
        kind = "dl" if path.name.endswith(PART_SUFFIX) else "use"
        fd = os.open(self._lock_path(key, kind), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False  # held, or being downloaded
        try:
            path.unlink(missing_ok=True)
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
