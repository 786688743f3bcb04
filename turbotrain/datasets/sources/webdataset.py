"""WebDataset's tar files (what WebDataset calls shards) as a SOURCE: `.tar` / `.tar.gz` files
whose members are `KEY.jpg|jpeg|png|webp` with the label in `KEY.cls` (an integer), `KEY.json`
({"label"|"cls"|"class": integer or name}) or `KEY.txt` (an integer or a class name), the first
of these a sample has. Which files and splits: source_files.py. Classes: class_labels.py
(integers kept, names sorted), the union over the splits, so a label means the same class in
train and val.

How the image bytes reach the encoder, for datasets larger than RAM (nothing is extracted to
disk, nothing but an index is kept in memory):

* a plain `.tar` is indexed in one pass over its headers (tarfile seeks past each member's data:
  one 512-byte read per member, ~1 s for 100k members), keeping each sample's image offset and
  size. A worker reads a sample with one pread, in any order, so --workers, --shard-size (which
  stores the train split shuffled) and --part work as for an ImageFolder.
* a `.tar.gz` has no offsets to seek to (deflate must start at the beginning), so it is read as a
  stream twice: here for the labels and sizes, then by prepare's parent, which hands each chunk
  of images to the workers in order (SplitSource.read_in_order; memory: the chunks in flight).
  Spooling the inflated tar to a temporary file would allow any order but doubles the disk a
  conversion needs, for data that barely compresses (JPEG: gzip saves ~1 %), so --shard-size is
  refused for a .tar.gz split with a line saying to gunzip the files.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from turbotrain.files.untrusted import Limits, UnsafeInput, read_range

from .class_labels import classes_and_labels
from .source import WEBDATASET_IMAGE_EXTENSIONS, Source, SourceError, SplitSource
from .tar_scan import Found, is_compressed, scan_tar

WEBDATASET_SUFFIXES = (".tar", ".tar.gz", ".tgz")
# The largest images whose first bytes bound a worker's memory (prepare/worker_memory.py).
HEADS_KEPT = 16
HEAD_BYTES = 1 << 20


@dataclass(eq=False)
class TarSplit(SplitSource):
    """Samples of plain .tar files, read by offset."""
    files: tuple[str, ...]
    file_of: np.ndarray      # int32: which file sample i is in
    members: list[str]       # its image member's name
    offsets: np.ndarray      # int64: the image data's offset in the file
    sizes: np.ndarray        # int64
    labels: np.ndarray

    def name(self, i: int) -> str:
        return f"{self.files[self.file_of[i]]}:{self.members[i]}"

    def load(self, i: int) -> bytes:
        # The sizes were checked against --max-file-mb when the file was indexed.
        return read_range(self.files[self.file_of[i]], int(self.offsets[i]),
                          int(self.sizes[i]))

    def subset(self, indices: np.ndarray) -> TarSplit:
        return TarSplit(self.files, self.file_of[indices], [self.members[i] for i in indices],
                        self.offsets[indices], self.sizes[indices], self.labels[indices])

    def estimated_sizes(self) -> np.ndarray:
        return self.sizes.copy()

    def largest_heads(self, count: int, nbytes: int) -> list[tuple[str, bytes]]:
        heads = []
        for i in np.argsort(-self.sizes, kind="stable")[:count].tolist():
            try:
                heads.append((self.name(i), read_range(self.files[self.file_of[i]],
                              int(self.offsets[i]), min(int(self.sizes[i]), nbytes))))
            except (OSError, UnsafeInput):
                continue  # it fails, in one line, when it is encoded
        return heads

    def __repr__(self) -> str:
        return f"TarSplit({len(self)} samples in {len(self.files)} files)"


@dataclass(eq=False)
class TarStreamSplit(SplitSource):
    """Samples of tar files read as a stream (any .tar.gz in the split): only in order."""
    files: tuple[str, ...]
    file_of: np.ndarray      # int32
    positions: np.ndarray    # int64: the sample's index inside its file
    members: list[str]
    sizes: np.ndarray
    labels: np.ndarray
    limits: Limits = Limits()
    heads: list[tuple[str, bytes]] = field(default_factory=list)
    in_order_only = True

    def name(self, i: int) -> str:
        return f"{self.files[self.file_of[i]]}:{self.members[i]}"

    def load(self, i: int) -> bytes:
        """Streams sample i's file up to it: slow, for tools and tests; prepare reads the
        split once, in order (read_in_order)."""
        return next(self._stream(np.array([i])))[1]

    def subset(self, indices: np.ndarray) -> TarStreamSplit:
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) > 1 and not np.all(np.diff(indices) > 0):
            raise SourceError(f"{self.files[0]} and the other .tar.gz shards of this split can "
                              f"only be read in order, and --shard-size stores the train split "
                              f"shuffled; gunzip the shards (a plain .tar is read by offset) or "
                              f"drop --shard-size")
        return TarStreamSplit(self.files, self.file_of[indices], self.positions[indices],
                              [self.members[i] for i in indices], self.sizes[indices],
                              self.labels[indices], self.limits, self.heads)

    def read_in_order(self, chunks: list[tuple[int, int]]):
        if not chunks:
            return
        wanted = np.concatenate([np.arange(start, stop) for start, stop in chunks])
        stream = self._stream(wanted)
        for start, stop in chunks:
            yield [next(stream)[1] for _ in range(start, stop)]

    def _stream(self, wanted: np.ndarray):
        """(i, image bytes) for the increasing sample indices `wanted`, streaming only the
        files that hold them; SourceError when a file changed since it was listed."""
        for file in np.unique(self.file_of[wanted]).tolist():
            mine = wanted[self.file_of[wanted] == file]
            by_position = dict(zip(self.positions[mine].tolist(), mine.tolist()))
            path = Path(self.files[file])
            for found in scan_tar(path, self.limits, wanted=by_position.__contains__):
                i = by_position.get(found.position)
                if i is None:
                    continue
                if found.member != self.members[i]:
                    raise SourceError(f"{path} changed since it was listed (sample "
                                      f"{found.position} is {found.member!r}, not "
                                      f"{self.members[i]!r}); run prepare-dataset again")
                yield i, found.data
                del by_position[found.position]
                if not by_position:
                    break
            if by_position:
                raise SourceError(f"{path} changed since it was listed (it ends before sample "
                                  f"{min(by_position)}); run prepare-dataset again")

    def estimated_sizes(self) -> np.ndarray:
        return self.sizes.copy()

    def largest_heads(self, count: int, nbytes: int) -> list[tuple[str, bytes]]:
        return [(name, head[:nbytes]) for name, head in self.heads[:count]]

    def __repr__(self) -> str:
        return f"TarStreamSplit({len(self)} samples in {len(self.files)} files, in order)"


@dataclass
class _Index:
    """What one pass over a split's files found."""
    file_of: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    members: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    label_texts: list[str] = field(default_factory=list)
    heads: list = field(default_factory=list)  # heap of (size, name, head)


