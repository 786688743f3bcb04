"""One pass over a WebDataset tar file's members, grouped into samples, with every untrusted-input
check the tar format needs (shared by the index of a plain .tar and the stream of a .tar.gz).

A member is only ever a name and a range of bytes here: nothing is extracted, so a name such as
`../../etc/passwd.jpg` or `/abs/x.jpg` names a sample and never a place on disk. Only regular
members are read (a symlink, hard link, device or FIFO member is refused: WebDataset writers
never make them, and tarfile would otherwise hand us the target's name as data), at most
MAX_MEMBERS per file, an image member up to --max-file-mb and a label member up to
MAX_LABEL_BYTES. A plain tar's members must lie inside the file (tarfile itself would read a
member that declares 1 TB as an empty file, or stop quietly at a damaged header); a .tar.gz's
stream is charged to an InflateBudget as it is inflated.
"""
from __future__ import annotations

import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from turbotrain.files.untrusted import InflateBudget, Limits, UnsafeInput, open_regular

from .source import WEBDATASET_IMAGE_EXTENSIONS, SourceError

LABEL_EXTENSIONS = ("cls", "json", "txt")  # the first a sample has is its label
LABEL_FIELDS = ("label", "cls", "class")   # of a .json label
# 1M members is ~330k samples of image + label + metadata: 3x ImageNet's largest public
# WebDataset tar files (10k samples); tarfile keeps a TarInfo per member until we drop it.
MAX_MEMBERS = 1_000_000
# A label is a number or a class name; 64 KiB also bounds what json.loads allocates.
MAX_LABEL_BYTES = 64 << 10
BLOCK = tarfile.BLOCKSIZE
_MEMBER_KINDS = {tarfile.SYMTYPE: "a symbolic link", tarfile.LNKTYPE: "a hard link",
                 tarfile.CHRTYPE: "a character device", tarfile.BLKTYPE: "a block device",
                 tarfile.FIFOTYPE: "a named pipe"}


def is_compressed(path: Path) -> bool:
    return path.name.lower().endswith((".tar.gz", ".tgz"))


@dataclass
class Found:
    """One sample of a tar file: its image member and, when asked for, the image's bytes."""
    position: int          # sample index inside the file
    member: str            # the image member's name
    offset: int            # its data's offset in the (inflated) tar
    size: int
    label: str             # the label as text: digits or a class name
    data: bytes | None = None


def scan_tar(path: Path, limits: Limits,
               wanted: Callable[[int], bool] | None = None) -> Iterator[Found]:
    """Yields the tar file's samples in order; with `wanted`, the bytes of the images of the
    positions it accepts are read on the way (a stream cannot come back for them). Raises
    SourceError (one line naming the file) for anything malformed or over a cap."""
    try:
        with open_regular(path) as raw:
            file_size = raw.seek(0, 2)
            raw.seek(0)
            budget = InflateBudget(path, file_size, limits) if is_compressed(path) else None
            mode = "r|gz" if budget else "r:"
            with tarfile.open(fileobj=raw, mode=mode) as tar:
                yield from _samples(tar, path, limits, budget, file_size, wanted)
                if budget is None:
                    _check_end(raw, tar.offset, file_size, path)
    except UnsafeInput as e:
        raise SourceError(f"{path}: {e}") from None
    except SourceError:  # ours, already one line (a ValueError too: not to be wrapped)
        raise
    except (tarfile.TarError, OSError, EOFError, ValueError) as e:
        # zlib.error and gzip's BadGzipFile reach us as tarfile.ReadError or OSError.
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise SourceError(f"{path} is not a readable tar shard ({reason})") from None


def _samples(tar: tarfile.TarFile, path: Path, limits: Limits, budget: InflateBudget | None,
             file_size: int, wanted) -> Iterator[Found]:
    key, image, labels, position = None, None, {}, 0
    for count, member in enumerate(tar, 1):
        tar.members = []  # an index of TarInfos is not needed: keeps memory flat
        if count > MAX_MEMBERS:
            raise SourceError(f"{path} holds more than {MAX_MEMBERS:,} members; split it into "
                              f"smaller shards")
        end = member.offset_data + member.size
        if budget is not None:  # everything before a member's end is inflated to reach it
            budget.reach(end, f"member {member.name!r}")
        elif end > file_size:
            raise SourceError(f"{path}: member {member.name!r} declares {member.size:,} bytes "
                              f"at offset {member.offset_data:,}, past the file's end "
                              f"({file_size:,}); the shard is truncated or damaged")
        if member.isdir():
            continue
        if not member.isreg():
            kind = _MEMBER_KINDS.get(member.type, f"of tar type {member.type!r}")
            raise SourceError(f"{path}: member {member.name!r} is {kind}; a WebDataset shard "
                              f"holds only regular files")
        member_key, ext = split_name(member.name)
        if ext is None:
            continue
        if member_key != key:
            if key is not None:
                yield _found(path, key, image, labels, position)
                position += 1
            key, image, labels = member_key, None, {}
        if ext in WEBDATASET_IMAGE_EXTENSIONS:
            image = _take_image(tar, member, image, path, limits, wanted, position)
        elif ext in LABEL_EXTENSIONS:
            if member.size > MAX_LABEL_BYTES:
                raise SourceError(f"{path}: label {member.name!r} is {member.size:,} bytes, over "
                                  f"the {MAX_LABEL_BYTES >> 10} KiB a label may be")
            labels[ext] = (member.name, tar.extractfile(member).read())
    if key is not None:
        yield _found(path, key, image, labels, position)


