"""Where each part of a `--part i/N` conversion stands: done, missing or damaged.

A part is done when its manifest (`OUT/parts/part-0000i-of-0000N.json`, parts.py: written last,
after its shards were moved in) is readable and every shard file it lists is in OUT at the size
it recorded. That manifest is the part's done marker: it records the part's inputs (source
fingerprint, part count, settings, shard plan: `parts.agreement`), so a part can tell whether
it is already done with the same inputs (skipped), not done (redone), or done with other ones
(refused in one line). This is what makes an engine's retries (Ray's `max_retries`, a Slurm
requeue) and a rerun after a crash safe.

Checking is cheap on purpose: manifests are read (size-capped, as merge reads them) and shards
are `lstat`ed, never read. `turbotrain merge` then hashes every shard against its manifest's
sha256; the Ray engine's merge does not, as its tasks checked their parts' hashes already.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from turbotrain.datasets.beton.dataset_json import DATASET_JSON
from turbotrain.printable import printable

from .merge import MergeError, local_folder, read_manifest, shard_problem
from .output_folder import OutputFolderError
from .parts import PARTS_DIR, first_difference, is_part_partial, manifest_name, \
    parse_manifest_name


@dataclass(frozen=True)
class PartState:
    part: int
    parts: int
    state: str            # "done" | "missing" | "damaged"
    reason: str = ""      # for missing and damaged: why, in words
    manifest: dict | None = None  # for done: the manifest

    @property
    def line(self) -> str:
        return f"part {self.part}/{self.parts}: {self.state}" + \
            (f" ({self.reason})" if self.reason else "")


def part_state(out: Path, part: int, parts: int) -> PartState:
    """Part `part` of `parts` in OUT, by its manifest and its shards' sizes."""
    path = out / PARTS_DIR / manifest_name(part, parts)
    if not os.path.lexists(path):
        partial = [name for name in _names(out)
                   if is_part_partial(name) and name.startswith(f".part-{part:05d}-of-{parts:05d}.")]
        why = f"interrupted: {partial[0]} is its unfinished folder" if partial else "not run"
        return PartState(part, parts, "missing", why)
    try:
        manifest = read_manifest(path, (part, parts))
    except MergeError as e:
        return PartState(part, parts, "damaged", str(e).split(": ", 1)[-1])
    for entry in manifest["shards"]:
        problem = shard_problem(out, entry["file"], entry["bytes"], f"{part}/{parts}")
        if problem:
            return PartState(part, parts, "damaged", problem.split("; ")[0])
    return PartState(part, parts, "done", manifest=manifest)


def finished_part(out: Path, part: tuple[int, int], agreement: dict,
                  overwrite: bool) -> dict | None:
    """The manifest of part i/N when it is done with these inputs (skip it); None when it is
    to be done (not run, interrupted, damaged, or --overwrite); OutputFolderError when it is
    done with other inputs."""
    state = part_state(out, *part)
    if overwrite or state.state != "done":
        return None
    if state.manifest["agreement"] != agreement:
        key = first_difference(agreement, state.manifest["agreement"])
        raise OutputFolderError(
            f"part {part[0]}/{part[1]} in {out} is done with other {key} (another source, "
            f"other options or another turbotrain); run it with the same SOURCE and options, "
            f"pass --overwrite to redo it, or choose another OUT")
    return state.manifest


def part_counts(out: Path) -> list[int]:
    """The part counts N of the manifests in OUT/parts (one, unless runs were mixed)."""
    names = _names(out / PARTS_DIR) if not os.path.islink(out / PARTS_DIR) else []
    return sorted({numbers[1] for numbers in map(parse_manifest_name, names) if numbers})


def parts_status(out: str | os.PathLike, parts: int | None = None) -> list[PartState]:
    """Every part of OUT's conversion (of `parts` parts; None: the count its manifests give)."""
    out = local_folder(out)
    if parts is None:
        counts = part_counts(out)
        if not counts and (out / DATASET_JSON).is_file():
            raise MergeError(f"{printable(out)}: already merged ({DATASET_JSON} exists, no part "
                             f"manifest in {PARTS_DIR}/)")
        if not counts:
            raise MergeError(f"{printable(out)}: holds no part manifest in {PARTS_DIR}/; run "
                             f"prepare-dataset --part i/N first")
        if len(counts) > 1:
            raise MergeError(f"{printable(out / PARTS_DIR)}: holds manifests of "
                             f"{' and '.join(map(str, counts))} parts (from different runs); "
                             f"remove the stale ones")
        parts = counts[0]
    return [part_state(out, k, parts) for k in range(parts)]


def status_lines(states: list[PartState]) -> list[str]:
    """The done parts as ranges ("done: 0-3, 5"), one line per part that is not, the totals."""
    counts = {s: sum(1 for p in states if p.state == s) for s in ("done", "missing", "damaged")}
    done = [p.part for p in states if p.state == "done"]
    lines = [f"done: {_ranges(done)}"] if done else []
    lines += [p.line for p in states if p.state != "done"]
    ready = "; ready to merge" if counts["done"] == len(states) else ""
    lines.append(f"{counts['done']} of {len(states)} parts done, {counts['missing']} missing, "
                 f"{counts['damaged']} damaged{ready}")
    return lines


def _ranges(numbers: list[int]) -> str:
    runs: list[list[int]] = []
    for n in numbers:
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _names(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []
