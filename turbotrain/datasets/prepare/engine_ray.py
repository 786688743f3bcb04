"""`prepare-dataset SOURCE OUT --shard-size S --engine ray [--parts N] [--address ADDR]`: the
parts of a `--part i/N` conversion run as Ray tasks, then `merge`.

The driver (this process) reads SOURCE once to plan the shards, refuses in one line a part in
OUT done with other inputs (part_status.py), and submits one task a part, done ones included:
each runs `prepare_dataset(..., part=(i, N), workers=1)` on a worker of the cluster, one CPU
each, so Ray puts as many parts side by side as there are cores. A part already done with the
same inputs (by an earlier run, or by hand with --part) is skipped once its task has checked
its shards' sha256 against its manifest, and redone if one differs. A task that dies with its
worker or node (SIGKILL, OOM killer, a lost machine) is run again by Ray (`max_retries`): the
part's own idempotence makes that safe (an interrupted part leaves no manifest, and its hidden
folder is removed by the next try). When every part is in, `merge` checks the manifests and the
shards' sizes, reading no shard (each one was hashed by the task that wrote or checked it, in
parallel on the nodes), and writes dataset.json: the folder is byte-identical to
`prepare-dataset SOURCE OUT --shard-size S` on one machine (the shard plan does not depend on
N, each shard is written by the same code in source order, and merge builds dataset.json from
the manifests as one machine would).

Every node must see SOURCE and OUT at the same paths (a shared filesystem) and have turbotrain
installed. Ray is optional (`pip install 'turbotrain[ray]'`); this module imports it only when
the engine runs.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import socket
import threading
import time
from pathlib import Path

from turbotrain.datasets.sources.class_labels import class_lines

from .convert import check_out_is_local, plan_source, prepare_dataset, source_facts
from .merge import MergeError, check_checksums, merge
from .options import PrepareError, PrepareOptions, check_options
from .output_folder import OutputFolderError, check_not_overlapping, lock_output
from .part_status import finished_part, part_counts
from .parts import PARTS_DIR, agreement, check_part_output, part_shard_ids
from .shard_results import ShardResult, encoding_facts

INSTALL_HINT = "--engine ray needs Ray: pip install 'turbotrain[ray]'"
# Ray re-runs a task whose worker or node died this many times (then the part is one line).
MAX_RETRIES = 3
# Parts per CPU of the cluster when --parts is not given: a few per core, so a retried part
# costs a small share of the run and the last parts end close together; each part reads the
# source's listing once, so not one per shard either.
PARTS_PER_CPU = 4
# How often a task tells the driver how many images it wrote, and the driver redraws.
REPORT_SECONDS = 0.25
# How long the driver waits for --address to accept a TCP connection. ray.init itself retries
# an address nothing listens at without end (Ray 2.60: three warnings every ~35 s, still at it
# after 10 min), so the driver knocks first.
CONNECT_SECONDS = 10


def import_ray():
    try:
        import ray
    except ImportError:
        raise PrepareError(INSTALL_HINT) from None
    return ray


@dataclasses.dataclass
class EngineRun:
    """What the driver did: parts in all, found done (their shards' sha256 checked by their
    tasks), run now; its seconds."""
    parts: int
    skipped: int = 0
    ran: int = 0
    seconds: float = 0.0       # planning, the parts and the merge
    part_seconds: float = 0.0  # from the first task submitted to the last part in
    class_lines: list[str] = dataclasses.field(default_factory=list)  # sources/class_labels.py

    @property
    def parts_per_second(self) -> float:
        return self.ran / self.part_seconds if self.part_seconds else 0.0


def prepare_with_ray(source_path: str | os.PathLike, out: str | os.PathLike,
                     options: PrepareOptions, *, parts: int | None = None,
                     address: str | None = None) -> tuple[dict, EngineRun]:
    """Runs the conversion's parts on a Ray cluster (`address`; None: the one this process is
    connected to, else a local one on this machine's cores), then merges; returns
    (dataset.json's content, what the driver did)."""
    started = time.perf_counter()
    check_out_is_local(out)
    if options.shard_size is None:
        raise PrepareError("--engine ray needs --shard-size: parts are made of whole shards "
                           "(e.g. --shard-size 1GB --engine ray)")
    if options.part is not None:
        raise PrepareError("--engine ray runs every part itself: leave --part out (or run "
                           "--part i/N without --engine)")
    if parts is not None and parts < 1:
        raise PrepareError(f"--parts must be at least 1, not {parts}")
    ray = import_ray()
    out = Path(out).absolute()
    check_options(options)
    source_abs = Path(source_path).expanduser().absolute()
    try:  # no second driver into the same OUT meanwhile (each part also locks itself)
        check_not_overlapping(out, source_abs)
        lock = lock_output(out, None)
    except OutputFolderError as e:
        raise PrepareError(str(e)) from e
    with lock:
        try:
            check_part_output(out, source_abs)
        except OutputFolderError as e:
            raise PrepareError(str(e)) from e
        source, plans = plan_source(source_path, options)
        owned = _connect(ray, address)
        try:
            if parts is None:
                cpus = int(ray.cluster_resources().get("CPU", 1))
                parts = max(1, min(sum(p.num_shards for p in plans.values()),
                                   PARTS_PER_CPU * cpus))
            run = EngineRun(parts, class_lines=class_lines(source))
            _check_part_count(out, parts)
            images = _part_images(out, source, plans, options, parts)
            # The tasks get SOURCE's absolute path: a worker does not start in this folder.
            _run_parts(ray, source_abs, out, options, images, run)
        finally:
            if owned:
                ray.shutdown()
        try:  # each task checked its part's shards' sha256 (run_part): merge reads none
            info = merge(out, hash_shards=False)
        except MergeError as e:
            raise PrepareError(str(e)) from e
    run.seconds = time.perf_counter() - started
    return info, run


def _connect(ray, address: str | None) -> bool:
    """Connects to the cluster; True when this call started (and so must stop) it."""
    if ray.is_initialized():
        return False
    if address is not None:
        _knock(address)
    main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(address=address, include_dashboard=False, configure_logging=False,
                 log_to_driver=False)
    except (ConnectionError, ValueError, RuntimeError) as e:
        where = f"--address {address}" if address else "a local Ray cluster"
        raise PrepareError(f"{where}: cannot connect ({' '.join(str(e).split())[:200]}); start "
                           f"one with `ray start --head` on the head node, or leave --address "
                           f"out to run on this machine") from None
    finally:
        # ray.init puts Ray's own SIGTERM handler in (a stack dump, exit status 15): the
        # caller's goes back (the CLI's: `kill` cancels the parts, stops the cluster and says
        # so in one line, as Ctrl-C does).
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
    return True


def _knock(address: str) -> None:
    """One line, within CONNECT_SECONDS, when nothing accepts a connection at --address
    HOST:PORT (or ray://HOST:PORT); other forms ("auto") are left to Ray."""
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), CONNECT_SECONDS).close()
    except (OSError, OverflowError) as e:  # OverflowError: a port over 65535
        why = f"no answer in {CONNECT_SECONDS} s" if isinstance(e, TimeoutError) else \
            getattr(e, "strerror", None) or str(e)
        raise PrepareError(f"--address {address}: no Ray cluster there ({why}); start one with "
                           f"`ray start --head` on the head node and pass the address it "
                           f"prints, or leave --address out to run on this machine") from None


