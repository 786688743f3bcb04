"""`turbotrain predict`: class names and probabilities for image files, from a trained model.

    turbotrain predict --run RUNDIR photos/                 # every image under a folder
    turbotrain predict --weights FILE a.jpg b.png --top-k 3 --out preds.csv
    turbotrain predict --run RUNDIR list.csv                # paths in a CSV/TSV (a label column
                                                            # may be there; it is not used)

Each image gets what `eval` gives the same image in a prepared split, through the same code:
`sample_codec.encode_sample` with prepare-dataset's defaults turns the file into what a .beton would
store (a JPEG that needs no change passes through byte for byte; other formats go through PIL,
EXIF-rotated; over 512 px it is downsized and re-encoded; <= 64 px it is stored raw), then the
`pytorch` pipeline's own `cpu_decode.BatchDecoder` (train=False) crops and resizes it: the
centre crop for photos, resize-only for images of at most 64 px. One difference, on purpose: a
split picks the small-image path only when all its images are that small, predict picks it per
image, so an image's prediction never depends on what else is in the folder (the two agree on
any split that does not mix <= 64 px images with larger ones). The size is the run's
evaluation resolution (the card's; `--eval-res` another) and the logits average the image's and
its mirror's where the run evaluated with flip TTA (`--tta` / `--no-tta` choose). A JPEG that passes through is
not strictly validated first (prepare-dataset does that, at ~0.4 ms an image): like the
pipeline, predict decodes what the file holds, and refuses it only if that fails.

Speed: as in the `pytorch` pipeline, threads read and encode the files, then decode and crop
each batch in one call into the compiled kernel (cpu_decode) while the main thread runs the model, with the trainer's split of the
cores between the two (device.plan_threads). bench/bench_predict.py measures it against the
eval pipeline on the same files (goal: >= 0.9x).

Files are untrusted input: each is read through `untrusted` (regular files only, at most 1 GiB;
a symlink out of a folder given is refused), and its size is checked from its header before
anything is decoded (layout.MAX_PIXELS). An unreadable file stops the command at the first one
with one line and exit code 2 (`--on-error fail`, the default, as prepare-dataset), or with
`--on-error skip` is named on stderr (`turbotrain predict: skipped PATH: reason`) and the rest
predicted (exit code 0; 2 when not one file could be read).

Output: a CSV (stdout, or --out FILE written atomically; an existing FILE is replaced only
with --overwrite): `path,class,prob` for the top class, then `class_2,prob_2` ... up to
`--top-k`; paths and class names escaped (printable.py), and one that would start a formula
in a spreadsheet (`=`, `+`, `-`, `@`) gets a leading `'` (OWASP's advice on CSV injection).
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from turbotrain.datasets.beton.layout import SMALL_IMAGE_MAX_SIDE
from turbotrain.datasets.sources.image_files import list_images
from turbotrain.files.safe_create import existing_refusal, replacing
from turbotrain.files.untrusted import UnsafeInput
from turbotrain.pipeline.base import PipelineOptions
from turbotrain.pipeline.cpu_decode import ONE_CV2_THREAD, BatchDecoder
from turbotrain.pipeline.pytorch import PREFETCH_PER_WORKER
from turbotrain.pipeline.transfer import to_device
from turbotrain.printable import printable, spreadsheet_cell

from ..errors import TrainError
from .inference import (LoadedModel, add_model_arguments, apply_thread_plan, at_least, describe,
                        load_model, run_command)

PROG = "turbotrain predict"
DEFAULT_TOP_K = 5
DEFAULT_BATCH = 64  # without a run; with one, the run's batch size (eval's too)
# What prepare-dataset stores by default (datasets/prepare/convert.py PrepareOptions): predict stores
# each file the same way, so it sees the pixels a prepared split would hold.
ENCODING, MAX_SIDE, QUALITY = "auto", 512, 90


def add_predict_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="IMAGES|FOLDER|CSV",
                        help="image files, folders (searched recursively) or CSV/TSV lists of "
                             "paths")
    add_model_arguments(parser)
    parser.add_argument("--top-k", type=at_least(1), default=DEFAULT_TOP_K, metavar="K",
                        help=f"classes per image, most probable first (default "
                             f"{DEFAULT_TOP_K}; at most the model's classes)")
    parser.add_argument("--out", metavar="FILE",
                        help="write the CSV here (default: stdout); an existing FILE is "
                             "refused unless --overwrite")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --out FILE")
    parser.add_argument("--batch-size", type=at_least(1), default=None, metavar="N",
                        help=f"images per batch (default: the run's, else {DEFAULT_BATCH})")
    parser.add_argument("--workers", type=at_least(0), default=None, metavar="N",
                        help="decode threads (default: train's thread budget)")
    parser.add_argument("--on-error", choices=("fail", "skip"), default="fail",
                        help="an unreadable file: fail (default) stops with exit code 2; skip "
                             "names it on stderr and goes on")
    parser.add_argument("--allow-outside-root", action="store_true",
                        help="follow symlinks and relative CSV rows that lead outside the "
                             "folder given (refused by default; a CSV's absolute paths are "
                             "read as written)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar (default: when stderr is a terminal)")


def run_predict(args: argparse.Namespace) -> int:
    return run_command(PROG, _run, args)


def _run(args: argparse.Namespace) -> int:
    if args.out and not args.overwrite and os.path.lexists(args.out):  # before any work
        raise TrainError(f"--out {existing_refusal(Path(args.out), '--overwrite')}")
    loaded = load_model(args, prog=PROG)
    inputs = Inputs([list_images(path, allow_outside_root=args.allow_outside_root)
                     for path in args.inputs])
    stdout = args.out is None
    say = (lambda line: print(printable(line), file=sys.stderr)) if stdout else \
        (lambda line: print(printable(line)))
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    with _csv_output(args.out, args.overwrite) as out:
        stats = predict(loaded, inputs, out, top_k=args.top_k, batch_size=args.batch_size,
                        workers=args.workers, skip=args.on_error == "skip", progress=progress)
    say(describe(loaded))
    say(f"predicted {stats.predicted:,} images in {stats.seconds:.1f} s "
        f"({stats.predicted / stats.seconds if stats.seconds > 0 else 0:,.0f} images/s)"
        + (f", skipped {stats.skipped:,}" if stats.skipped else "")
        + ("" if stdout else f"; wrote {args.out}"))
    return 0


class Inputs:
    """The files of several `list_images` results (FileSplits) as one numbered list."""

    def __init__(self, splits):
        self.splits = splits
        self.starts = np.cumsum([0] + [len(s) for s in splits])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _at(self, i: int):
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return self.splits[k], i - int(self.starts[k])

    def name(self, i: int) -> str:
        split, j = self._at(i)
        return split.name(j)

    def load(self, i: int) -> bytes:
        """The file's bytes (untrusted.read_regular: regular files only, size-capped)."""
        split, j = self._at(i)
        return split.load(j)


