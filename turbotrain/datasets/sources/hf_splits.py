"""The splits of a Hugging Face dataset on disk: rows of Arrow IPC files (`save_to_disk`) or of
Parquet files, read with pyarrow only (the `datasets` package is not needed).

How a worker reads row i, any order, so --workers, --shard-size and --part work as for an
ImageFolder, for datasets larger than RAM:

* Arrow (IPC stream or file): memory-mapped, so a batch is a view of the file (zero-copy) and a
  row costs a slice; pages are the kernel's to evict. Each batch is validated in full
  (`RecordBatch.validate(full=True)`: offsets inside their buffers) before a value is read,
  since a crafted offset would otherwise read outside the map.
* Parquet: pages are compressed, so the smallest unit read is a row group: a worker decodes
  the image column of a row group once and keeps that one (HF writes 100 image rows per row
  group). Samples are handed out in chunks of 16 consecutive rows, so in source order a row
  group is decoded by at most a few workers; in the shuffled order --shard-size stores, most
  chunks decode a row group per sample (not measured yet: bench/bench_sources.py times the
  unsharded conversion; for a large one with --shard-size, prefer Arrow or small row groups).

pyarrow runs single-threaded here (`use_threads=False`): prepare forks its workers, and a
thread pool started in the parent must not be inherited mid-task.
"""
from __future__ import annotations

import collections
import mmap
import os
from dataclasses import dataclass

import numpy as np

from turbotrain.files.untrusted import UnsafeInput, open_regular

from .source import SourceError, SplitSource

OPEN_PER_PROCESS = 8  # files a worker keeps mapped / row groups decoded: one or two are in use
HF_INSTALL_HINT = "pip install turbotrain[hf]"


def pyarrow_modules(where):
    """(pyarrow, pyarrow.ipc, pyarrow.parquet), or SourceError saying how to install them."""
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise SourceError(f"{where} is a Parquet/Arrow source; reading it needs pyarrow: "
                          f"{HF_INSTALL_HINT}") from None
    return pyarrow, pyarrow.ipc, pyarrow.parquet


def image_values(column, row: int) -> bytes | None:
    """Row `row`'s image bytes of an HF Image column (struct {bytes, path}) or a binary one."""
    import pyarrow as pa
    if pa.types.is_struct(column.type):
        if not column[row].is_valid:
            return None
        column = column.field("bytes")
    value = column[row]
    return value.as_py() if value.is_valid else None


def open_arrow(path: str, where: str | None = None):
    """(schema, batches, row starts) of an Arrow IPC file or stream, memory-mapped; each batch
    is validated in full before use. The mapping lives as long as the batches do."""
    pa, ipc, _ = pyarrow_modules(where or path)
    with open_regular(path) as f:  # a regular file, checked on the descriptor we map
        if os.fstat(f.fileno()).st_size == 0:
            raise UnsafeInput("is empty, not an Arrow file")
        mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    buffer = pa.py_buffer(mapped)
    options = ipc.IpcReadOptions(use_threads=False)
    if bytes(buffer[:6]) == b"ARROW1":  # the file format; save_to_disk writes the stream one
        reader = ipc.open_file(pa.BufferReader(buffer), options=options)
        batches = [reader.get_batch(k) for k in range(reader.num_record_batches)]
    else:
        reader = ipc.open_stream(pa.BufferReader(buffer), options=options)
        batches = list(reader)
    for batch in batches:
        batch.validate(full=True)
    starts = np.cumsum([0] + [batch.num_rows for batch in batches], dtype=np.int64)
    return reader.schema, batches, starts


class _PerProcess:
    """A small LRU of opened files (or decoded row groups), per process: a forked worker must
    not use its parent's (the key holds the pid), and a split pickled to a spawned one carries
    none."""

    def __init__(self):
        self.items: collections.OrderedDict = collections.OrderedDict()

    def get(self, key, make):
        key = (os.getpid(), *key)
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key]
        value = make()
        self.items[key] = value
        while len(self.items) > OPEN_PER_PROCESS:
            self.items.popitem(last=False)
        return value


_ARROW_FILES = _PerProcess()
_ROW_GROUPS = _PerProcess()


@dataclass(eq=False)
class HFSplit(SplitSource):
    """Rows of Arrow or Parquet files: row i is row rows[i] of files[file_of[i]]."""
    files: tuple[str, ...]
    file_of: np.ndarray      # int32
    rows: np.ndarray         # int64: the row inside its file
    sizes: np.ndarray        # int64: image bytes (Arrow: exact; Parquet: the row group's mean)
    labels: np.ndarray
    image_column: str
    parquet: bool
    # Parquet only: each file's row-group starts (rows), to find the group of a row.
    group_starts: tuple[np.ndarray, ...] = ()

    def name(self, i: int) -> str:
        return f"{self.files[self.file_of[i]]}[row {self.rows[i]}]"

    def load(self, i: int) -> bytes:
        path, row = self.files[self.file_of[i]], int(self.rows[i])
        if self.parquet:
            starts = self.group_starts[self.file_of[i]]
            group = int(np.searchsorted(starts, row, side="right")) - 1
            column = _ROW_GROUPS.get((path, group), lambda: self._row_group(path, group))
            value = image_values(column, row - int(starts[group]))
        else:
            _, batches, starts = _ARROW_FILES.get((path,), lambda: open_arrow(path))
            k = int(np.searchsorted(starts, row, side="right")) - 1
            batch = batches[k]
            value = image_values(batch.column(batch.schema.get_field_index(self.image_column)),
                                 row - int(starts[k]))
        if value is None:  # checked when listed: the file changed since
            raise UnsafeInput("has no image bytes (only a path, or the file changed since it "
                              "was listed); save the dataset with the images embedded")
        return value

    def _row_group(self, path: str, group: int):
        _, _, pq = pyarrow_modules(path)
        with open_regular(path) as f:
            table = pq.ParquetFile(f).read_row_group(group, columns=[self.image_column],
                                                     use_threads=False)
        return table.column(0).combine_chunks()

    def subset(self, indices: np.ndarray) -> HFSplit:
        return HFSplit(self.files, self.file_of[indices], self.rows[indices],
                       self.sizes[indices], self.labels[indices], self.image_column,
                       self.parquet, self.group_starts)

    def estimated_sizes(self) -> np.ndarray:
        return self.sizes.copy()

    def largest_heads(self, count: int, nbytes: int) -> list[tuple[str, bytes]]:
        if self.parquet:  # a head costs a row group's decode: not sampled (docs/SECURITY.md)
            return []
        heads = []
        for i in np.argsort(-self.sizes, kind="stable")[:count].tolist():
            try:
                heads.append((self.name(i), self.load(i)[:nbytes]))
            except Exception:  # noqa: BLE001 - a bad row fails in one line when it is encoded
                continue
        return heads

    def __repr__(self) -> str:
        kind = "Parquet" if self.parquet else "Arrow"
        return f"HFSplit({len(self)} rows of {len(self.files)} {kind} files)"
