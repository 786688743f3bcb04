"""Writes one `.beton` split, sample by sample, in FFCV's layout (see layout.py).

Samples arrive already encoded and in order, so one process writes sequentially: the output is
byte-identical whatever the number of encoding workers. Data is packed into pages of
`page_size` bytes that no sample crosses, as FFCV's page-based memory managers expect: page k is
bytes [k x P, (k+1) x P) of the file (FFCV finds a sample's page as ptr >> log2(P), and reads
pages with pread, which a short last page satisfies). So the first page is the rest of the one
the metadata ends in, and the file ends after the last sample, then the allocation table: a
split of 60 small images is ~0.2 MB, not the 16 MB that FFCV's writer makes of it (it starts
the data on the next 8 MiB boundary and writes whole pages). Unused page tails are holes (seek
past, never write zeros).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from turbotrain.files.safe_create import replacing
from turbotrain.os_failure import writing

from . import layout


class SampleTooLarge(ValueError):
    """One encoded sample does not fit in a page."""


class BetonWriter:
    """`with BetonWriter(path, capacity) as w: w.append(mode, h, w, payload, label)`.

    `capacity` bounds the number of samples (the metadata table is reserved before the data);
    fewer may be appended (skipped inputs), the header then records the actual count.
    """

    def __init__(self, path: str | os.PathLike, capacity: int,
                 page_size: int = layout.DEFAULT_PAGE_SIZE):
        if page_size < layout.MIN_PAGE_SIZE or page_size & (page_size - 1):
            raise ValueError(f"page_size must be a power of two >= {layout.MIN_PAGE_SIZE}")
        self.path = Path(path)
        self.page_size = page_size
        self.capacity = capacity
        self.field_types = [layout.TYPE_RGB_IMAGE, layout.TYPE_INT]
        self.field_names = [layout.IMAGE_FIELD, layout.LABEL_FIELD]
        self.metadata = np.zeros(capacity, dtype=layout.metadata_dtype(self.field_types))
        self.metadata_start = layout.metadata_offset(len(self.field_types))
        self.data_start = self.metadata_start + self.metadata.nbytes
        self.allocations: list[tuple[int, int, int]] = []
        self.count = 0
        self._page = bytearray(page_size)
        # The open page: its bytes from _page_start (a file offset) to its end, a multiple of
        # page_size; none open yet while _page_end is 0.
        self._page_start = self._page_end = 0
        self._page_used = 0
        self._file = None

    def __enter__(self) -> "BetonWriter":
        # A new file under a fresh name, renamed onto path once finished (safe_create): nothing
        # planted at path is written through, and a failed write leaves no half file there.
        self._replacing = replacing(self.path, "wb")
        with writing(self.path, "a .beton file"):
            self._file = self._replacing.__enter__()
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            try:
                with writing(self.path, "a .beton file"):
                    self._finish()
            except BaseException as failed:
                self._replacing.__exit__(type(failed), failed, failed.__traceback__)
                raise
        self._replacing.__exit__(exc_type, exc, traceback)

    def append(self, mode: int, height: int, width: int, payload, label: int) -> None:
        size = len(payload)
        if size > self.page_size:
            raise SampleTooLarge(f"an encoded image of {size} bytes exceeds the page size "
                                 f"{self.page_size}; use a smaller --max-side")
        if self.count >= self.capacity:
            raise ValueError(f"more than the {self.capacity} samples reserved")
        if max(height, width) > layout.MAX_IMAGE_SIDE:
            raise ValueError(f"image side {max(height, width)} exceeds {layout.MAX_IMAGE_SIDE}")
        if self._page_start + self._page_used + size > self._page_end:
            with writing(self.path, "a .beton file"):
                self._flush_page()
            self._open_page(size)
        offset = self._page_used
        self._page[offset:offset + size] = payload
        self._page_used += size
        ptr = self._page_start + offset
        row = self.metadata[self.count]
        row["f0"]["mode"], row["f0"]["height"], row["f0"]["width"] = mode, height, width
        row["f0"]["data_ptr"] = ptr
        row["f1"] = label
        self.allocations.append((self.count, ptr, size))
        self.count += 1

    def _open_page(self, size: int) -> None:
        """The next page with room for `size` bytes: the first is the rest of the page the
        metadata ends in (the next whole one when that rest is too small), then whole pages."""
        start = self._page_end or self.data_start
        end = layout.align_up(start + 1, self.page_size)
        if start + size > end:
            start, end = end, end + self.page_size
        self._page_start, self._page_end, self._page_used = start, end, 0

    def _flush_page(self) -> None:
        if self._page_used == 0:
            return
        self._file.seek(self._page_start)
        self._file.write(memoryview(self._page)[: self._page_used])

    def _finish(self) -> None:
        self._flush_page()
        # The allocation table right after the last sample: no page-sized tail.
        alloc_ptr = self._page_start + self._page_used if self._page_end else self.data_start
        self._file.truncate(alloc_ptr)
        self._file.seek(alloc_ptr)
        self._file.write(np.array(self.allocations, dtype=layout.ALLOC_DTYPE).tobytes())
        header = np.zeros(1, dtype=layout.HEADER_DTYPE)
        header["version"] = layout.BETON_VERSION
        header["num_fields"] = len(self.field_types)
        header["page_size"] = self.page_size
        header["num_samples"] = self.count
        header["alloc_table_ptr"] = alloc_ptr
        descs = np.zeros(len(self.field_types), dtype=layout.FIELD_DESC_DTYPE)
        for i, (type_id, name) in enumerate(zip(self.field_types, self.field_names)):
            descs[i]["type_id"] = type_id
            descs[i]["name"] = layout.encode_field_name(name)
        self._file.seek(0)
        self._file.write(header.tobytes())
        self._file.write(descs.tobytes())
        self._file.write(self.metadata[: self.count].tobytes())
        self._file.flush()
        os.fsync(self._file.fileno())
