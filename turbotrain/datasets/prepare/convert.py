"""`prepare-dataset SOURCE OUT`: converts a raw image dataset into `OUT/{train,val}.beton` plus
`OUT/dataset.json`; with `--shard-size`, each split into numbered shards (shard_plan.py); with
`--part i/N`, only part i's shards plus a manifest for `turbotrain merge` (parts.py, merge.py).

Encoding runs in a pool of worker processes (`--workers`, default all cores); the parent writes
the samples in source order, so the output is byte-identical whatever the worker count. The
whole dataset is built in a hidden sibling folder and renamed into place at the end: an
interrupted run (Ctrl-C, kill -9) never leaves anything that looks like a finished dataset.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import os
import shutil
import signal
import sys
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable

from turbotrain.datasets.beton import layout
from turbotrain.datasets.beton.dataset_json import DATASET_JSON
from turbotrain.datasets.beton.sample_codec import ImageError, encode_sample
from turbotrain.datasets.beton.split import file_sha256, split_filename
from turbotrain.datasets.beton.writer import BetonWriter, SampleTooLarge
from turbotrain.datasets.remote.urls import is_url
from turbotrain.datasets.sources.class_labels import chosen_classes, class_lines
from turbotrain.datasets.sources.detect import detect_source
from turbotrain.datasets.sources.hf import Columns
from turbotrain.datasets.sources.source import SourceError
from turbotrain.files.safe_create import make_fresh_dir, write_file
from turbotrain.files.untrusted import UnsafeInput
from turbotrain.held_setting import ONE_CV2_THREAD
from turbotrain.host import available_ram
from turbotrain.os_failure import MEMORY_ADVICE, memory_line

from .options import PrepareError, PrepareOptions, check_options
from .output_folder import (OutputFolderError, check_not_overlapping, check_output, install,
                            lock_output, partial_dir, remove_stale_partials)
from .part_status import finished_part
from .parts import (agreement, check_part_output, install_part, part_manifest, part_partial_dir,
                    part_shard_ids)
from .shard_plan import ShardPlanError, SplitPlan, plan_split
from .shard_results import ShardResult, dataset_info, encoding_facts, skipped_lines
from .split_order import shuffled_train, with_val_split
from .worker_memory import memory_bound_workers

# Samples per task sent to a worker: large enough that the pipe costs nothing (~1 % at 16 x
# 70 KB JPEGs), small enough to keep the progress bar live and memory bounded.
CHUNK = 16
# Tasks in flight per worker: bounds memory (workers * 4 * CHUNK encoded images) while the
# parent writes.
IN_FLIGHT_PER_WORKER = 4
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PROG = "prepare-dataset"


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


def _encode_range(task: tuple[tuple[int, int], list | None]) -> list:
    """Encodes samples [start, stop) of the worker's split: per sample either
    ("ok", EncodedSample) or ("error", name, reason). The task carries the samples' bytes
    when the split is read in order by the parent (SplitSource.in_order_only), else None."""
    (start, stop), payloads = task
    out = []
    for i in range(start, stop):
        name = _WORKER_SPLIT.name(i)
        try:
            source = _WORKER_SPLIT.load(i) if payloads is None else payloads[i - start]
            if isinstance(source, UnsafeInput):
                raise source
            sample = encode_sample(source, encoding=_WORKER_OPTIONS.encoding,
                                   max_side=_WORKER_OPTIONS.max_side,
                                   quality=_WORKER_OPTIONS.quality)
            out.append(("ok", sample))
        except (ImageError, UnsafeInput) as e:
            out.append(("error", name, str(e)))
        except OSError as e:
            out.append(("error", name, f"cannot read ({e.strerror or e})"))
        except MemoryError:
            # This image's decoded pixels did not fit: say which one, and under what limit
            # (--on-error skip then skips it, as an image we cannot read here).
            out.append(("error", name, memory_line("decoding it", MEMORY_ADVICE[PROG])))
    return out


# -- parent side -------------------------------------------------------------------------------
def _chunks(ranges: list[tuple[int, int]]):
    """CHUNK-sample tasks covering each [start, stop) range; none crosses a shard boundary."""
    return [(s, min(s + CHUNK, stop)) for start, stop in ranges for s in range(start, stop, CHUNK)]


def _tasks(split_source, chunks: list[tuple[int, int]]):
    """(bounds, payloads) per chunk: payloads None (the worker loads them), or, for a split
    read in order, the bytes the parent read. A source that fails mid-stream is a
    PrepareError."""
    if not split_source.in_order_only:
        yield from ((bounds, None) for bounds in chunks)
        return
    feed = split_source.read_in_order(chunks)
    for bounds in chunks:
        try:
            payloads = next(feed)
        except SourceError as e:
            raise PrepareError(str(e)) from e
        yield bounds, payloads


def _encoded_chunks(split_source, options: PrepareOptions, workers: int,
                    ranges: list[tuple[int, int]]):
    """Yields each chunk's results in source order, encoded by `workers` processes."""
    chunks = _chunks(ranges)
    tasks = _tasks(split_source, chunks)
    if workers <= 1:
        yield from _encoded_on_a_thread(split_source, options, tasks)
        return
    # fork: workers inherit the (possibly large, array-backed) source without pickling it.
    # ProcessPoolExecutor, not multiprocessing.Pool: a worker that dies (OOM killer, a crash in
    # a codec) raises BrokenProcessPool here instead of hanging the conversion forever.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    # One cv2 thread here before forking: a worker's own cv2.setNumThreads(1) hangs when it
    # inherits a live cv2 pool (held_setting.py), as after drawing images with cv2 beforehand.
    release_cv2 = ONE_CV2_THREAD.hold()
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method),
                               initializer=_init_worker, initargs=(split_source, options, True))
    broken = False
    try:
        pending = deque()
        next_chunk = 0
        while next_chunk < len(chunks) or pending:
            while next_chunk < len(chunks) and len(pending) < workers * IN_FLIGHT_PER_WORKER:
                pending.append(pool.submit(_encode_range, next(tasks)))
                next_chunk += 1
            try:
                yield pending.popleft().result()
            except BrokenProcessPool as e:
                broken = True
                raise PrepareError("an encoding worker died (out of memory?); retry with "
                                   "fewer --workers or a smaller --max-side") from e
    finally:
        # A broken pool has already terminated its workers; waiting on it can hang in
        # CPython 3.11 (joining its manager thread hung a test for 120 s in 1 of 3 suite runs)
        pool.shutdown(wait=not broken, cancel_futures=True)
        release_cv2()


