"""`prepare-dataset SOURCE OUT`: converts a raw image dataset into `OUT/{train,val}.beton` plus
`OUT/dataset.json`.

Encoding runs in a pool of worker processes (`--workers`, default all cores); the parent writes
the samples in source order, so the output is byte-identical whatever the worker count. The
whole dataset is built in a hidden sibling folder and renamed into place at the end: an
interrupted run (Ctrl-C, kill -9) never leaves anything that looks like a finished dataset.
"""
from __future__ import annotations

import ctypes
import json
import multiprocessing
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import __version__
from ..printable import printable
from . import format as fmt
from .dataset import DATASET_FORMAT_VERSION, DATASET_JSON, file_sha256, split_filename
from .output_folder import (OutputFolderError, check_output, install, partial_dir,
                            remove_stale_partials)
from .untrusted import Limits, UnsafeInput
from .writer import BetonWriter, SampleTooLarge

# Samples per task sent to a worker: large enough that the pipe costs nothing (~1 % at 16 x
# 70 KB JPEGs), small enough to keep the progress bar live and memory bounded.
CHUNK = 16
# Tasks in flight per worker: bounds memory (workers * 4 * CHUNK encoded images) while the
# parent writes.
IN_FLIGHT_PER_WORKER = 4
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class PrepareError(RuntimeError):
    """A user-caused problem with a conversion; the message is one line naming the culprit."""


@dataclass(frozen=True)
class PrepareOptions:
    encoding: str = "auto"        # auto | jpeg | raw
    max_side: int = 512           # 0: keep the source size
    quality: int = 90
    workers: int = 0              # 0: all cores
    val_fraction: float = 0.0
    on_error: str = "fail"        # fail | skip
    overwrite: bool = False
    seed: int = 0
    progress: bool = True
    limits: Limits = Limits()
    allow_outside_root: bool = False  # read CSV rows / symlinks that lead outside SOURCE


@dataclass
class SplitResult:
    written: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    mode_counts: dict[str, int] = field(default_factory=lambda: {"jpeg": 0, "raw": 0})
    pixel_sum: np.ndarray = field(default_factory=lambda: np.zeros(3))
    pixel_sq_sum: np.ndarray = field(default_factory=lambda: np.zeros(3))
    pixel_count: int = 0


# -- worker side -------------------------------------------------------------------------------
_WORKER_SPLIT = None
_WORKER_OPTIONS: PrepareOptions | None = None


def _die_with_parent() -> None:
    """Linux: the kernel kills this worker when the parent dies (even by SIGKILL), so a killed
    conversion leaves no orphan workers behind holding the terminal's pipes open."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: a SIGKILLed parent may leave idle workers behind


def _init_worker(split_source, options: PrepareOptions, in_pool: bool = False) -> None:
    global _WORKER_SPLIT, _WORKER_OPTIONS
    if in_pool:
        # Ctrl-C reaches the whole process group: only the parent handles it (cleanly), and
        # the parent's SIGTERM handler must not turn the pool's own shutdown into tracebacks.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _die_with_parent()
        # One OpenCV thread per worker: the pool already uses every core.
        import cv2
        cv2.setNumThreads(1)
    _WORKER_SPLIT, _WORKER_OPTIONS = split_source, options


def _encode_range(bounds: tuple[int, int]) -> list:
    """Encodes samples [start, stop) of the worker's split: per sample either
    ("ok", EncodedSample) or ("error", name, reason)."""
    from .images import ImageError, encode_sample
    start, stop = bounds
    out = []
    for i in range(start, stop):
        name = _WORKER_SPLIT.name(i)
        try:
            source = _WORKER_SPLIT.load(i)
            sample = encode_sample(source, encoding=_WORKER_OPTIONS.encoding,
                                   max_side=_WORKER_OPTIONS.max_side,
                                   quality=_WORKER_OPTIONS.quality)
            out.append(("ok", sample))
        except (ImageError, UnsafeInput) as e:
            out.append(("error", name, str(e)))
        except OSError as e:
            out.append(("error", name, f"cannot read ({e.strerror or e})"))
    return out


# -- parent side -------------------------------------------------------------------------------
def _chunks(n: int):
    return [(s, min(s + CHUNK, n)) for s in range(0, n, CHUNK)]


def _encoded_chunks(split_source, options: PrepareOptions, workers: int):
    """Yields each chunk's results in source order, encoded by `workers` processes."""
    chunks = _chunks(len(split_source))
    if workers <= 1:
        _init_worker(split_source, options)
        for bounds in chunks:
            yield _encode_range(bounds)
        return
    # fork: workers inherit the (possibly large, array-backed) source without pickling it.
    # ProcessPoolExecutor, not multiprocessing.Pool: a worker that dies (OOM killer, a crash in
    # a codec) raises BrokenProcessPool here instead of hanging the conversion forever.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method),
                               initializer=_init_worker, initargs=(split_source, options, True))
    try:
        pending = deque()
        next_chunk = 0
        while next_chunk < len(chunks) or pending:
            while next_chunk < len(chunks) and len(pending) < workers * IN_FLIGHT_PER_WORKER:
                pending.append(pool.submit(_encode_range, chunks[next_chunk]))
                next_chunk += 1
            try:
                yield pending.popleft().result()
            except BrokenProcessPool as e:
                raise PrepareError("an encoding worker died (out of memory?); retry with "
                                   "fewer --workers or a smaller --max-side") from e
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _write_split(split_source, path: Path, options: PrepareOptions, workers: int,
                 progress) -> SplitResult:
    result = SplitResult()
    with BetonWriter(path, capacity=len(split_source)) as writer:
        index = 0
        for chunk in _encoded_chunks(split_source, options, workers):
            for item in chunk:
                if item[0] == "error":
                    _, name, reason = item
                    if options.on_error == "fail":
                        raise PrepareError(f"{name}: {reason} (use --on-error skip to skip "
                                           f"unreadable images)")
                    result.skipped.append((name, reason))
                else:
                    sample = item[1]
                    try:
                        writer.append(sample.mode, sample.height, sample.width, sample.payload,
                                      int(split_source.labels[index]))
                    except SampleTooLarge as e:
                        raise PrepareError(f"{split_source.name(index)}: {e}") from e
                    result.written += 1
                    result.mode_counts[fmt.MODE_NAMES[sample.mode]] += 1
                    result.pixel_sum += sample.pixel_sum
                    result.pixel_sq_sum += sample.pixel_sq_sum
                    result.pixel_count += sample.pixel_count
                index += 1
                progress.update(1)
    return result


