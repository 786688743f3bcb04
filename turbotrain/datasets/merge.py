"""`turbotrain merge OUT`: checks the N part manifests of a `--part` conversion and the shard
files they list, then writes dataset.json (and skipped.txt) exactly as a one-machine run would
(shard_results.dataset_info), and removes the manifests.

A part manifest is input like any other (it may have been copied from anywhere): it is read
size-capped, and every value merge uses is checked before it is used.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from turbotrain.printable import printable

from .dataset import file_sha256
from .parts import (MANIFEST_KIND, MANIFEST_VERSION, PARTS_DIR, is_part_partial, manifest_name,
                    parse_manifest_name)
from .reader import DatasetError
from .schema import DATASET_JSON, MAX_SHARDS, SPLITS
from .shard_plan import part_shards
from .shard_results import ShardResult, dataset_info, skipped_lines
from .shards import parse_shard_filename, shard_filename
from .untrusted import MIB, UnsafeInput, read_regular

# A manifest lists a part's shards and skipped files: 100,000 shards are ~20 MB of JSON.
MAX_MANIFEST_BYTES = 256 * MIB
# Shards hashed at once: sha256 releases the GIL, and a shared filesystem rewards parallel reads.
HASH_THREADS = 4


class MergeError(ValueError):
    """The parts cannot be merged; one line naming the part or file and what to do."""


def merge(out: str | os.PathLike) -> dict:
    """Merges the parts in OUT; returns dataset.json's content."""
    out = Path(out)
    manifests = _read_manifests(out)
    first_name, first = next(iter(manifests.items()))
    agreed = first["agreement"]
    for name, manifest in manifests.items():
        _check_agrees(out, name, manifest["agreement"], first_name, agreed)
    parts = agreed["parts"]
    missing = sorted(set(range(parts)) - {m["part"] for m in manifests.values()})
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
        raise MergeError(f"{out}: part(s) {shown} of {parts} missing (no {PARTS_DIR}/"
                         f"{manifest_name(missing[0], parts)}); run prepare-dataset --part "
                         f"{missing[0]}/{parts} (an interrupted part writes no manifest)")
    results = _results_in_plan_order(out, manifests, agreed)
    _check_no_stray_shards(out, {r.file for r in results})
    _check_files(out, results, manifests)
    facts = {**agreed["source"], "path": manifests[manifest_name(0, parts)]["source_path"]}
    info = dataset_info(facts, agreed["encoding"], results, sharded=True)
    if info is None:
        raise MergeError(f"{out}: no image could be read in any part (all were skipped)")
    _install(out, info, results)
    return info


def _read_manifests(out: Path) -> dict[str, dict]:
    folder = out / PARTS_DIR
    if not folder.is_dir():
        if (out / DATASET_JSON).is_file():
            raise MergeError(f"{out}: already merged ({DATASET_JSON} exists, no {PARTS_DIR}/)")
        raise MergeError(f"{out}: no {PARTS_DIR}/ folder of part manifests; run "
                         f"`prepare-dataset SOURCE {out} --shard-size S --part i/N` first")
    manifests = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith("."):
            continue  # a manifest being written (parts.install_part's temporary file)
        numbers = parse_manifest_name(name)
        if numbers is None:
            raise MergeError(f"{folder / name}: not a part manifest (expected "
                             f"part-00000-of-00004.json); move it out of {folder}")
        manifests[name] = _read_manifest(folder / name, numbers)
    if not manifests:
        raise MergeError(f"{folder}: holds no part manifest; run prepare-dataset --part i/N")
    counts = sorted({m["agreement"]["parts"] for m in manifests.values()})
    if len(counts) > 1:
        raise MergeError(f"{folder}: holds manifests of {' and '.join(map(str, counts))} parts "
                         f"(from different runs); remove the stale ones")
    return manifests


def _read_manifest(path: Path, numbers: tuple[int, int]) -> dict:
    shown = printable(path)
    try:
        manifest = json.loads(read_regular(path, MAX_MANIFEST_BYTES))
    except UnsafeInput as e:
        raise MergeError(f"{shown}: {e}") from None
    except (OSError, ValueError, RecursionError) as e:
        raise MergeError(f"{shown}: not a readable part manifest ({e}); re-run that part") \
            from None
    problem = _manifest_problem(manifest, numbers)
    if problem:
        raise MergeError(f"{shown}: {problem}; re-run prepare-dataset --part "
                         f"{numbers[0]}/{numbers[1]}")
    return manifest


def _manifest_problem(m: object, numbers: tuple[int, int]) -> str | None:
    """Why m is not a well-formed manifest of part numbers[0] of numbers[1] (None if it is)."""
    if not isinstance(m, dict) or m.get("kind") != MANIFEST_KIND:
        return "not a part manifest"
    if m.get("manifest_version") != MANIFEST_VERSION:
        return f"manifest version {printable(repr(m.get('manifest_version')))[:20]}, expected " \
               f"{MANIFEST_VERSION}"
    agreed = m.get("agreement")
    if not (isinstance(agreed, dict) and _is_int(agreed.get("parts"))
            and (m.get("part"), agreed["parts"]) == numbers):
        return "its part number disagrees with its file name"
    plan = agreed.get("plan")
    if not (isinstance(plan, dict) and plan and all(
            split in SPLITS and isinstance(p, dict) and _is_int(p.get("shards"))
            and 1 <= p["shards"] <= MAX_SHARDS for split, p in plan.items())):
        return "has no valid shard plan"
    if not isinstance(agreed.get("source"), dict) or not isinstance(m.get("source_path"), str):
        return "has no source"
    shards = m.get("shards")
    if not isinstance(shards, list):
        return "lists no shards"
    for entry in shards:
        try:
            r = ShardResult.from_json(entry)
        except (KeyError, TypeError, ValueError, AttributeError):
            return "has a malformed shard entry"
        if not _valid_result(r, plan):
            return f"has an invalid entry for shard {printable(str(r.file))[:80]}"
    return None