def _encoded_on_a_thread(split_source, options: PrepareOptions, tasks):
    """--workers 1 (and each part of a Ray run, one CPU a task): the chunks are encoded on one
    thread while this one writes, since simplejpeg's decode, sha256 and the writes all release
    the GIL: writing in line left the core idle ~11 % of a 2,400-photo run (3.2 s wall, 2.9 s
    CPU)."""
    _init_worker(split_source, options)
    encoder = ThreadPoolExecutor(1, thread_name_prefix="turbotrain-encode")
    pending: deque = deque()
    try:
        for task in tasks:
            pending.append(encoder.submit(_encode_range, task))
            if len(pending) > IN_FLIGHT_PER_WORKER:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        encoder.shutdown(wait=True, cancel_futures=True)


def _write_shards(split: str, split_source, plan: SplitPlan, shard_ids: list[int],
                  folder: Path, options: PrepareOptions, workers: int,
                  progress) -> list[ShardResult]:
    """Writes shards `shard_ids` of one split into folder (one encoding pool for all of them)."""
    ranges = [(int(plan.bounds[k]), int(plan.bounds[k + 1])) for k in shard_ids]
    chunks = _encoded_chunks(split_source, options, workers, ranges)
    results = []
    try:
        for k, (start, stop) in zip(shard_ids, ranges):
            name = plan.file(k) if options.shard_size else split_filename(split)
            result = ShardResult(split, k, name)
            with BetonWriter(folder / name, capacity=stop - start) as writer:
                index = start
                while index < stop:  # chunks never cross a shard's end (_chunks)
                    for item in next(chunks):
                        _write_one(item, index, split_source, writer, result, options)
                        index += 1
                        progress.update(1)
            path = folder / name
            result.bytes, result.sha256 = path.stat().st_size, file_sha256(path)
            results.append(result)
    finally:
        chunks.close()  # shuts the encoding pool down now, not when the generator is collected
    return results