class StoredImages:
    """Encoded samples (sample_codec.EncodedSample) in the shape `BatchDecoder` reads a split in:
    modes/heights/widths, and `beton.payload(i)` / `beton.raw_image(i)`."""

    path = "predict"

    def __init__(self, samples):
        self.samples = samples
        self.beton = self
        self.modes = [s.mode for s in samples]
        self.heights = [s.height for s in samples]
        self.widths = [s.width for s in samples]
        self.labels = np.zeros(len(samples), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.samples)

    def payload(self, i: int):
        return self.samples[i].payload

    def raw_image(self, i: int) -> np.ndarray:
        s = self.samples[i]
        return np.frombuffer(s.payload, dtype=np.uint8).reshape(s.height, s.width, 3)

    def payload_addresses(self, indices) -> tuple[np.ndarray, np.ndarray, list]:
        """Where the decode kernel reads each payload, and the arrays that keep them alive."""
        views = [np.frombuffer(self.samples[int(i)].payload, dtype=np.uint8) for i in indices]
        return (np.array([v.ctypes.data for v in views], dtype=np.int64),
                np.array([v.size for v in views], dtype=np.int64), views)


@dataclass
class Batch:
    images: torch.Tensor           # uint8 (n, S, S, 3): the images that decoded, in order
    indices: list[int]             # their input numbers
    errors: list[tuple[int, str]]  # (input number, reason) of the ones that did not


