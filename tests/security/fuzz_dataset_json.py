"""Fuzzes a prepared dataset's metadata in ONE process, for tests/security/test_dataset_json.py.

    python tests/security/fuzz_dataset_json.py {json|beton} DATASET WORKDIR --seed S --count N

Copies the prepared folder DATASET into WORKDIR, then N times: restores it, applies one seeded
mutation (`json`: to dataset.json, structured or byte-level; `beton`: overwrites bytes in the
first KB of train.beton or in its allocation table, or truncates it) and runs every reader on
it: open_dataset for each split and for the bare .beton (decoding each sample), describe
(`turbotrain inspect`) and verify. The test runs this under an address-space cap and a timeout,
so a hang or a memory blow-up fails it too. Prints one JSON object on stdout:

    {"runs": N, "refused": K, "failures": [{"mutation": ..., "error": ...}, ...]}

A failure is any exception other than DatasetError, or a DatasetError (or a verify problem)
whose text is not one printable line (a newline, or a raw control character).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import traceback
from pathlib import Path

from turbotrain.datasets import DatasetError, open_dataset
from turbotrain.datasets.beton.verify import describe, verify
from turbotrain.printable import printable

# Special files a mutated `file` may name (made in WORKDIR/ds next to the real splits).
SPECIAL_FILES = ("fifo.beton", "zero.beton", "dir.beton", "outside.beton", "missing.beton")

# Values a mutation puts anywhere in dataset.json: wrong types, booleans (which Python counts as
# ints), out-of-range, huge and non-finite numbers, path tricks, terminal escapes, lone
# surrogates, long strings, nested containers.
VALUES = [
    None, True, False, 0, 1, -1, 3, 255, 256, 2**31, 2**63, 2**64 + 1, 10**300, 0.5, -0.0,
    1e308, -1e308, float("nan"), float("inf"), float("-inf"),
    "", "a", "train.beton", "val.beton", "../train.beton", "./train.beton", "/dev/zero",
    "/etc/passwd", "..", ".", ".train.beton", "a/b", "a\\b", "C:\\x.beton", "train.beton\x00",
    "\x1b[2J\x1b]0;owned\x07", "\u202egpj.exe", "\ud800", "\udcff", "x" * 5000, "0" * 64,
    "g" * 64, "A" * 64, *SPECIAL_FILES,
    [], {}, [0, 0, 0], [0.0, 0.0, 0.0], [255, 255, 255], [256, 1, 1], [-1, 5, 5], [1, 2],
    [1, 2, 3, 4], ["a"], ["a", "b", "c"], [[1]], [None, None, None], ["NaN"] * 3,
    [float("nan")] * 3, [1e308, 1e308, 1e308], {"a": 1}, {"mean": [1, 2, 3]},
    {"train": {}}, {"val": {"file": "/dev/zero", "num_samples": 1}},
]
DEEP = "\u0000DEEP\u0000"     # replaced in the text by 100,000 nested brackets
HUGE_INT = "\u0000HUGE\u0000"  # replaced by a 5,000-digit number (over Python's 4,300 limit)


def _paths(node, prefix=()):
    """Every path into the JSON tree (lists: their first 4 items only)."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node[:4]):
            yield from _paths(value, prefix + (i,))


def _parent(tree, path):
    for key in path[:-1]:
        tree = tree[key]
    return tree


def mutate_json(original: dict, rng: random.Random) -> tuple[bytes, str]:
    """(new dataset.json bytes, a description of the mutation)."""
    kind = rng.choice(["drop", "set", "set", "set", "add", "classes", "bytes"])
    tree = json.loads(json.dumps(original))
    if kind in ("drop", "set", "add"):
        path = rng.choice([p for p in _paths(tree) if p])
        parent = _parent(tree, path)
        if kind == "drop":
            del parent[path[-1]]
        elif kind == "set":
            parent[path[-1]] = rng.choice(VALUES + [DEEP, HUGE_INT])
        elif isinstance(parent, dict):
            parent[rng.choice(["format_version", "extra", "split", "file", "sha256"])] = \
                rng.choice(VALUES)
        else:
            parent.append(rng.choice(VALUES))
        what = f"{kind} {'.'.join(map(str, path))}"
    elif kind == "classes":
        # Many short names (up to and past MAX_CLASSES) or a few odd ones.
        count = rng.choice([0, 1, 2, 3, 200_000, 200_001])
        name = rng.choice(["c", "\x1b[31m"] if count > 3 else
                          ["c", "x" * 1000, "x" * 1001, "\x1b[31m", "\ud800", 7, None])
        tree["classes"] = [name] * count
        what = f"classes = {count} x {printable(repr(name))[:20]}"
    if kind != "bytes":
        text = json.dumps(tree).replace(json.dumps(DEEP), "[" * 100_000) \
            .replace(json.dumps(HUGE_INT), "9" * 5000)
        return text.encode("utf-8", "surrogatepass"), what
    data = json.dumps(original).encode()
    op = rng.choice(["truncate", "insert", "utf16", "bom", "nonutf8", "deep", "deep-object",
                     "empty", "nul"])
    if op == "truncate":
        data = data[:rng.randrange(len(data))]
    elif op == "insert":
        pos = rng.randrange(len(data))
        data = data[:pos] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))) \
            + data[pos:]
    elif op == "utf16":
        data = data.decode().encode("utf-16")
    elif op == "bom":
        data = b"\xef\xbb\xbf" + data
    elif op == "nonutf8":
        data = data.replace(b'"train.beton"', b'"train\xff\xfe.beton"', 1)
    elif op == "deep":
        data = b"[" * 100_000
    elif op == "deep-object":
        data = b'{"a":' * 100_000
    elif op == "empty":
        data = b""
    else:
        data = data.replace(b'"classes"', b'"clas\x00ses"', 1)
    return data, f"bytes {op}"