def read_webdataset(split_files: dict[str, list[Path]], root: Path, limits: Limits) -> Source:
    """The Source of these tar files ({split: files, in order})."""
    indexes = {split: _index_split(files, limits) for split, files in split_files.items()}
    texts = [text for index in indexes.values() for text in index.label_texts]
    places = [(split_files[split], index) for split, index in indexes.items()]

    def where(k: int) -> str:  # only called for an error: no list of every sample's name
        for files, index in places:
            if k < len(index.members):
                return f"{files[index.file_of[k]]}:{index.members[k]}"
            k -= len(index.members)
        return str(root)
    classes, labels = classes_and_labels(texts, where, str(root))
    splits: dict[str, SplitSource] = {}
    start = 0
    for split, index in indexes.items():
        count = len(index.members)
        splits[split] = _split(split_files[split], index, labels[start:start + count], limits)
        start += count
    content = tuple(path for files in split_files.values() for path in files)
    return Source("webdataset", root, classes, splits, content)


def _index_split(files: list[Path], limits: Limits) -> _Index:
    index = _Index()
    for file, path in enumerate(files):
        # A stream cannot come back for an image's header: each is read as it passes (it is
        # inflated anyway) and the largest ones' first bytes kept.
        every = (lambda position: True) if is_compressed(path) else None
        found_any = False
        for found in scan_tar(path, limits, wanted=every):
            found_any = True
            _add(index, file, found)
            if found.data is not None:
                _keep(index.heads, found, str(path))
        if not found_any:
            images = "/".join(WEBDATASET_IMAGE_EXTENSIONS)
            raise SourceError(f"{path} holds no KEY.{images} members, so it is neither a "
                              f"WebDataset shard nor a CIFAR archive; if it "
                              f"holds an image folder, extract it and pass the folder")
    return index


def _add(index: _Index, file: int, found: Found) -> None:
    index.file_of.append(file)
    index.positions.append(found.position)
    index.members.append(found.member)
    index.offsets.append(found.offset)
    index.sizes.append(found.size)
    index.label_texts.append(found.label)


def _keep(heads: list, found: Found, file: str) -> None:
    """Keeps the first HEAD_BYTES of the HEADS_KEPT largest images (a min-heap by size)."""
    item = (found.size, f"{file}:{found.member}", found.data[:HEAD_BYTES])
    if len(heads) < HEADS_KEPT:
        heapq.heappush(heads, item)
    elif item[0] > heads[0][0]:
        heapq.heapreplace(heads, item)
    found.data = None


def _split(files: list[Path], index: _Index, labels: np.ndarray, limits: Limits) -> SplitSource:
    names = tuple(str(path) for path in files)
    file_of = np.array(index.file_of, dtype=np.int32)
    sizes = np.array(index.sizes, dtype=np.int64)
    if any(is_compressed(path) for path in files):
        heads = [(name, head) for _, name, head in sorted(index.heads, reverse=True)]
        return TarStreamSplit(names, file_of, np.array(index.positions, dtype=np.int64),
                              index.members, sizes, labels, limits, heads)
    return TarSplit(names, file_of, index.members, np.array(index.offsets, dtype=np.int64),
                    sizes, labels)