def split_name(name: str) -> tuple[str, str | None]:
    """WebDataset's rule: the key is the name up to the first dot of its last component, the
    extension the rest, lower-cased ('a/b.seg.png' -> 'a/b', 'seg.png')."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not dot or not stem:
        return name, None
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


def _take_image(tar, member, image, path: Path, limits: Limits, wanted, position: int):
    if image is not None:
        raise SourceError(f"{path}: sample {split_name(member.name)[0]!r} has two images "
                          f"({image[0].name} and {member.name}); keep one per key")
    if member.size > limits.max_file_bytes:
        raise SourceError(f"{path}: member {member.name!r} is {member.size / (1 << 20):,.0f} "
                          f"MiB, over the {limits.max_file_bytes >> 20:,} MiB limit for one "
                          f"image (--max-file-mb)")
    data = None
    if wanted is not None and wanted(position):
        data = tar.extractfile(member).read()
        if len(data) != member.size:
            raise SourceError(f"{path}: member {member.name!r} is truncated")
    return member, data


def _found(path: Path, key: str, image, labels: dict, position: int) -> Found:
    if image is None:
        raise SourceError(f"{path}: sample {key!r} has no image "
                          f"(.{', .'.join(WEBDATASET_IMAGE_EXTENSIONS)}); every key needs one")
    ext = next((ext for ext in LABEL_EXTENSIONS if ext in labels), None)
    if ext is None:
        raise SourceError(f"{path}: sample {key!r} has no label (.cls, .json or .txt)")
    member, data = image
    name, raw = labels[ext]
    label = parse_label(ext, raw, f"{path}:{name}")
    return Found(position, member.name, member.offset_data, member.size, label, data)


def parse_label(ext: str, raw: bytes, where: str) -> str:
    """A label member's text: digits for a class index, else a class name."""
    try:
        value = json.loads(raw) if ext == "json" else None
        text = "" if ext == "json" else raw.decode("utf-8").strip()
    except RecursionError:
        raise SourceError(f"{where}: the JSON is nested too deeply") from None
    except ValueError as e:  # UnicodeDecodeError, JSONDecodeError, a 5,000-digit integer
        reason = " ".join(str(e).split())[:120]
        raise SourceError(f"{where}: not a readable label ({reason})") from None
    if ext == "json":
        return _json_label(value, where)
    if not text:
        raise SourceError(f"{where}: the label is empty")
    if ext == "cls" and not text.isdecimal():
        raise SourceError(f"{where}: label {text[:40]!r} is not an integer (a .cls holds the "
                          f"class index; put class names in .txt)")
    if ext == "cls" and not text.isascii():
        raise SourceError(f"{where}: label {text[:40]!r} is not an integer written in ASCII")
    return text


def _json_label(value, where: str) -> str:
    if not isinstance(value, dict):
        raise SourceError(f"{where}: expected a JSON object with a "
                          f"{'/'.join(LABEL_FIELDS)} field, got a {type(value).__name__}")
    field = next((name for name in LABEL_FIELDS if name in value), None)
    if field is None:
        raise SourceError(f"{where}: the JSON object has no {'/'.join(LABEL_FIELDS)} field")
    label = value[field]
    if isinstance(label, int) and not isinstance(label, bool):
        if label < 0:
            raise SourceError(f"{where}: negative label {label}")
        return str(label)
    if isinstance(label, str) and label.strip():
        return label.strip()
    raise SourceError(f"{where}: {field} is {type(label).__name__} {str(label)[:40]!r}, "
                      f"expected an integer or a class name")


def _check_end(raw, offset: int, file_size: int, path: Path) -> None:
    """tarfile stops quietly at a header it cannot parse; what follows the last member must be
    the end-of-archive zeros (or nothing), else the file is damaged there."""
    if offset >= file_size:
        return
    raw.seek(offset)
    if raw.read(BLOCK).strip(b"\0"):
        raise SourceError(f"{path}: damaged tar header at offset {offset:,}; the shard is "
                          f"corrupt")