def load_batch(inputs: Inputs, numbers: range, image_size: int) -> Batch:
    """Reads, stores (as prepare-dataset would) and decodes (as the eval pipeline does) the
    inputs `numbers`; runs in a decode thread."""
    # lazy: cv2 and PIL (+80 ms) load when images are read, not for `--help`
    from turbotrain.datasets.beton.sample_codec import ImageError, encode_sample
    samples, where, errors = [], [], []
    for i in numbers:
        try:
            sample = encode_sample(inputs.load(i), encoding=ENCODING, max_side=MAX_SIDE,
                                   quality=QUALITY, validate=False)
        except (ImageError, UnsafeInput) as exc:
            errors.append((i, str(exc)))
            continue
        except OSError as exc:
            errors.append((i, exc.strerror or str(exc)))
            continue
        samples.append(sample)
        where.append(i)
    images = torch.empty((len(samples), image_size, image_size, 3), dtype=torch.uint8)
    out = images.numpy()
    ok = np.zeros(len(samples), dtype=bool)
    small = [max(s.height, s.width) <= SMALL_IMAGE_MAX_SIDE for s in samples]
    for group in ([j for j, v in enumerate(small) if v], [j for j, v in enumerate(small) if not v]):
        if not group:
            continue
        # A decoder per group: BatchDecoder chooses the small-image path or the centre crop
        # from its split's sizes, here the group's (see the module docstring).
        # One native call per group (decode_all goes on past a bad image and names each).
        decoder = BatchDecoder(StoredImages([samples[j] for j in group]), image_size=image_size,
                               train=False, seed=0, crop_ratio=PipelineOptions.crop_ratio)
        whole = len(group) == len(samples)  # the usual case: straight into the batch
        slots = out if whole else np.empty((len(group), image_size, image_size, 3), np.uint8)
        failed = dict(decoder.decode_all(np.arange(len(group)), 0, slots))
        for row, j in enumerate(group):
            if row in failed:
                errors.append((where[j], failed[row]))
                continue
            if not whole:
                out[j] = slots[row]
            ok[j] = True
    errors.sort()
    if ok.all():  # the usual case: no copy (a 64 x 224 px batch is 9.6 MB, ~30 us an image)
        return Batch(images, where, errors)
    keep = np.flatnonzero(ok)
    return Batch(images[torch.from_numpy(keep)], [where[j] for j in keep], errors)


@dataclass
class Stats:
    predicted: int = 0
    skipped: int = 0
    seconds: float = 0.0


def batches(inputs: Inputs, *, batch_size: int, image_size: int, workers: int):
    """Batch after batch, in input order, decoded by `workers` threads ahead of the caller (two
    batches queued per thread, as the pytorch pipeline queues them)."""
    pending = iter(range(start, min(start + batch_size, len(inputs)))
                   for start in range(0, len(inputs), batch_size))
    in_flight: deque[Future] = deque()
    with ONE_CV2_THREAD, ThreadPoolExecutor(max(1, workers),
                                            thread_name_prefix="turbotrain-predict") as pool:
        def submit_next() -> None:
            numbers = next(pending, None)
            if numbers is not None:
                in_flight.append(pool.submit(load_batch, inputs, numbers, image_size))
        for _ in range(max(1, workers) * PREFETCH_PER_WORKER):
            submit_next()
        try:
            while in_flight:
                batch = in_flight.popleft().result()
                submit_next()
                yield batch
        finally:
            for future in in_flight:  # stopped early (an error, Ctrl-C)
                future.cancel()


