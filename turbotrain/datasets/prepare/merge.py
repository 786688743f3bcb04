"""`turbotrain merge OUT`: checks the N part manifests of a `--part` conversion and the shard
files they list, then writes dataset.json (and skipped.txt) exactly as a one-machine run would
(shard_results.dataset_info), and removes the manifests.

A part manifest is input like any other (it may have been copied from anywhere), and so is
the folder: it is read size-capped (16 MiB, dataset.json's cap, which also bounds what
json.loads allocates), every value merge uses is checked before it is used, and the dataset.json
it would write is checked by the schema every reader applies (`dataset_json.check_dataset_info`)
before anything is written or deleted. Only regular files inside OUT are hashed, accepted or
deleted: `OUT/parts` must be a real folder, and a shard or manifest that is a symlink is refused.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from turbotrain.datasets.beton import layout
from turbotrain.datasets.beton.dataset_json import (DATASET_JSON, MAX_JSON_BYTES, MAX_SHARDS,
                                                    SPLITS, check_dataset_info)
from turbotrain.datasets.beton.shards import parse_shard_filename, shard_filename
from turbotrain.datasets.beton.split import file_sha256
from turbotrain.datasets.errors import DatasetError
from turbotrain.datasets.remote.urls import is_url
from turbotrain.files.safe_create import write_file
from turbotrain.files.untrusted import UnsafeInput, read_regular
from turbotrain.printable import printable

from .parts import (MANIFEST_KIND, MANIFEST_VERSION, PARTS_DIR, first_difference, is_part_partial,
                    manifest_name, parse_manifest_name)
from .shard_plan import part_shards
from .shard_results import STATS_SCALE, ShardResult, dataset_info, skipped_lines

# A manifest lists a part's shards and skipped files (~300 bytes a shard, compact JSON, as
# parts.manifest_text writes it and checks against this same cap).
MAX_MANIFEST_BYTES = MAX_JSON_BYTES
# Shards hashed at once: sha256 releases the GIL, and a shared filesystem rewards parallel reads.
HASH_THREADS = 4


class MergeError(ValueError):
    """The parts cannot be merged; one line naming the part or file and what to do."""


def merge(out: str | os.PathLike, *, hash_shards: bool = True) -> dict:
    """Merges the parts in OUT; returns dataset.json's content. `hash_shards=False` checks the
    shards' sizes only: for a caller whose parts checked their own shards' sha256 against their
    manifests (the Ray engine's tasks, in parallel on the nodes), so merge reads no shard."""
    out = local_folder(out)
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
    _check_files(out, results, manifests, hash_shards)
    facts = {**agreed["source"], "path": manifests[manifest_name(0, parts)]["source_path"]}
    info = dataset_info(facts, agreed["encoding"], results, sharded=True)
    if info is None:
        raise MergeError(f"{out}: no image could be read in any part (all were skipped)")
    try:  # what every reader will check, checked before anything is written or deleted
        check_dataset_info(info, out)
    except DatasetError as e:
        raise MergeError(f"{out}: the part manifests describe a dataset that is not valid "
                         f"({str(e).split(': ', 1)[-1]}); re-run the parts") from None
    _install(out, info, results, manifests)
    return info


def local_folder(out: str | os.PathLike) -> Path:
    """OUT as a Path; a URL is refused (Path() would make s3://b/x the local s3:/b/x)."""
    if is_url(str(out)):
        raise MergeError(f"{printable(str(out))}: merge works on a folder (local or shared), not "
                         f"object storage: merge the parts there, then upload the merged folder "
                         f"(docs/PREPARE_AT_SCALE.md)")
    return Path(out)


def _read_manifests(out: Path) -> dict[str, dict]:
    folder = out / PARTS_DIR
    if os.path.islink(folder):
        raise MergeError(f"{printable(folder)} is a symlink (to "
                         f"{printable(os.path.realpath(folder))}); merge reads and deletes "
                         f"only inside OUT: copy the manifests into a real {PARTS_DIR}/ folder")
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
        manifests[name] = read_manifest(folder / name, numbers)
    if not manifests:
        raise MergeError(f"{folder}: holds no part manifest; run prepare-dataset --part i/N")
    counts = sorted({m["agreement"]["parts"] for m in manifests.values()})
    if len(counts) > 1:
        raise MergeError(f"{folder}: holds manifests of {' and '.join(map(str, counts))} parts "
                         f"(from different runs); remove the stale ones")
    return manifests


def read_manifest(path: Path, numbers: tuple[int, int]) -> dict:
    shown = printable(path)
    try:
        data = read_regular(path, MAX_MANIFEST_BYTES, follow_symlinks=False)
    except UnsafeInput as e:
        raise MergeError(f"{shown}: {e}") from None
    except OSError as e:
        raise MergeError(f"{shown}: unreadable ({e.strerror or e})") from None
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError, MemoryError) as e:
        reason = "too deeply nested or too large to parse" if not isinstance(e, ValueError) \
            else printable(" ".join(str(e).split()))[:200]
        raise MergeError(f"{shown}: not a readable part manifest ({reason}); re-run that "
                         f"part") from None
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
    source = agreed.get("source")
    if not (isinstance(source, dict) and isinstance(m.get("source_path"), str)
            and isinstance(source.get("classes"), list)
            and all(key in source for key in ("kind", "fingerprint", "val_fraction"))):
        return "has no source (classes, kind, fingerprint, val_fraction and source_path)"
    if not isinstance(agreed.get("encoding"), dict):
        return "has no encoding"
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
            and all(_is_int(v) and 0 <= v < 2**63 for v in counts)
            and len(r.pixels.sums) == len(r.pixels.squares) == 3
            and _possible_pixels(r)
            and isinstance(r.sha256, str) and re.fullmatch(r"[0-9a-f]{64}", r.sha256) is not None
            and all(len(item) == 2 and all(isinstance(x, str) for x in item)
                    for item in r.skipped))


def _possible_pixels(r: ShardResult) -> bool:
    """Pixel totals a shard of r.written images can have: each image at most MAX_PIXELS, each
    value 0..255 (in STATS_SCALE units). Bounded so, the sums of every shard fit a float (an
    OverflowError otherwise) and the statistics are finite."""
    most = r.written * layout.MAX_PIXELS
    return (r.pixels.count <= most
            and all(_is_int(v) and 0 <= v <= 255 * STATS_SCALE * r.pixels.count
                    for v in r.pixels.sums)
            and all(_is_int(v) and 0 <= v <= 255 ** 2 * STATS_SCALE * r.pixels.count
                    for v in r.pixels.squares))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_agrees(out: Path, name: str, agreed: dict, first_name: str, first: dict) -> None:
    if agreed == first:
        return
    differing = first_difference(first, agreed)
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


def shard_problem(out: Path, file: str, size: int, owner: str) -> str | None:
    """What is wrong with a part's shard file, by its size alone (cheap: no read), with what to
    do; None when it is a regular file inside OUT of the size the manifest of part `owner`
    ("1/3") says."""
    path = out / file
    try:
        info = os.lstat(path)
    except OSError:
        return (f"{printable(path)}: missing (part {owner} lists it); re-run prepare-dataset "
                f"--part {owner}")
    if not stat.S_ISREG(info.st_mode):
        what = (f"a symlink (to {printable(os.path.realpath(path))})"
                if stat.S_ISLNK(info.st_mode) else "not a regular file")
        return (f"{printable(path)}: {what}; merge accepts only regular files inside OUT: copy "
                f"the shard itself there")
    if info.st_size != size:
        return (f"{printable(path)}: {info.st_size} bytes, part {owner}'s manifest says {size}; "
                f"re-run prepare-dataset --part {owner}")
    return None


def _check_files(out: Path, results: list[ShardResult], manifests: dict,
                 hash_shards: bool) -> None:
    """Each shard file must be the one its part wrote: size first (cheap), then sha256."""
    owner = {}
    for manifest in manifests.values():
        for entry in manifest["shards"]:
            owner[entry["file"]] = f"{manifest['part']}/{manifest['agreement']['parts']}"
    for r in results:
        problem = shard_problem(out, r.file, r.bytes, owner[r.file])
        if problem:
            raise MergeError(problem)
    if hash_shards:
        check_checksums(out, results, owner)


def check_checksums(out: Path, results: list[ShardResult], owner: dict[str, str]) -> None:
    """Every shard's sha256 is the one its part recorded (`owner`: file -> "1/3"); a
    MergeError names the first that is not. Reads every shard once, HASH_THREADS at a time."""

    def digest(r: ShardResult) -> str:
        try:
            return file_sha256(out / r.file, follow_symlinks=False)
        except (DatasetError, OSError) as e:
            return f"error: {e}"

    pool = ThreadPoolExecutor(HASH_THREADS)
    try:
        for r, found in zip(results, pool.map(digest, results)):
            if found != r.sha256:
                raise MergeError(f"{printable(out / r.file)}: its checksum is not the one part "
                                 f"{owner[r.file]} recorded (the file changed or comes from "
                                 f"another run); re-run prepare-dataset --part {owner[r.file]}")
    finally:
        # Not `with`: an interrupt (or a bad shard) is said at once, not after the shards
        # being hashed are read to their end (seconds each); the process's exit joins them.
        pool.shutdown(wait=False, cancel_futures=True)


def _install(out: Path, info: dict, results: list[ShardResult], manifests: dict) -> None:
    """skipped.txt, then dataset.json (atomically: the dataset is finished once it exists),
    then the manifests that were read and leftover part folders go."""
    skipped = out / "skipped.txt"
    if any(r.skipped for r in results):
        write_file(skipped, skipped_lines(results), durable=True)
    else:
        skipped.unlink(missing_ok=True)
    write_file(out / DATASET_JSON, json.dumps(info, indent=2) + "\n", durable=True)
    for entry in os.scandir(out):
        if is_part_partial(entry.name) and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
    folder = out / PARTS_DIR  # a real folder inside OUT (_read_manifests): unlink stays in it
    for name in os.listdir(folder):
        if name in manifests or name.startswith(".part-"):  # and a killed part's temporary
            with contextlib.suppress(OSError):  # (a folder of that name stays)
                (folder / name).unlink()
    try:
        folder.rmdir()
    except OSError:
        pass  # someone put another file there: leave it (and the folder) alone