def _write_one(item, index: int, split_source, writer: BetonWriter, result: ShardResult,
               options: PrepareOptions) -> None:
    if item[0] == "error":
        _, name, reason = item
        if options.on_error == "fail":
            raise PrepareError(f"{name}: {reason} (use --on-error skip to skip unreadable "
                               f"images)")
        result.skipped.append((name, reason))
        return
    sample = item[1]
    try:
        writer.append(sample.mode, sample.height, sample.width, sample.payload,
                      int(split_source.labels[index]))
    except SampleTooLarge as e:
        raise PrepareError(f"{split_source.name(index)}: {e}") from e
    result.written += 1
    result.mode_counts[layout.MODE_NAMES[sample.mode]] += 1
    result.pixels.add_sample(sample.pixel_sum, sample.pixel_sq_sum, sample.pixel_count)


def prepare_dataset(source_path: str | os.PathLike, out: str | os.PathLike,
                    options: PrepareOptions = PrepareOptions(), *,
                    on_progress: Callable[[int], None] | None = None) -> dict:
    """Converts SOURCE into a prepared dataset at OUT; returns the dataset.json content (with
    --part: the part manifest's content, and OUT gets no dataset.json until `merge`; its
    "skipped_as_done" is True when the part was already done with the same inputs).
    `on_progress(n)` is told of every n images written (the Ray engine's progress)."""

    check_out_is_local(out)
    out = Path(out).absolute()
    check_options(options)
    try:  # OUT's checks below hold until the end: no other prepare-dataset writes it meanwhile
        # (not even the lock file goes into a SOURCE that holds OUT)
        check_not_overlapping(out, Path(source_path).expanduser().absolute())
        lock = lock_output(out, options.part)
    except OutputFolderError as e:
        raise PrepareError(str(e)) from e
    with lock:
        return _prepare_locked(source_path, out, options, on_progress)


def check_out_is_local(out) -> None:
    """OUT is a folder (local or shared); Path() would turn s3://b/x into a local ./s3:/b/x."""
    if is_url(str(out)):
        raise PrepareError(f"{out}: OUT must be a folder every writer can reach (local or a shared "
                           f"filesystem); the remote layer only reads object storage: prepare "
                           f"into a folder, then upload it (docs/PREPARE_AT_SCALE.md)")


def _prepare_locked(source_path, out: Path, options: PrepareOptions, on_progress) -> dict:
    try:
        if options.part is None:
            check_output(out, Path(source_path).expanduser().absolute(), options.overwrite)
        else:
            check_part_output(out, Path(source_path).expanduser().absolute())
    except OutputFolderError as e:
        raise PrepareError(str(e)) from e
    source, plans = plan_source(source_path, options)
    workers, workers_note = memory_bound_workers(
        options.workers or len(os.sched_getaffinity(0)), source, available_ram())
    started = time.perf_counter()
    if options.part is None:
        info = _prepare_whole(source, out, plans, options, workers, on_progress)
    else:
        info = _prepare_part(source, out, plans, options, workers, on_progress)
    info["seconds"] = time.perf_counter() - started
    info["workers"] = {"count": workers, "note": workers_note}  # for the CLI; not in dataset.json
    info["class_lines"] = class_lines(source)  # for the CLI too
    return info


def plan_source(source_path, options: PrepareOptions) -> tuple:
    """(source, {split: SplitPlan}): SOURCE read as the conversion reads it (val carve, the
    stored train order) and cut into shards; a PrepareError names what is wrong with it."""
    try:
        source = detect_source(source_path, options.limits,
                               allow_outside_root=options.allow_outside_root,
                               columns=Columns(options.image_column, options.label_column))
        if options.val_fraction:
            source = with_val_split(source, options.val_fraction, seed=options.seed)
        if options.shard_size is not None:  # shards of mixed classes (shuffled_train)
            source = shuffled_train(source, seed=options.seed)
        # Last: the val carve and the train order above are the same whatever --classes.
        source = chosen_classes(source, options.classes)
        plans = {split: plan_split(split, s, options.shard_size)
                 for split, s in source.splits.items()}
    except (SourceError, OutputFolderError, ShardPlanError) as e:
        raise PrepareError(str(e)) from e
    return source, plans