def _pixel_stats(result: SplitResult) -> dict | None:
    if result.pixel_count == 0:
        return None
    mean = result.pixel_sum / result.pixel_count
    var = np.maximum(result.pixel_sq_sum / result.pixel_count - mean ** 2, 0.0)
    return {"mean": [round(float(v), 4) for v in mean],
            "std": [round(float(v), 4) for v in np.sqrt(var)]}


def prepare_dataset(source_path: str | os.PathLike, out: str | os.PathLike,
                    options: PrepareOptions = PrepareOptions()) -> dict:
    """Converts SOURCE into a prepared dataset at OUT; returns the dataset.json content."""
    from tqdm import tqdm
    from .sources import SourceError, detect_source, with_val_split

    out = Path(out).absolute()
    _check_options(options)
    try:
        check_output(out, Path(source_path).expanduser().absolute(), options.overwrite)
        source = detect_source(source_path, options.limits,
                               allow_outside_root=options.allow_outside_root)
        if options.val_fraction:
            source = with_val_split(source, options.val_fraction, seed=options.seed)
    except (SourceError, OutputFolderError) as e:
        raise PrepareError(str(e)) from e
    from ..host import available_ram
    from .worker_memory import memory_bound_workers
    workers, workers_note = memory_bound_workers(
        options.workers or len(os.sched_getaffinity(0)), source, available_ram())

    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(out)
    partial = partial_dir(out)
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    started = time.perf_counter()
    total = sum(len(s) for s in source.splits.values())
    try:
        results = {}
        with tqdm(total=total, unit="img", desc="prepare", disable=not options.progress,
                  file=sys.stderr, dynamic_ncols=True) as progress:
            for split, split_source in source.splits.items():
                progress.set_description(f"prepare {split}")
                results[split] = _write_split(split_source, partial / split_filename(split),
                                              options, workers, progress)
        info = _dataset_info(source, options, results, partial)
        skipped = [item for r in results.values() for item in r.skipped]
        if skipped:
            # One line per file, tab-separated: a name's own tabs, newlines and terminal
            # escapes are written as escapes, so no name can forge a row or drive a terminal.
            (partial / "skipped.txt").write_text(
                "".join(f"{printable(name)}\t{printable(reason)}\n" for name, reason in skipped),
                encoding="utf-8")
        (partial / DATASET_JSON).write_text(json.dumps(info, indent=2) + "\n")
        install(partial, out)
    except OutputFolderError as e:
        shutil.rmtree(partial, ignore_errors=True)
        raise PrepareError(str(e)) from e
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    info["seconds"] = time.perf_counter() - started
    info["workers"] = {"count": workers, "note": workers_note}  # for the CLI; not in dataset.json
    return info


def _check_options(options: PrepareOptions) -> None:
    if options.on_error not in ("fail", "skip"):
        raise PrepareError(f"--on-error must be fail or skip, not {options.on_error!r}")
    if options.encoding not in ("auto", "jpeg", "raw"):
        raise PrepareError(f"--encoding must be auto, jpeg or raw, not {options.encoding!r}")
    if not 1 <= options.quality <= 100:
        raise PrepareError(f"--quality must be in 1..100, not {options.quality}")
    if not 0 <= options.max_side <= fmt.MAX_IMAGE_SIDE:
        raise PrepareError(f"--max-side must be in 0..{fmt.MAX_IMAGE_SIDE} (0 keeps the size), "
                           f"not {options.max_side}")
    limits = options.limits
    if limits.max_file_bytes <= 0 or limits.max_array_bytes <= 0 or limits.max_inflate_ratio < 1:
        raise PrepareError("--max-file-mb and --max-array-mb must be positive and "
                           "--max-inflate-ratio at least 1")


def _dataset_info(source, options: PrepareOptions, results: dict, folder: Path) -> dict:
    splits = {}
    for split, r in results.items():
        path = folder / split_filename(split)
        splits[split] = {"file": path.name, "num_samples": r.written,
                         "skipped": len(r.skipped), "encodings": r.mode_counts,
                         "bytes": path.stat().st_size, "sha256": file_sha256(path)}
    if not any(r.written for r in results.values()):
        raise PrepareError(f"{source.path}: no image could be read (all were skipped)")
    stats_split = "train" if "train" in results else next(iter(results))
    stats = _pixel_stats(results[stats_split])
    if stats:
        stats["split"] = stats_split
    return {
        "format_version": DATASET_FORMAT_VERSION,
        "turbotrain_version": __version__,
        "classes": list(source.classes),
        "splits": splits,
        "pixel_stats": stats,
        "encoding": {"encoding": options.encoding, "max_side": options.max_side,
                     "quality": options.quality, "page_size": fmt.DEFAULT_PAGE_SIZE},
        "source": {"path": str(Path(source.path).absolute()), "kind": source.kind,
                   "fingerprint": source.fingerprint(), "val_fraction": options.val_fraction},
    }