def _check_part_count(out: Path, parts: int) -> None:
    other = [n for n in part_counts(out) if n != parts]
    if other:
        raise PrepareError(f"{out / PARTS_DIR} holds parts of a {other[0]}-part run; pass "
                           f"--parts {other[0]} to finish it, or choose another OUT")


def _part_images(out: Path, source, plans: dict, options: PrepareOptions,
                 parts: int) -> dict[int, int]:
    """Every part's image count; a PrepareError, before any task starts, when a part in OUT
    is done with other inputs (each task decides again whether its part is done)."""
    facts, encoding = source_facts(source, options), encoding_facts(options, options.shard_size)
    agreed = agreement(facts, encoding, options, plans, parts)
    images = {}
    for k in range(parts):
        ids = part_shard_ids(plans, k, parts)
        images[k] = sum(int(plans[split].bounds[i + 1] - plans[split].bounds[i])
                        for split, shard_ids in ids.items() for i in shard_ids)
        try:
            finished_part(out, (k, parts), agreed, options.overwrite)
        except OutputFolderError as e:
            raise PrepareError(str(e)) from e
    return images


def _run_parts(ray, source_path, out: Path, options: PrepareOptions, images: dict[int, int],
               run: EngineRun) -> None:
    """One task a part, done ones included (they check their shards' checksums, in parallel
    on the nodes, instead of merge reading every shard on this one)."""
    from tqdm import tqdm
    board = ray.remote(num_cpus=0)(ProgressBoard).remote()
    task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)(run_part)
    started = time.perf_counter()
    pending = {}
    for k in images:
        part_options = dataclasses.replace(options, part=(k, run.parts), workers=1,
                                           progress=False)
        pending[task.remote(str(source_path), str(out), part_options, board)] = k
    skipped_images = 0  # of the parts found done: not written again, so never on the board
    bars = dict(disable=not options.progress, dynamic_ncols=True, leave=True)
    with tqdm(total=run.parts, desc="parts", unit="part", position=0, **bars) as parts_bar, \
            tqdm(total=sum(images.values()), desc="images", unit="img", position=1,
                 **bars) as images_bar:
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=REPORT_SECONDS)
                for ref in ready:
                    part = pending.pop(ref)
                    result = _result(ray, ref, part, run.parts)
                    run.ran += not result["skipped"]
                    run.skipped += result["skipped"]
                    skipped_images += images[part] if result["skipped"] else 0
                    parts_bar.update(1)
                if options.progress:
                    written = ray.get(board.total.remote(), timeout=60)
                    images_bar.update(skipped_images + written - images_bar.n)
        except BaseException:  # a failed part, Ctrl-C: the others stop; done parts stay done
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
    run.part_seconds = time.perf_counter() - started


