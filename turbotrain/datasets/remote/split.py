"""A prepared dataset in object storage: `open_dataset("s3://bucket/prefix", split)`.

The URL holds what `prepare-dataset` wrote (uploaded with any tool: `aws s3 sync OUT URL`).
Opening a split reads `dataset.json` (the 16 MiB cap and the schema of a local one) and, per
shard, only three small range reads: the header with the field descriptors, the metadata table
and the allocation table (docs/FORMAT.md). They are laid into a sparse scratch file at their
offsets, so `BetonFile` checks them with exactly the code that checks a local file, and no
sample byte is downloaded at open time: a rank downloads only the shards it reads.

A shard is downloaded whole into the `ShardCache` (shard_cache.py) the first time it is read,
checked against its size and SHA-256 from the index, and opened from there; its metadata must
equal what the range reads gave. `split.will_read(shards)` (the order's sequence for this rank)
makes `RemoteShards` prefetch the next PREFETCH shards in the background and keep them from
eviction.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import os
import queue
import tempfile
import threading
import weakref
from pathlib import Path

import numpy as np

from turbotrain.datasets.beton import layout
from turbotrain.datasets.beton.dataset_json import DATASET_JSON, MAX_JSON_BYTES, parse_dataset_json
from turbotrain.datasets.beton.reader import BetonFile
from turbotrain.datasets.beton.shards import ShardMetadata
from turbotrain.datasets.beton.split import PreparedSplit
from turbotrain.datasets.errors import DatasetError
from turbotrain.files.safe_create import create_new
from turbotrain.printable import printable
from turbotrain.sizes import SizeError, parse_size

from . import shard_cache
from .object_store import Store
from .urls import join, shown_url

__all__ = ["DEFAULT_CACHE_LIMIT", "RemoteShard", "default_cache_dir", "open_remote_dataset",
           "read_remote_dataset_json"]

DEFAULT_CACHE_LIMIT = "50GB"
PREFETCH = 2          # shards downloaded ahead of the reader, at most this many at once
METADATA_THREADS = 8  # range reads of many shards' tables in parallel when a split opens
# The first range read: the header plus up to 61 field descriptors (ours have 2: 2,106 bytes),
# so one request nearly always covers both.
FIRST_READ = 64 << 10


def default_cache_dir() -> Path:
    return Path(os.environ.get("TURBOTRAIN_CACHE") or "~/.cache/turbotrain/shards").expanduser()


def cache_settings(cache_dir, cache_limit) -> tuple[Path, int]:
    """(folder, bytes) from the flags, else $TURBOTRAIN_CACHE / $TURBOTRAIN_CACHE_LIMIT, else
    the defaults."""
    folder = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    if cache_limit:
        limit, source = cache_limit, "--cache-limit"
    elif os.environ.get("TURBOTRAIN_CACHE_LIMIT"):
        limit, source = os.environ["TURBOTRAIN_CACHE_LIMIT"], "$TURBOTRAIN_CACHE_LIMIT"
    else:
        limit, source = DEFAULT_CACHE_LIMIT, "--cache-limit"
    try:
        return folder, parse_size(limit, source)
    except SizeError as e:
        raise DatasetError(str(e)) from None


def read_remote_dataset_json(url: str, store: Store | None = None) -> dict:
    """URL/dataset.json, fetched (at most MAX_JSON_BYTES) and checked as a local one is."""
    store = store or Store(url)
    size = store.size(DATASET_JSON)
    if size > MAX_JSON_BYTES:
        raise DatasetError(f"{shown_url(join(url, DATASET_JSON))}: {size / 2**20:,.0f} MiB, over the "
                           f"{MAX_JSON_BYTES / 2**20:,.0f} MiB limit for one file")
    return parse_dataset_json(store.get_range(DATASET_JSON, 0, size), shown_url(url),
                              check_files=False)


class RemoteShard:
    """One shard object: metadata by range reads, the whole file through the cache on open()."""

    def __init__(self, reader: "RemoteShards", index: int, entry: dict):
        self.reader, self.index, self.entry = reader, index, entry
        self.name = entry["file"]
        self.num_samples = int(entry["num_samples"])
        self.nbytes = entry.get("bytes")
        self.url = join(reader.store.url, self.name)
        self.key = shard_cache.cache_key(self.url, entry.get("sha256"))
        self._meta: ShardMetadata | None = None

    def __repr__(self) -> str:
        return f"RemoteShard({shown_url(self.url)!r}, {self.num_samples} samples)"

    def metadata(self) -> ShardMetadata:
        if self._meta is None:
            self._meta = self._read_metadata()
        return self._meta

    def _read_metadata(self) -> ShardMetadata:
        store, shown = self.reader.store, shown_url(self.url)
        nbytes = self.nbytes if self.nbytes is not None else store.size(self.name)
        head = store.get_range(self.name, 0, min(FIRST_READ, nbytes))
        if len(head) < layout.HEADER_DTYPE.itemsize:
            raise DatasetError(f"{shown}: not a dataset (only {nbytes} bytes)")
        header = np.frombuffer(head[:layout.HEADER_DTYPE.itemsize], layout.HEADER_DTYPE)[0]
        num_fields = int(header["num_fields"])
        if not 1 <= num_fields <= 64:  # BetonFile says so below; this only bounds our read
            num_fields = 1
        fields_end = layout.metadata_offset(num_fields)
        if fields_end > len(head):
            head = store.get_range(self.name, 0, min(fields_end, nbytes))
        if int(header["num_samples"]) != self.num_samples:  # before sizing a read by it
            raise DatasetError(f"{shown}: holds {int(header['num_samples'])} samples, "
                               f"dataset.json says {self.num_samples}: the object was replaced; "
                               f"upload the prepared folder again")
        pieces = {0: head}
        if fields_end <= nbytes and int(header["version"]) == layout.BETON_VERSION:
            descs = np.frombuffer(head[layout.HEADER_DTYPE.itemsize:fields_end],
                                  layout.FIELD_DESC_DTYPE)
            types = [int(t) for t in descs["type_id"]]
            if all(t in layout.FIELD_METADATA_DTYPES for t in types):
                row = layout.metadata_dtype(types).itemsize
                table_end = min(fields_end + self.num_samples * row, nbytes)
                pieces[fields_end] = store.get_range(self.name, fields_end, table_end)
                alloc = int(header["alloc_table_ptr"])
                # At most one allocation per field and sample: a pointer near the file's start
                # must not make us read the data pages into memory as a "table".
                most = layout.ALLOC_DTYPE.itemsize * self.num_samples * len(types)
                if not table_end <= alloc <= nbytes or nbytes - alloc > most:
                    raise DatasetError(f"{shown}: corrupt header: the allocation table at "
                                       f"{alloc} does not fit its {self.num_samples} samples")
                pieces[alloc] = store.get_range(self.name, alloc, nbytes)
        beton = _check_pieces(pieces, nbytes, shown)
        self._check_index(beton)
        meta = ShardMetadata(*(np.array(a) for a in (beton.modes, beton.heights, beton.widths,
                                                     beton.labels)))
        del beton  # unmaps the scratch file
        return meta

    def open(self) -> BetonFile:
        reader, shown = self.reader, shown_url(self.url)
        nbytes = self.nbytes if self.nbytes is not None else reader.store.size(self.name)
        path = reader.cache.acquire(self.key, nbytes, self._download, what=shown,
                                    on_release=lambda: reader.let_go(self.index))
        try:
            beton = BetonFile(path)
        except DatasetError as e:
            reader.cache.release(self.key)
            raise DatasetError(str(e).replace(printable(path), shown)) from None
        if not reader.cache.unchanged(path, beton.opened):
            reader.cache.release(self.key)
            raise DatasetError(f"{printable(path)}: replaced or changed between the cache "
                               f"finding it and its opening: someone else writes into "
                               f"--cache-dir; give this run a folder of its own")
        try:
            self._check_index(beton)
        except DatasetError as e:
            reader.cache.release(self.key)
            raise DatasetError(str(e).replace(printable(path), shown)) from None
        meta = self.metadata()
        same = all(np.array_equal(a, b) for a, b in zip(
            (meta.modes, meta.heights, meta.widths, meta.labels),
            (beton.modes, beton.heights, beton.widths, beton.labels)))
        if not same:
            reader.cache.release(self.key)
            raise DatasetError(f"{shown}: its metadata changed since the split was opened "
                               f"(the object was replaced); reopen the dataset")
        reader.opened(self.index)
        return beton

    def _check_index(self, beton: BetonFile) -> None:
        """The shard must hold the sample count and bytes its index entry says."""
        if len(beton) != self.num_samples or beton.file_size != (self.nbytes or beton.file_size):
            raise DatasetError(f"{shown_url(self.url)}: {len(beton)} samples in "
                               f"{beton.file_size} bytes, dataset.json says {self.num_samples} "
                               f"in {self.nbytes}: the object was replaced; upload the "
                               f"prepared folder again")

    def _download(self, f) -> None:
        """The whole object into f (the cache's new file, sized to it), its size and SHA-256
        checked against the index."""
        digest, expected = hashlib.sha256(), self.entry.get("sha256")
        self.reader.store.download(self.name, f, os.fstat(f.fileno()).st_size, digest.update)
        if expected is not None and digest.hexdigest() != expected.lower():
            raise DatasetError(f"{shown_url(self.url)}: SHA-256 {digest.hexdigest()[:12]}..., "
                               f"dataset.json says {expected[:12]}...: the object was replaced "
                               f"or damaged; upload the prepared folder again")


def _check_pieces(pieces: dict[int, bytes], nbytes: int, shown: str) -> BetonFile:
    """A BetonFile over a sparse scratch file of nbytes holding `pieces` at their offsets:
    BetonFile's own checks run on them (no sample byte is needed, none is on disk)."""
    with tempfile.TemporaryDirectory(prefix="turbotrain-meta-") as tmp:
        scratch = Path(tmp) / "shard.beton"
        with os.fdopen(create_new(scratch), "wb") as f:
            f.truncate(nbytes)
            for offset, data in pieces.items():
                f.seek(offset)
                f.write(data)
        try:
            return BetonFile(scratch)
        except DatasetError as e:
            raise DatasetError(str(e).replace(printable(scratch), shown)) from None


class RemoteShards:
    """The shards of one remote split, their cache and what this process reads next."""

    def __init__(self, url: str, info: dict, split: str, cache_dir: Path, limit: int):
        self.store = Store(url)
        self.cache_dir, self.limit = cache_dir, limit
        meta = info["splits"][split]
        entries = meta["shards"] if "shards" in meta else [meta]
        self.shards = [RemoteShard(self, k, entry) for k, entry in enumerate(entries)]
        self._init_process_state()

    def _init_process_state(self) -> None:
        """Threads, locks and hints of this process; again in a forked DataLoader worker,
        which has none of its parent's threads (its split stays attached)."""
        _INSTANCES.add(self)
        self.cache = shard_cache.shared(self.cache_dir, self.limit)
        self._lock = threading.Lock()
        self._sequence: list[int] = []
        self._position = 0
        self._split = getattr(self, "_split", None)
        self._queue: queue.SimpleQueue | None = None
        self._in_flight: set[int] = set()

    def __getstate__(self) -> dict:
        # A worker process gets the same shards and cache folder, with its own threads/locks.
        return {k: self.__dict__[k] for k in ("store", "cache_dir", "limit", "shards")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_process_state()

    def attach(self, split) -> None:
        self._split = weakref.ref(split)

    def read_metadata(self) -> None:
        """Every shard's metadata, METADATA_THREADS range reads at a time (a 1,000-shard split
        opens in ~1,000 x 3 x 50 ms / 8 = 19 s instead of 150 s)."""
        with concurrent.futures.ThreadPoolExecutor(METADATA_THREADS) as pool:
            list(pool.map(RemoteShard.metadata, self.shards))

    # -- the order's hints ----------------------------------------------------------------------
    def will_read(self, shard_ids) -> None:
        with self._lock:
            self._sequence = [int(k) for k in shard_ids if 0 <= int(k) < len(self.shards)]
            self._position = 0
        self._look_ahead()

    def opened(self, k: int) -> None:
        """Shard k was opened for reading: the reader has moved on to it."""
        with self._lock:
            seq, pos = self._sequence, self._position
            if k in seq[pos:]:
                self._position = seq.index(k, pos)
        self._look_ahead()

    def let_go(self, k: int) -> None:
        """The cache needs room: the split drops shard k's opened file (reopened on demand)."""
        split = self._split() if self._split is not None else None
        close = getattr(split, "close_shard", None)
        if close is not None:
            close(k)

    def _look_ahead(self) -> None:
        with self._lock:
            upcoming, room = [], self.limit
            for k in list(dict.fromkeys(self._sequence[self._position:]))[:PREFETCH + 1]:
                room -= self.shards[k].nbytes or 0
                if room < 0:  # protect only what fits, or the reader could never make room
                    break
                upcoming.append(k)
            self.cache.protect(self, [self.shards[k].key for k in upcoming])
            todo = [k for k in upcoming[1:] if k not in self._in_flight
                    and not self.cache.holds(self.shards[k].key)]
            self._in_flight.update(todo)
            if todo and self._queue is None:
                self._queue = queue.SimpleQueue()
                # Daemon threads (not a ThreadPoolExecutor, which the interpreter joins at exit):
                # a run that ends or fails never waits for a prefetch; its .part is cleaned
                # up by the next process that needs the room.
                for n in range(PREFETCH):
                    threading.Thread(target=self._prefetcher, daemon=True,
                                     name=f"turbotrain-prefetch-{n}").start()
        for k in todo:
            self._queue.put(k)

    def _prefetcher(self) -> None:
        while True:
            self._prefetch(self._queue.get())

    def _prefetch(self, k: int) -> None:
        shard = self.shards[k]
        try:
            nbytes = shard.nbytes if shard.nbytes is not None else self.store.size(shard.name)
            # wait=False: a full cache skips the prefetch; the read downloads it when due.
            self.cache.acquire(shard.key, nbytes, shard._download, what=shown_url(shard.url),
                               on_release=lambda: self.let_go(k), wait=False)
        except DatasetError:
            pass  # the read itself will download it and report the error on one line
        finally:
            with self._lock:
                self._in_flight.discard(k)


_INSTANCES: "weakref.WeakSet[RemoteShards]" = weakref.WeakSet()
os.register_at_fork(after_in_child=lambda: [r._init_process_state() for r in list(_INSTANCES)])


def open_remote_dataset(url: str, split: str = "train", cache_dir=None, cache_limit=None, *,
                        info: dict | None = None):
    """Split `split` of the prepared dataset at `url` (s3://, gs://, az://, https://), its
    shards read through a ShardCache in cache_dir of at most cache_limit bytes. `info`: the
    URL's checked dataset.json when the caller fetched it already (another split's `.info`)."""
    folder, limit = cache_settings(cache_dir, cache_limit)
    if info is None:
        info = read_remote_dataset_json(url)
    if split not in info["splits"]:
        raise DatasetError(f"{shown_url(url)}: has no {printable(repr(split))} split "
                           f"(it has: {', '.join(info['splits'])})")
    shards = RemoteShards(url, info, split, folder, limit)
    shards.read_metadata()
    prepared = PreparedSplit(shards.shards, split, info, root=shown_url(url),
                             on_will_read=shards.will_read)
    shards.attach(prepared)
    prepared.cache_limit = limit  # the plan's `--order auto` compares the split with it
    return prepared