def mutate_beton(original: bytes, alloc_ptr: int, rng: random.Random) -> tuple[bytes, str]:
    data = bytearray(original)
    op = rng.choice(["head", "head", "head", "alloc", "truncate"])
    if op == "truncate":
        cut = rng.randrange(len(data))
        return bytes(data[:cut]), f"truncate at {cut}"
    lo, hi = (0, min(4096, alloc_ptr)) if op == "head" else (alloc_ptr, len(data))
    where = []
    for _ in range(rng.randint(1, 4)):
        pos = rng.randrange(lo, hi)
        data[pos] = rng.choice([0x00, 0xFF, 0x7F, 0x80, rng.randrange(256)])
        where.append(pos)
    return bytes(data), f"{op} bytes {where}"


def check_message(text: str, mutation: str, failures: list) -> None:
    if "\n" in text or printable(text) != text:
        failures.append({"mutation": mutation, "error": f"not one printable line: {text!r}"})


def run_readers(root: Path, mutation: str, failures: list, beton: bool) -> bool:
    """Every reader on root; True when at least one refused it (DatasetError)."""
    refused = False
    calls = [("open train", lambda: open_dataset(root, "train")),
             ("open val", lambda: open_dataset(root, "val")),
             ("describe", lambda: describe(root))]
    if beton:
        calls.append(("bare beton", lambda: _decode_all(open_dataset(root / "train.beton"))))
    for name, call in calls:
        try:
            call()
        except DatasetError as e:
            refused = True
            check_message(str(e), f"{mutation} / {name}", failures)
        except Exception as e:  # anything else is a finding
            failures.append({"mutation": f"{mutation} / {name}",
                             "error": f"{type(e).__name__}: {str(e)[:300]}",
                             "where": traceback.format_exc(limit=-3)[-600:]})
    try:
        for problem in verify(root, progress=False):
            check_message(problem, f"{mutation} / verify", failures)
    except DatasetError as e:
        refused = True
        check_message(str(e), f"{mutation} / verify", failures)
    except Exception as e:
        failures.append({"mutation": f"{mutation} / verify",
                         "error": f"{type(e).__name__}: {str(e)[:300]}",
                         "where": traceback.format_exc(limit=-3)[-600:]})
    return refused


def _decode_all(ds) -> None:
    for i in range(len(ds)):
        try:
            image = ds.image(i)
        except DatasetError:
            continue
        if image.shape != (int(ds.heights[i]), int(ds.widths[i]), 3):
            raise AssertionError(f"sample {i} decoded to {image.shape}")


def make_workdir(dataset: Path, workdir: Path) -> Path:
    root = workdir / "ds"
    shutil.copytree(dataset, root)
    os.mkfifo(root / "fifo.beton")
    os.symlink("/dev/zero", root / "zero.beton")
    (root / "dir.beton").mkdir()
    shutil.copy(root / "train.beton", workdir / "outside.beton")
    os.symlink(workdir / "outside.beton", root / "outside.beton")
    return root


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("target", choices=["json", "beton"])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=300)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    root = make_workdir(args.dataset, args.workdir)
    info_bytes = (root / "dataset.json").read_bytes()
    info = json.loads(info_bytes)
    beton_bytes = (root / "train.beton").read_bytes()
    alloc_ptr = open_dataset(root).beton.alloc_table_ptr
    failures, refused = [], 0
    for _ in range(args.count):
        if args.target == "json":
            data, mutation = mutate_json(info, rng)
            (root / "dataset.json").write_bytes(data)
        else:
            data, mutation = mutate_beton(beton_bytes, alloc_ptr, rng)
            (root / "train.beton").write_bytes(data)
        refused += run_readers(root, mutation, failures, beton=args.target == "beton")
    json.dump({"runs": args.count, "refused": refused, "failures": failures}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