def _valid_result(r: ShardResult, plan: dict) -> bool:
    counts = [r.written, r.bytes, r.pixels.count, *r.mode_counts.values()]
    return (r.split in plan and _is_int(r.index) and 0 <= r.index < plan[r.split]["shards"]
            and r.file == shard_filename(r.split, r.index, plan[r.split]["shards"])
            and all(_is_int(v) and v >= 0 for v in counts)
            and all(_is_int(v) for v in (*r.pixels.sums, *r.pixels.squares))
            and len(r.pixels.sums) == len(r.pixels.squares) == 3
            and isinstance(r.sha256, str) and re.fullmatch(r"[0-9a-f]{64}", r.sha256) is not None
            and all(len(item) == 2 and all(isinstance(x, str) for x in item)
                    for item in r.skipped))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_agrees(out: Path, name: str, agreed: dict, first_name: str, first: dict) -> None:
    if agreed == first:
        return
    differing = next((key for key in first if agreed.get(key) != first.get(key)), "?")
    if isinstance(first.get(differing), dict):
        sub = next((k for k in {**first[differing], **agreed[differing]}
                    if agreed[differing].get(k) != first[differing].get(k)), None)
        differing = f"{differing}.{sub}" if sub else differing
    raise MergeError(f"{out / PARTS_DIR / name}: made with different {differing} than "
                     f"{first_name} (another source, other options or another turbotrain); "
                     f"re-run the parts with the same SOURCE and options")


def _results_in_plan_order(out: Path, manifests: dict, agreed: dict) -> list[ShardResult]:
    """Every shard of the plan exactly once, each from the part the plan gives it to."""
    plan = agreed["plan"]
    every = [(split, k) for split, p in plan.items() for k in range(p["shards"])]
    by_shard = {}
    for name, manifest in manifests.items():
        expected = {every[g] for g in part_shards(len(every), manifest["part"], agreed["parts"])}
        got = [ShardResult.from_json(entry) for entry in manifest["shards"]]
        if {(r.split, r.index) for r in got} != expected or len(got) != len(expected):
            raise MergeError(f"{out / PARTS_DIR / name}: does not list exactly the shards the "
                             f"plan gives part {manifest['part']}; re-run that part")
        by_shard.update({(r.split, r.index): r for r in got})
    return [by_shard[key] for key in every]


def _check_no_stray_shards(out: Path, planned: set[str]) -> None:
    """A shard file of another plan (another --shard-size, an older run) would make OUT differ
    from what one machine writes."""
    stray = sorted(name for name in os.listdir(out)
                   if parse_shard_filename(name) and name not in planned)
    if stray:
        raise MergeError(f"{out}: holds shard files that no part manifest lists ({stray[0]}"
                         f"{', ...' if len(stray) > 1 else ''}); remove them, or re-run the "
                         f"parts into a new OUT")


def _check_files(out: Path, results: list[ShardResult], manifests: dict) -> None:
    """Each shard file must be the one its part wrote: size first (cheap), then sha256."""
    owner = {}
    for manifest in manifests.values():
        for entry in manifest["shards"]:
            owner[entry["file"]] = f"{manifest['part']}/{manifest['agreement']['parts']}"
    for r in results:
        path = out / r.file
        try:
            size = os.stat(path).st_size
        except OSError:
            raise MergeError(f"{printable(path)}: missing (part {owner[r.file]} lists it); "
                             f"re-run prepare-dataset --part {owner[r.file]}") from None
        if size != r.bytes:
            raise MergeError(f"{printable(path)}: {size} bytes, part {owner[r.file]}'s manifest "
                             f"says {r.bytes}; re-run prepare-dataset --part {owner[r.file]}")

    def digest(r: ShardResult) -> str:
        try:
            return file_sha256(out / r.file)
        except (DatasetError, OSError) as e:
            return f"error: {e}"

    with ThreadPoolExecutor(HASH_THREADS) as pool:
        for r, found in zip(results, pool.map(digest, results)):
            if found != r.sha256:
                raise MergeError(f"{printable(out / r.file)}: its checksum is not the one part "
                                 f"{owner[r.file]} recorded (the file changed or comes from "
                                 f"another run); re-run prepare-dataset --part {owner[r.file]}")


def _install(out: Path, info: dict, results: list[ShardResult]) -> None:
    """skipped.txt, then dataset.json (atomically: the dataset is finished once it exists),
    then the manifests and leftover part folders go."""
    skipped = out / "skipped.txt"
    if any(r.skipped for r in results):
        _write_atomically(skipped, skipped_lines(results))
    else:
        skipped.unlink(missing_ok=True)
    _write_atomically(out / DATASET_JSON, json.dumps(info, indent=2) + "\n")
    for entry in os.scandir(out):
        if is_part_partial(entry.name) and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
    folder = out / PARTS_DIR
    for name in os.listdir(folder):
        if parse_manifest_name(name) or name.startswith(".part-"):
            (folder / name).unlink()
    try:
        folder.rmdir()
    except OSError:
        pass  # someone put another file there: leave it (and the folder) alone


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
