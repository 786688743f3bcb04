"""`prepare-dataset SOURCE OUT --shard-size S --part i/N`: one machine's slice of a conversion.

Part i of N converts the shards [i*S/N, (i+1)*S/N) of the shard plan (shard_plan.py; S counts
every split's shards, train's first), into OUT, which many machines may share, or into a folder
of its own that is copied beside the others afterwards. It writes its shards in a hidden folder
inside OUT, moves them in, and writes `OUT/parts/part-0000i-of-0000N.json` last: a part without
its manifest is not finished, whatever shard files it left. `turbotrain merge OUT` (merge.py)
checks the manifests and writes dataset.json.

A part whose manifest is there, with the same inputs (`agreement`: source fingerprint, part
count, settings, shard plan) and its shard files at their sizes, is skipped: what makes an
engine's retries and a rerun after a crash safe (part_status.py). One done with other inputs
is refused in one line.

`--overwrite` with --part redoes that part only: its manifest and shard files are replaced,
never another part's files, and never a merged dataset (a folder with dataset.json).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import socket
from pathlib import Path

from turbotrain import __version__
from turbotrain.datasets.beton.dataset_json import DATASET_JSON, MAX_JSON_BYTES
from turbotrain.datasets.beton.shards import parse_shard_filename
from turbotrain.files.safe_create import make_fresh_dir, write_file

from .output_folder import OutputFolderError, check_not_overlapping
from .shard_plan import SplitPlan, part_shards
from .shard_results import ShardResult

PARTS_DIR = "parts"
MANIFEST_KIND = "turbotrain part manifest"
MANIFEST_VERSION = 1
_MANIFEST_NAME = re.compile(r"part-(\d{5})-of-(\d{5})\.json")


def manifest_name(part: int, parts: int) -> str:
    return f"part-{part:05d}-of-{parts:05d}.json"


def parse_manifest_name(name: str) -> tuple[int, int] | None:
    match = _MANIFEST_NAME.fullmatch(name)
    return (int(match[1]), int(match[2])) if match else None


def _partial_prefix(part: int, parts: int) -> str:
    return f".part-{part:05d}-of-{parts:05d}.partial-"


def is_part_partial(name: str) -> bool:
    """A hidden folder a running (or interrupted) part writes its shards in."""
    return name.startswith(".part-") and ".partial-" in name


def is_part_output(name: str) -> bool:
    """A name a --part run (or merge) may find in OUT: shards, parts/, skipped.txt, partials."""
    return (parse_shard_filename(name) is not None or name in (PARTS_DIR, "skipped.txt")
            or is_part_partial(name))


def check_part_output(out: Path, source: Path) -> None:
    """OUT may be missing, or a folder of parts (this run's or others'); never a merged
    dataset, a file, or a folder holding anything prepare-dataset does not write. Whether this
    part is already done is decided once the source is read (part_status.finished_part)."""
    check_not_overlapping(out, source)
    if not os.path.lexists(out):
        return
    if os.path.islink(out) or not out.is_dir():
        raise OutputFolderError(f"{out} is not a folder (a file or a link); choose another OUT")
    if os.path.islink(out / PARTS_DIR):
        raise OutputFolderError(f"{out / PARTS_DIR} is a symlink; a part writes its manifest "
                                f"only into a real folder inside OUT: remove the link")
    if (out / DATASET_JSON).exists():
        raise OutputFolderError(f"{out} holds a merged dataset ({DATASET_JSON}); write parts into "
                                f"a new OUT (--overwrite never replaces a merged dataset "
                                f"part by part)")
    foreign = sorted(name for name in os.listdir(out) if not is_part_output(name))
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise OutputFolderError(f"{out} holds files prepare-dataset did not write ({shown}); "
                                f"move them out, or choose another OUT")


def part_shard_ids(plans: dict[str, SplitPlan], part: int, parts: int) -> dict[str, list[int]]:
    """{split: shard indices} of part i of N: a contiguous run of all splits' shards."""
    every = [(split, k) for split, plan in plans.items() for k in range(plan.num_shards)]
    ids: dict[str, list[int]] = {split: [] for split in plans}
    for g in part_shards(len(every), part, parts):
        split, k = every[g]
        ids[split].append(k)
    return ids