def _result(ray, ref, part: int, parts: int) -> dict:
    try:
        result = ray.get(ref)
    except ray.exceptions.RayError as e:
        reason = type(e).__name__
        raise PrepareError(f"part {part}/{parts}: its Ray task failed {MAX_RETRIES + 1} times "
                           f"({reason}: a worker or node died, out of memory?); run the same "
                           f"command again: done parts are skipped") from None
    if "error" in result:
        raise PrepareError(f"part {part}/{parts}: {result['error']}")
    return result


def run_part(source_path: str, out: str, options: PrepareOptions, board) -> dict:
    """One Ray task: part options.part of the conversion, its images told to `board`. A part
    found done has its shards' sha256 checked against its manifest, and is redone if one
    differs. A PrepareError comes back as a value (raised by the driver in one line, not
    retried)."""
    part = options.part[0]
    teller = _Teller(board, part)
    try:
        manifest = prepare_dataset(source_path, out, options, on_progress=teller)
        skipped = bool(manifest.get("skipped_as_done"))
        if skipped and not _checksums_hold(Path(out), manifest, options.part):
            manifest = prepare_dataset(source_path, out, dataclasses.replace(
                options, overwrite=True), on_progress=teller)
            skipped = False
    except PrepareError as e:
        return {"part": part, "error": str(e)}
    teller.flush()
    return {"part": part, "skipped": skipped}


def _checksums_hold(out: Path, manifest: dict, part: tuple[int, int]) -> bool:
    results = [ShardResult.from_json(entry) for entry in manifest["shards"]]
    try:
        check_checksums(out, results, {r.file: f"{part[0]}/{part[1]}" for r in results})
    except MergeError:
        return False
    return True


class ProgressBoard:
    """A Ray actor: images written so far, per part. A retried part starts again from 0."""

    def __init__(self):
        self.images: dict[int, int] = {}

    def set(self, part: int, images: int) -> None:
        self.images[part] = images

    def total(self) -> int:
        return sum(self.images.values())


class _Teller:
    """Tells the board a part's image count at most every REPORT_SECONDS (one actor call
    costs ~0.1 ms: per image it would be a measurable share of small images)."""

    def __init__(self, board, part: int):
        self.board, self.part, self.count, self.last = board, part, 0, time.monotonic()
        board.set.remote(part, 0)

    def __call__(self, n: int) -> None:
        self.count += n
        if time.monotonic() - self.last >= REPORT_SECONDS:
            self.flush()

    def flush(self) -> None:
        self.board.set.remote(self.part, self.count)
        self.last = time.monotonic()
