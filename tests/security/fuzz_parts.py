"""Fuzzes part manifests and the shard index in ONE process, for test_merge_safety.py.

    python tests/security/fuzz_parts.py WORKDIR CASES SEED

Converts a small source in two parts (prepare-dataset --part 0/2 and 1/2), merges a copy once
for a reference dataset, then CASES times, on a fresh copy: either mutates the part manifests
(one of them or all alike: fuzz_dataset_json's values anywhere, dropped keys, shard entries,
pixel sums, bytes) and runs `merge`, then opens what it wrote; or mutates the merged
dataset.json's shard index (splits.*.shards: files, counts, sizes, checksums) and opens the
split and reads every sample.

Acceptable: success, or one MergeError / DatasetError line (never a dataset.json that merge
wrote and the schema then refuses), and nothing outside the case's folder changed (a sentinel folder beside it, with a file and a link into it, is compared).
Prints {"cases": N, "refused": K, "problems": [...]}.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.security.confined import changed, tree_state  # noqa: E402
from tests.security.fuzz_dataset_json import DEEP, VALUES, _parent, _paths  # noqa: E402
from turbotrain.cli import main as turbotrain_main  # noqa: E402
from turbotrain.datasets import DatasetError, open_dataset  # noqa: E402
from turbotrain.datasets.prepare.merge import MergeError, merge  # noqa: E402
from turbotrain.datasets.synthetic import write_shapes_imagefolder  # noqa: E402
from turbotrain.printable import printable  # noqa: E402

PIXEL_VALUES = [-1, 0, 2**53, 10**30, 10**400, 255 * 1024 * 10**8, 1.5, None, "1"]


def make_template(workdir: Path) -> Path:
    source, out = workdir / "src", workdir / "template"
    write_shapes_imagefolder(source, train_per_class=3, val_per_class=1, size=(24, 24))
    with contextlib.redirect_stdout(io.StringIO()):
        for part in ("0/2", "1/2"):
            code = turbotrain_main(["prepare", str(source), str(out), "--shard-size", "8MiB",
                                    "--part", part, "--workers", "1"])
            assert code == 0
    return out


def mutate_manifest(manifest: dict, rng: random.Random) -> str:
    kind = rng.choice(["set", "set", "drop", "pixels", "pixels", "entry"])
    if kind == "pixels" and manifest["shards"]:
        entry = rng.choice(manifest["shards"])
        key = rng.choice(["sums", "squares", "count"])
        value = rng.choice(PIXEL_VALUES)
        if key == "count":
            entry["pixels"]["count"] = value
        else:
            entry["pixels"][key][rng.randrange(3)] = value
        return f"pixels.{key} = {str(value)[:20]}"
    if kind == "entry" and manifest["shards"]:
        entry = rng.choice(manifest["shards"])
        key = rng.choice(list(entry))
        entry[key] = rng.choice(VALUES)
        return f"shards[].{key}"
    path = rng.choice([p for p in _paths(manifest) if p])
    parent = _parent(manifest, path)
    if kind == "drop":
        del parent[path[-1]]
    else:
        parent[path[-1]] = rng.choice(VALUES + [DEEP])
    return f"{kind} {'.'.join(map(str, path))}"


def mutate_parts(out: Path, rng: random.Random) -> str:
    names = sorted((out / "parts").iterdir())
    if rng.random() < 0.15:  # bytes
        victim = rng.choice(names)
        data = bytearray(victim.read_bytes())
        op = rng.choice(["truncate", "flip", "empty-objects"])
        if op == "truncate":
            del data[rng.randrange(len(data)):]
        elif op == "flip":
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        else:
            data = bytearray(b"[" + b"{}," * 100_000 + b"{}]")
        victim.write_bytes(bytes(data))
        return f"{victim.name}: bytes {op}"
    seed = rng.randrange(2**32)
    every = rng.random() < 0.5  # all alike: the parts still agree with each other
    what = ""
    for path in (names if every else [rng.choice(names)]):
        manifest = json.loads(path.read_text())
        what = mutate_manifest(manifest, random.Random(seed))
        path.write_text(json.dumps(manifest).replace(json.dumps(DEEP), "[" * 100_000))
    return f"{'all' if every else 'one'} manifest(s): {what}"


def mutate_index(root: Path, rng: random.Random) -> str:
    info = json.loads((root / "dataset.json").read_text())
    split = rng.choice(list(info["splits"]))
    shards = info["splits"][split]["shards"]
    entry = rng.choice(shards)
    op = rng.choice(["set", "set", "swap", "drop", "duplicate"])
    if op == "set":
        key = rng.choice(["file", "num_samples", "bytes", "sha256"])
        entry[key] = rng.choice(VALUES + ["../template/" + entry["file"]])
        what = f"{split} shard {key}"
    elif op == "swap" and len(shards) > 1:
        shards[0], shards[-1] = shards[-1], shards[0]
        what = f"{split} shards swapped"
    elif op == "drop":
        del entry[rng.choice(list(entry))]
        what = f"{split} shard key dropped"
    else:
        shards.append(dict(entry))
        what = f"{split} shard listed twice"
    (root / "dataset.json").write_text(json.dumps(info))
    return f"index: {what}"


def read_everything(root: Path) -> None:
    for split in json.loads((root / "dataset.json").read_text())["splits"]:
        ds = open_dataset(root, split)
        for i in range(len(ds)):
            ds.image(i)


def main() -> int:
    workdir, cases, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    template = make_template(workdir)
    merged = workdir / "merged"
    shutil.copytree(template, merged)
    merge(merged)
    sentinel = workdir / "sentinel"
    sentinel.mkdir()
    (sentinel / "keep.txt").write_text("keep\n")
    problems, refused = [], 0
    for case in range(cases):
        out = workdir / "case"
        shutil.rmtree(out, ignore_errors=True)
        index = rng.random() < 0.35
        shutil.copytree(merged if index else template, out, symlinks=True)
        os.symlink(sentinel, out / "sentinel-link")  # what a careless merge might follow
        what = mutate_index(out, rng) if index else mutate_parts(out, rng)
        before = tree_state(sentinel)
        merged_it = False
        try:
            if not index:
                merge(out)
                merged_it = True
            read_everything(out)
        except DatasetError as e:
            refused += 1
            if merged_it and str(e).startswith(str(out / "dataset.json")):
                problems.append({"case": what, "error": f"merge wrote a dataset.json its own "
                                                        f"schema refuses: {e!s:.300}"})
        except MergeError as e:
            refused += 1
            if "\n" in str(e) or printable(str(e)) != str(e):
                problems.append({"case": what, "error": f"not one printable line: {e!s:.300}"})
        except Exception as e:  # anything else is a finding
            problems.append({"case": what, "error": f"{type(e).__name__}: {str(e)[:300]}",
                             "where": traceback.format_exc(limit=-3)[-600:]})
        if changed(before, tree_state(sentinel)):
            problems.append({"case": what, "error": "changed a file outside the folder"})
    json.dump({"cases": cases, "refused": refused, "problems": problems}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