def part_partial_dir(out: Path, part: int, parts: int) -> Path:
    """A fresh hidden folder inside OUT (so moving the shards in is a rename); the folders an
    interrupted run of the same part left behind are removed first. Named after the host and
    process: machines sharing OUT never collide."""
    out.mkdir(parents=True, exist_ok=True)
    prefix = _partial_prefix(part, parts)
    for entry in os.scandir(out):
        if entry.name.startswith(prefix) and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
    host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:64]
    return make_fresh_dir(out / f"{prefix}{host}-{os.getpid()}")


def agreement(source: dict, encoding: dict, options, plans: dict[str, SplitPlan],
              parts: int) -> dict:
    """What every part of one conversion must share; `merge` compares it between manifests."""
    return {
        "parts": parts,
        "turbotrain_version": __version__,
        "source": {key: source[key] for key in ("kind", "fingerprint", "val_fraction", "classes",
                                                "dropped_classes") if key in source},
        "encoding": encoding,
        "options": {"on_error": options.on_error, "seed": options.seed,
                    "allow_outside_root": options.allow_outside_root,
                    "image_column": options.image_column, "label_column": options.label_column,
                    "limits": dataclasses.asdict(options.limits)},
        "plan": {split: {"shards": plan.num_shards, "samples": int(plan.bounds[-1]),
                         "sha256": plan.digest()} for split, plan in plans.items()},
    }


def first_difference(a: dict, b: dict) -> str:
    """The first key (as `key` or `key.sub`) whose value differs between two agreements."""
    key = next((k for k in {**a, **b} if a.get(k) != b.get(k)), "?")
    if isinstance(a.get(key), dict) and isinstance(b.get(key), dict):
        sub = next((k for k in {**a[key], **b[key]} if a[key].get(k) != b[key].get(k)), None)
        key = f"{key}.{sub}" if sub else key
    return key


def part_manifest(source: dict, encoding: dict, options, plans: dict[str, SplitPlan],
                  results: list[ShardResult]) -> dict:
    part, parts = options.part
    return {"kind": MANIFEST_KIND, "manifest_version": MANIFEST_VERSION, "part": part,
            "agreement": agreement(source, encoding, options, plans, parts),
            "source_path": source["path"],
            "shards": [r.to_json() for r in results]}


def manifest_text(manifest: dict, part: tuple[int, int]) -> str:
    """The manifest as merge reads it: compact JSON of at most MAX_JSON_BYTES, the cap merge
    applies (what bounds json.loads' memory); a part too large for it is one line now, not a
    refusal at merge time."""
    text = json.dumps(manifest, separators=(",", ":")) + "\n"
    if len(text.encode()) > MAX_JSON_BYTES:
        raise OutputFolderError(
            f"part {part[0]}/{part[1]}'s manifest would be {len(text.encode()) / 2**20:,.0f} MiB, "
            f"over the {MAX_JSON_BYTES >> 20} MiB a manifest may be (like dataset.json); split "
            f"the conversion into more --part runs, or use a larger --shard-size")
    return text


def install_part(partial: Path, out: Path, results: list[ShardResult], manifest: dict,
                 part: tuple[int, int]) -> None:
    """Moves the part's shards into OUT, then writes its manifest (atomically, last)."""
    text = manifest_text(manifest, part)
    final = out / PARTS_DIR / manifest_name(*part)
    # A redone part no longer looks finished while its shards are being replaced.
    final.unlink(missing_ok=True)
    for r in results:
        os.replace(partial / r.file, out / r.file)
    final.parent.mkdir(exist_ok=True)
    write_file(final, text, durable=True)
    shutil.rmtree(partial, ignore_errors=True)
