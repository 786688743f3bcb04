"""Reads one `.beton` split: pure numpy, memory-mapped, random access, validated on open.

Every check happens once, vectorised, when the file is opened, so that `read(i)` can slice the
memory map without further bounds checks and can never return bytes from outside the sample
(or crash the process) however the file was damaged.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from turbotrain.datasets.errors import DatasetError
from turbotrain.files.untrusted import UnsafeInput, open_regular
from turbotrain.printable import printable

from . import layout
from .map_guard import guard


class BetonFile:
    """One `.beton` file: `len()`, per-sample metadata arrays and the stored bytes of sample i."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            # Only a regular file: a named pipe would block, /dev/zero map endless zeros.
            f = open_regular(self.path)
        except UnsafeInput as e:
            raise self._fail(str(e)) from None
        except OSError as e:
            raise self._fail(f"cannot open ({e.strerror or e})") from None
        with f:  # the map keeps its own reference to the file; ours can close
            # What was opened (the shard cache checks it is what it downloaded).
            self.opened = os.fstat(f.fileno())
            self.file_size = self.opened.st_size
            if self.file_size < layout.HEADER_DTYPE.itemsize:
                raise self._fail(f"not a dataset (only {self.file_size} bytes)")
            try:
                # mode "r": read-only pages, so nothing can write through a view of the file.
                self._map = np.memmap(f, dtype="<u1", mode="r", shape=(self.file_size,))
            except (OSError, ValueError) as e:
                raise self._fail(f"cannot map the file ({e})") from e
        # The file shrinking under the map later: one line and exit 2, not a SIGBUS death.
        guard(self._map, self.path)
        self._read_header()
        self._read_fields()
        self._read_metadata()
        self._read_allocation_table()
        self._check_samples()

    # -- validation, in file order ------------------------------------------------------------
    def _fail(self, problem: str) -> DatasetError:
        return DatasetError(f"{printable(self.path)}: {problem}")

    def _read_header(self) -> None:
        header = self._map[: layout.HEADER_DTYPE.itemsize].view(layout.HEADER_DTYPE)[0]
        version = int(header["version"])
        if version != layout.BETON_VERSION:
            raise self._fail(f"not a dataset of format version {layout.BETON_VERSION} "
                             f"(header says version {version}); re-run prepare-dataset")
        self.num_fields = int(header["num_fields"])
        self.page_size = int(header["page_size"])
        self.num_samples = int(header["num_samples"])
        self.alloc_table_ptr = int(header["alloc_table_ptr"])
        if not 1 <= self.num_fields <= 64:
            raise self._fail(f"corrupt header: {self.num_fields} fields")
        if self.page_size < 4096 or self.page_size & (self.page_size - 1):
            raise self._fail(f"corrupt header: page size {self.page_size} is not a power of two")

    def _read_fields(self) -> None:
        start = layout.HEADER_DTYPE.itemsize
        end = layout.metadata_offset(self.num_fields)
        if end > self.file_size:
            raise self._fail("truncated: the field descriptors are cut off")
        descs = self._map[start:end].view(layout.FIELD_DESC_DTYPE)
        self.field_types = [int(t) for t in descs["type_id"]]
        self.field_names = [layout.decode_field_name(n) for n in descs["name"]]
        unknown = [t for t in self.field_types if t not in layout.FIELD_METADATA_DTYPES]
        if unknown:
            raise self._fail(f"unsupported field type id(s) {unknown}")
        self.image_field = self._pick_field(layout.TYPE_RGB_IMAGE, layout.IMAGE_FIELD, "image")
        self.label_field = self._pick_field(layout.TYPE_INT, layout.LABEL_FIELD, "integer label")
        self.metadata_dtype = layout.metadata_dtype(self.field_types)

    def _pick_field(self, type_id: int, preferred: str, what: str) -> str:
        """Our files name the fields; files from other FFCV writers may not, so fall back to the
        first field of the right type."""
        candidates = [f"f{i}" for i, t in enumerate(self.field_types) if t == type_id]
        if not candidates:
            raise self._fail(f"has no {what} field (fields: {printable(self.field_names)})")
        for i, name in enumerate(self.field_names):
            if name == preferred and self.field_types[i] == type_id:
                return f"f{i}"
        return candidates[0]

    def _read_metadata(self) -> None:
        start = layout.metadata_offset(self.num_fields)
        self.metadata_end = start + self.num_samples * self.metadata_dtype.itemsize
        if self.metadata_end > self.file_size:
            raise self._fail(f"truncated: {self.num_samples} samples need "
                             f"{self.metadata_end} bytes of metadata, the file has {self.file_size}")
        self.metadata = self._map[start:self.metadata_end].view(self.metadata_dtype)
        image = self.metadata[self.image_field]
        self.modes = np.asarray(image["mode"])
        self.heights = np.asarray(image["height"])
        self.widths = np.asarray(image["width"])
        self.data_ptrs = np.asarray(image["data_ptr"]).astype(np.int64, copy=False)
        self.labels = np.asarray(self.metadata[self.label_field]).astype(np.int64)

    def _read_allocation_table(self) -> None:
        ptr, entry = self.alloc_table_ptr, layout.ALLOC_DTYPE.itemsize
        if not self.metadata_end <= ptr <= self.file_size:
            raise self._fail("truncated or corrupt: the allocation table pointer is outside the file")
        if (self.file_size - ptr) % entry:
            raise self._fail("truncated or corrupt: the allocation table is cut off")
        table = self._map[ptr:].view(layout.ALLOC_DTYPE)
        ptrs = table["ptr"].astype(np.int64)
        sizes = table["size"].astype(np.int64)
        bad = (table["ptr"] < self.metadata_end) | (table["size"] > ptr) \
            | (table["ptr"] > ptr - table["size"])
        if bad.any():
            raise self._fail("corrupt allocation table: an entry points outside the data pages")
        order = np.argsort(ptrs, kind="stable")
        self._alloc_ptrs, self._alloc_sizes = ptrs[order], sizes[order]

    def _check_samples(self) -> None:
        n = self.num_samples
        if n == 0:
            self.sizes = np.zeros(0, dtype=np.int64)
            return
        if not np.isin(self.modes, (layout.MODE_JPEG, layout.MODE_RAW)).all():
            raise self._fail("corrupt metadata: unknown image storage mode")
        if (self.heights == 0).any() or (self.widths == 0).any():
            raise self._fail("corrupt metadata: an image has zero width or height")
        # int64: two '<u2' sides multiply past uint16 (and past int32 for 65,535 x 65,535).
        pixels = self.heights.astype(np.int64) * self.widths.astype(np.int64)
        if (pixels > layout.MAX_PIXELS).any():
            first = int(np.argmax(pixels > layout.MAX_PIXELS))
            raise self._fail(f"sample {first} claims {self.widths[first]}x{self.heights[first]} "
                             f"pixels, over the {layout.MAX_PIXELS / 1e6:.0f} Mpx limit for one "
                             f"image")
        # The class count of a bare .beton is its largest label + 1, and sizes the model's
        # output layer: a label of 2**40 would ask for a petabyte.
        bad_label = (self.labels < 0) | (self.labels >= layout.MAX_CLASSES)
        if bad_label.any():
            first = int(np.argmax(bad_label))
            raise self._fail(f"sample {first} has label {self.labels[first]}, outside "
                             f"0..{layout.MAX_CLASSES - 1} (the most classes a dataset may have)")
        if self._alloc_ptrs.size == 0:
            raise self._fail("corrupt allocation table: it is empty")
        slot = np.searchsorted(self._alloc_ptrs, self.data_ptrs)
        slot_ok = slot < self._alloc_ptrs.size
        slot = np.minimum(slot, self._alloc_ptrs.size - 1)
        if not (slot_ok & (self._alloc_ptrs[slot] == self.data_ptrs)).all():
            first = int(np.flatnonzero(~(slot_ok & (self._alloc_ptrs[slot] == self.data_ptrs)))[0])
            raise self._fail(f"corrupt metadata: sample {first} points at no allocation")
        self.sizes = self._alloc_sizes[slot]
        raw = self.modes == layout.MODE_RAW
        expected = self.heights.astype(np.int64) * self.widths.astype(np.int64) * 3
        if (self.sizes[raw] != expected[raw]).any():
            first = int(np.flatnonzero(raw & (self.sizes != expected))[0])
            raise self._fail(f"corrupt metadata: raw sample {first} has {self.sizes[first]} bytes, "
                             f"expected {expected[first]}")

    # -- access -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.num_samples

    def mapped_bytes(self) -> np.ndarray:
        """The whole file as mapped (read-only uint8 view): what a checksum covers."""
        return self._map

    def payload(self, i: int) -> np.ndarray:
        """The stored bytes of sample i (a read-only view of the memory map, no copy)."""
        i = self._index(i)
        start = int(self.data_ptrs[i])
        return self._map[start:start + int(self.sizes[i])]

    def payload_addresses(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Vectorised `payload` for the compiled decode kernel: the int64 memory addresses and
        sizes of samples `indices` (0 <= i < len), and the map they point into, which the
        caller holds until it has read them. Every range was checked against the file on open."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= self.num_samples):
            bad = int(indices[(indices < 0) | (indices >= self.num_samples)][0])
            raise IndexError(f"sample {bad} out of range for {self.path} "
                             f"({self.num_samples} samples)")
        return self._map.ctypes.data + self.data_ptrs[indices], self.sizes[indices], self._map

    def payload_views(self, indices: np.ndarray) -> list[np.ndarray]:
        """Vectorised `payload`: the stored bytes of samples `indices` (0 <= i < len) as
        read-only views of the map, located in one step (DALI's feed: ~0.2 us a sample)."""
        addresses, sizes, mapped = self.payload_addresses(indices)
        starts = (addresses - mapped.ctypes.data).tolist()
        return [mapped[start:start + size] for start, size in zip(starts, sizes.tolist())]

    def raw_image(self, i: int) -> np.ndarray:
        """Sample i stored raw, as an HWC uint8 view (no copy)."""
        i = self._index(i)
        if self.modes[i] != layout.MODE_RAW:
            raise ValueError(f"sample {i} of {self.path} is stored as JPEG, not raw")
        return self.payload(i).reshape(int(self.heights[i]), int(self.widths[i]), 3)

    def _index(self, i: int) -> int:
        i = int(i)
        if not -self.num_samples <= i < self.num_samples:
            raise IndexError(f"sample {i} out of range for {self.path} ({self.num_samples} samples)")
        return i % self.num_samples
