"""What the shard cache made: the one record of which files in --cache-dir are its own.

The cache folder is shared (ranks, runs, sometimes users), so a name there proves nothing: a
user's `my-experiment.beton`, a shard left by an older turbotrain, or a symlink planted under a
name anyone can compute from dataset.json. The cache reads, counts and deletes only files this
journal lists (its entries, shard_cache.py), and only while the file is still the one it made:
a regular file with the inode and size recorded when the cache created it (O_EXCL under a fresh
random name, so it can never be something that was there before). Anything else is left alone.

A shard is read only while it is also unchanged since its download was checked: the cache
makes it read-only (0444) and records its ctime then, and any write, truncation, chmod, new
hard link or rename since moves the ctime, which no one but root can set back (utime moves it
too). A changed shard is deleted and downloaded again; the ctime's resolution (a kernel tick,
~4 ms) is the window left.

`.locks/journal.json`: {"version": 2, "files": {name: {"key", "bytes", "inode", "ctime_ns",
"complete"}}} (ctime_ns is 0 until the download is complete). A version-1 journal (no ctime) is
read for its files to be counted and evicted, never read as shards.
It is changed only under the cache's `cache.lock` (read, change, `safe_create.replacing`), and
read without it: a rename is atomic, so a reader sees the old or the new journal, never half.
A journal that is missing, damaged or not ours reads as empty: the files it listed are then
left alone too (`turbotrain cache --cache-dir DIR` lists them; docs/SECURITY.md).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from pathlib import Path

from turbotrain.files.safe_create import replacing
from turbotrain.files.untrusted import MIB, UnsafeInput, read_regular

JOURNAL = "journal.json"
VERSION = 2
READ_VERSIONS = (1, 2)  # version 1 had no ctime: its files are counted and evicted, not read
# ~120 bytes an entry: 100,000 shards (a 50 GB cache of 0.5 MB shards) are 12 MB.
MAX_JOURNAL_BYTES = 16 * MIB
# `<key>.<16 hex digits>.beton`: the key (cache_key's 40 hex digits; tests use short words) and
# create_unique's random part.
_NAME = re.compile(r"(?P<key>[0-9A-Za-z_-]{1,64})\.[0-9a-f]{16}\.beton")


@dataclasses.dataclass
class Made:
    """One file the cache created: a shard being downloaded (complete False) or a whole one,
    with its ctime when its download was checked (0: not yet, or not recorded)."""
    name: str
    key: str
    bytes: int
    inode: int
    complete: bool = False
    ctime_ns: int = 0


def key_is_valid(key: str) -> bool:
    return _NAME.fullmatch(f"{key}.{'0' * 16}.beton") is not None


class Journal:
    """The journal of the cache in `folder` (its `.locks/journal.json`)."""

    def __init__(self, folder: Path, locks: Path):
        self.folder = folder
        self.path = locks / JOURNAL
        self._cached: tuple[tuple, dict[str, Made]] | None = None

    def read(self) -> dict[str, Made]:
        """name -> Made, as last written (a copy the caller may change and `write`)."""
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return {}
        if not stat.S_ISREG(info.st_mode):  # a link or anything planted there: not ours
            return {}
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
        if self._cached is None or self._cached[0] != stamp:
            self._cached = stamp, self._parse()
        return {name: dataclasses.replace(made) for name, made in self._cached[1].items()}

    def _parse(self) -> dict[str, Made]:
        try:
            raw = json.loads(read_regular(self.path, MAX_JOURNAL_BYTES))
        except (OSError, UnsafeInput, ValueError, RecursionError, MemoryError):
            return {}
        files = raw.get("files") if isinstance(raw, dict) \
            and raw.get("version") in READ_VERSIONS else None
        if not isinstance(files, dict):
            return {}
        entries = {}
        for name, e in files.items():
            match = _NAME.fullmatch(name) if isinstance(name, str) else None
            if (match and isinstance(e, dict) and e.get("key") == match["key"]
                    and all(type(e.get(k)) is int and e[k] >= 0 for k in ("bytes", "inode"))
                    and type(e.get("complete")) is bool
                    and type(e.get("ctime_ns", 0)) is int and e.get("ctime_ns", 0) >= 0):
                entries[name] = Made(name, e["key"], e["bytes"], e["inode"], e["complete"],
                                     e.get("ctime_ns", 0))
        return entries

    def write(self, entries: dict[str, Made]) -> None:
        """Replaces the journal (the caller holds cache.lock)."""
        files = {name: {"key": m.key, "bytes": m.bytes, "inode": m.inode,
                        "ctime_ns": m.ctime_ns, "complete": m.complete}
                 for name, m in entries.items()}
        # Not fsynced: a journal lost to a power cut only leaves its files alone (an fsync a
        # download start and end would cost more than the cache saves on small shards).
        with replacing(self.path) as f:
            json.dump({"version": VERSION, "files": files}, f, separators=(",", ":"))
        self._cached = None

    def intact(self, made: Made) -> os.stat_result | None:
        """The file's lstat if it is still the one the cache made (a regular file, its inode
        and size); None if it is gone or was replaced by anything else."""
        try:
            info = os.lstat(self.folder / made.name)
        except OSError:
            return None
        if stat.S_ISREG(info.st_mode) and info.st_ino == made.inode \
                and info.st_size == made.bytes:
            return info
        return None

    @staticmethod
    def unchanged(made: Made, info: os.stat_result) -> bool:
        """Whether `info` (of the file `made` names, or of a descriptor opened on it) is that
        complete shard as its checked download left it: its inode, size and ctime."""
        return (made.complete and made.ctime_ns != 0 and stat.S_ISREG(info.st_mode)
                and info.st_ino == made.inode and info.st_size == made.bytes
                and info.st_ctime_ns == made.ctime_ns)