def _prepare_whole(source, out: Path, plans: dict, options: PrepareOptions,
                   workers: int, on_progress) -> dict:
    """Every shard, built in a hidden sibling folder and renamed into place at the end."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(out)
    partial = make_fresh_dir(partial_dir(out))
    with _removed_on_failure(partial):
        ids = {split: list(range(plan.num_shards)) for split, plan in plans.items()}
        results = _write_all(source, plans, ids, partial, options, workers, on_progress)
        info = dataset_info(source_facts(source, options), encoding_facts(options,
                            options.shard_size), results, sharded=options.shard_size is not None)
        if info is None:
            raise PrepareError(f"{source.path}: no image could be read (all were skipped)")
        if any(r.skipped for r in results):
            write_file(partial / "skipped.txt", skipped_lines(results))
        write_file(partial / DATASET_JSON, json.dumps(info, indent=2) + "\n")
        install(partial, out, options.overwrite)
    return info


def _prepare_part(source, out: Path, plans: dict, options: PrepareOptions,
                  workers: int, on_progress) -> dict:
    """Part i's shards, written in a hidden folder inside OUT, then moved in beside the other
    parts' shards; the part manifest, written last, is what says the part is finished. A part
    already done with the same inputs is skipped (part_status.finished_part)."""
    part, parts = options.part
    facts, encoding = source_facts(source, options), encoding_facts(options, options.shard_size)
    try:
        done = finished_part(out, options.part, agreement(facts, encoding, options, plans, parts),
                             options.overwrite)
    except OutputFolderError as e:
        raise PrepareError(str(e)) from e
    if done is not None:
        return {**done, "skipped_as_done": True}
    ids = part_shard_ids(plans, part, parts)
    partial = part_partial_dir(out, part, parts)
    with _removed_on_failure(partial):
        results = _write_all(source, plans, ids, partial, options, workers, on_progress)
        manifest = part_manifest(facts, encoding, options, plans, results)
        install_part(partial, out, results, manifest, options.part)
    return manifest


@contextlib.contextmanager
def _removed_on_failure(partial: Path):
    """A conversion that fails (or is interrupted) leaves no hidden folder behind; a refusal
    about the output folder becomes a PrepareError."""
    try:
        yield
    except OutputFolderError as e:
        shutil.rmtree(partial, ignore_errors=True)
        raise PrepareError(str(e)) from e
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _write_all(source, plans: dict, ids: dict[str, list[int]], folder: Path,
               options: PrepareOptions, workers: int, on_progress) -> list[ShardResult]:
    from tqdm import tqdm
    total = sum(int(plans[split].bounds[k + 1] - plans[split].bounds[k])
                for split, shard_ids in ids.items() for k in shard_ids)
    results = []
    with tqdm(total=total, unit="img", desc="prepare", disable=not options.progress,
              file=sys.stderr, dynamic_ncols=True) as bar:
        progress = bar if on_progress is None else _Told(bar, on_progress)
        for split, split_source in source.splits.items():
            if ids.get(split):
                progress.set_description(f"prepare {split}")
                results += _write_shards(split, split_source, plans[split], ids[split], folder,
                                         options, workers, progress)
    _add_passed_over(results, source)
    return results


def _add_passed_over(results: list[ShardResult], source) -> None:
    """The files the listing passed over (Source.passed_over) are skipped files of the first
    split's first shard, whichever part writes it: so skipped.txt, the split's `skipped` count
    and a --part run's merge list them once, beside the images that could not be read."""
    first = next(iter(source.splits), None)
    for result in results:
        if result.split == first and result.index == 0:
            result.skipped[:0] = source.passed_over


class _Told:
    """A progress bar whose updates on_progress is told of too."""

    def __init__(self, bar, on_progress: Callable[[int], None]):
        self.bar, self.on_progress = bar, on_progress

    def update(self, n: int) -> None:
        self.bar.update(n)
        self.on_progress(n)

    def set_description(self, text: str) -> None:
        self.bar.set_description(text)


def source_facts(source, options: PrepareOptions) -> dict:
    """What dataset.json says of the source (a part manifest carries it to `merge`)."""
    facts = {"classes": list(source.classes), "path": str(Path(source.path).absolute()),
             "kind": source.kind, "fingerprint": source.fingerprint(),
             "val_fraction": options.val_fraction}
    if options.classes == "present":  # the names --classes present left out (maybe none)
        facts["dropped_classes"] = list(source.dropped_classes)
    return facts