def predict(loaded: LoadedModel, inputs: Inputs, out, *, top_k: int = DEFAULT_TOP_K,
            batch_size: int | None = None, workers: int | None = None, skip: bool = False,
            progress: bool = False) -> Stats:
    """Writes one CSV row per input that decodes to the text stream `out`; TrainError at the
    first unreadable input unless `skip` (then each is named on stderr)."""
    from tqdm import tqdm

    card = loaded.card
    k = min(top_k, card.num_classes)
    batch_size = batch_size or loaded.settings.get("batch_size") or DEFAULT_BATCH
    # The trainer's thread rule wants the split's JPEG share; here: the first batch's names.
    first = [inputs.name(i).lower() for i in range(min(len(inputs), batch_size))]
    jpeg_share = sum(n.endswith((".jpg", ".jpeg")) for n in first) / max(1, len(first))
    plan = apply_thread_plan(loaded.device, workers=workers, jpeg=jpeg_share > 0.1)
    names = [spreadsheet_cell(c) for c in card.classes]
    writer = csv.writer(out, lineterminator="\n")
    header = ["path", "class", "prob"] + [f"{what}_{r}" for r in range(2, k + 1)
                                          for what in ("class", "prob")]
    stats, started = Stats(), time.perf_counter()
    decoded = batches(inputs, batch_size=batch_size, image_size=loaded.input_size,
                      workers=plan.workers)

    def host_batches():
        for batch in decoded:
            for i, reason in batch.errors:
                if not skip:
                    raise TrainError(f"{inputs.name(i)}: {reason}"
                                     " (--on-error skip predicts the other files)")
                print(printable(f"{PROG}: skipped {inputs.name(i)}: {reason}"),
                      file=sys.stderr)
                stats.skipped += 1
            bar.update(len(batch.indices) + len(batch.errors))
            if batch.indices:
                yield batch.images, torch.tensor(batch.indices)

    with tqdm(total=len(inputs), unit="img", desc="predict", disable=not progress,
              file=sys.stderr) as bar:
        try:
            for images, numbers in to_device(host_batches(), loaded.device):
                probs = torch.softmax(loaded.logits(images).float(), dim=1)
                # A stable sort: of tied classes the first comes first, as eval's argmax.
                top = probs.sort(dim=1, descending=True, stable=True)
                values = top.values[:, :k].cpu().tolist()
                classes = top.indices[:, :k].cpu().tolist()
                if header:  # written with the first row: a failed run prints no CSV at all
                    writer.writerow(header)
                    header = None
                for i, row_p, row_c in zip(numbers.tolist(), values, classes):
                    writer.writerow([spreadsheet_cell(inputs.name(i))] + [
                        item for c, p in zip(row_c, row_p) for item in (names[c], f"{p:.6f}")])
                stats.predicted += len(values)
        finally:
            decoded.close()
    stats.seconds = time.perf_counter() - started
    if stats.predicted == 0:
        raise TrainError(f"none of the {len(inputs):,} input files could be read")
    return stats


class _csv_output:
    """stdout, or a new file beside `path` renamed onto it when everything went well
    (safe_create.replacing: nothing planted there is written through; without overwrite an
    existing path is refused, even one that appeared while predicting)."""

    def __init__(self, path: str | None, overwrite: bool):
        self.path = Path(path) if path else None
        self.overwrite = overwrite

    def __enter__(self):
        if self.path is None:
            return sys.stdout
        self.replacing = replacing(self.path, newline="", overwrite=self.overwrite)
        try:
            return self.replacing.__enter__()
        except OSError as exc:
            raise TrainError(f"--out {self.path}: cannot write it ({exc.strerror})") from None

    def __exit__(self, kind, value, traceback):
        if self.path is None:
            sys.stdout.flush()
            return False
        try:
            return self.replacing.__exit__(kind, value, traceback)
        except FileExistsError:
            raise TrainError(f"--out {existing_refusal(self.path, '--overwrite')}") from None
