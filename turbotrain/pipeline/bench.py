"""`turbotrain bench`: steady-state images/s of pipelines side by side, plus the bare-decode limit.

    turbotrain bench --data OUT [--split train] [--pipeline P ...] [--image-size 224]
                     [--batch-size 64] [--batches 50] [--warmup 5] [--workers W] [--json]

Each named pipeline is built for training (RandomResizedCrop + flip, or pad-crop + flip for
small images), iterated for `--warmup` batches (worker start-up, page cache, allocator), then
timed over `--batches` batches, across epoch boundaries if needed; on CUDA the clock stops after
a synchronize. The "bare decode" line is the physical limit of a CPU pipeline on the same bytes
and cores: simplejpeg full decodes (raw samples: a copy) of the stored samples, no crop, resize,
flip or batching, on `--workers` threads (simplejpeg releases the GIL, so threads scale), with
the decode options the `pytorch` pipeline uses (cpu_decode.DECODE_OPTIONS).

``--json`` prints ``{"<pipeline>": {"images_per_second": ...}, ..., "bare_decode": {...}}``;
a pipeline that cannot run here has ``"images_per_second": null`` and an ``"error"``.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time

import numpy as np

from turbotrain.arg_parser import CommandParser
from turbotrain.datasets import DatasetError, open_dataset
from turbotrain.datasets.beton.layout import MODE_JPEG

from .base import PipelineError
from .cpu_decode import DECODE_OPTIONS
from .registry import build_pipeline, pipeline_names
from .workers import choose_workers

BARE_DECODE = "bare_decode"


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    names = pipeline_names()
    parser.add_argument("--data", required=True, help="prepared dataset folder (or a .beton)")
    parser.add_argument("--split", default="train", help="split to read (default: train)")
    parser.add_argument("--pipeline", nargs="+", choices=names, default=None, metavar="P",
                        help=f"pipelines to measure (default: all of {', '.join(names)})")
    parser.add_argument("--image-size", type=int, default=224, help="output side (default 224)")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    parser.add_argument("--batches", type=int, default=50, help="timed batches (default 50)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed batches first (default 5)")
    parser.add_argument("--workers", type=int, default=None,
                        help="decode workers/threads (default: from the cores available)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--order", choices=("random", "quasi-random"), default="random",
                        help="training sample order (train --order; default: random)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def steady_rate(pipeline, *, warmup: int, batches: int, device) -> float:
    """Images/s over `batches` batches after `warmup` untimed ones, crossing epochs as needed."""
    import torch
    if len(pipeline) == 0:
        raise ValueError("the split has fewer samples than one batch")
    stream = endless(pipeline)
    try:
        for _ in range(warmup):
            next(stream)
        _synchronize(torch, device)
        started = time.perf_counter()
        images = sum(len(next(stream)[0]) for _ in range(batches))
        _synchronize(torch, device)
        return images / (time.perf_counter() - started)
    finally:
        stream.close()


def endless(pipeline):
    """The pipeline's batches, epoch after epoch, forever (for steady-state timing)."""
    epoch = 0
    while True:
        pipeline.set_epoch(epoch)
        yield from pipeline
        epoch += 1


def _synchronize(torch, device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def bare_decode_rate(dataset, *, samples: int, threads: int, rounds: int = 2) -> float:
    """Images/s of plain simplejpeg decodes (raw: copies) of the first `samples` stored samples
    on `threads` threads, each with its own preallocated output; best of `rounds` (the first
    also warms the page cache)."""
    import simplejpeg
    count = min(samples, len(dataset))
    heights = np.asarray(dataset.heights[:count], dtype=np.int64)
    widths = np.asarray(dataset.widths[:count], dtype=np.int64)
    modes = np.asarray(dataset.modes[:count])
    largest = int((heights * widths).max()) * 3

    def work(start: int, errors: list) -> None:
        buffer = np.empty(largest, dtype=np.uint8)
        try:
            for i in range(start, count, threads):
                payload = dataset.payload(i)  # by global index: any shard
                if modes[i] == MODE_JPEG:
                    simplejpeg.decode_jpeg(payload, colorspace="rgb", buffer=buffer,
                                           **DECODE_OPTIONS)
                else:
                    np.copyto(buffer[:payload.size], payload)
        except ValueError as e:  # a corrupt sample: report it instead of a misleading rate
            errors.append(f"sample {i}: {e}")

    best = 0.0
    for _ in range(rounds):
        errors: list[str] = []
        pool = [threading.Thread(target=work, args=(t, errors)) for t in range(threads)]
        started = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        elapsed = time.perf_counter() - started
        if errors:
            raise ValueError(f"{dataset.path}: bare decode failed at {errors[0]}")
        best = max(best, count / elapsed)
    return best


def measure(dataset, names: list[str], *, image_size: int, batch_size: int, batches: int,
            warmup: int, workers: int | None, device, seed: int = 0,
            order: str = "random") -> dict:
    """{name: {"images_per_second": float | None[, "error": str]}} for each pipeline, then
    BARE_DECODE."""
    import torch
    threads, _ = choose_workers(workers, "cpu")
    results: dict[str, dict] = {}
    for name in names:
        try:
            pipeline = build_pipeline(name, dataset, train=True, batch_size=batch_size,
                                      image_size=image_size, device=torch.device(device),
                                      seed=seed, workers=workers, order=order)
        except PipelineError as e:
            results[name] = {"images_per_second": None, "error": str(e)}
            continue
        try:
            rate = steady_rate(pipeline, warmup=warmup, batches=batches, device=device)
            results[name] = {"images_per_second": rate}
        except (PipelineError, ValueError) as e:
            results[name] = {"images_per_second": None, "error": str(e)}
        finally:
            pipeline.close()
    samples = (warmup + batches) * batch_size
    results[BARE_DECODE] = {"images_per_second": bare_decode_rate(
        dataset, samples=samples, threads=max(1, threads))}
    return results


def format_table(results: dict) -> str:
    bare = results.get(BARE_DECODE, {}).get("images_per_second")
    lines = [f"{'pipeline':<14} {'images/s':>10} {'of bare decode':>15}"]
    for name, result in results.items():
        rate = result.get("images_per_second")
        if rate is None:
            lines.append(f"{name:<14} {'-':>10}   unavailable: {result.get('error', '')}")
            continue
        share = f"{rate / bare:.0%}" if bare and name != BARE_DECODE else ""
        lines.append(f"{name:<14} {rate:>10,.0f} {share:>15}")
    return "\n".join(lines)


def run_bench(args: argparse.Namespace) -> int:
    import torch
    logging.basicConfig(level=logging.WARNING)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    workers = args.workers
    # Pipelines parallelise in their own decode threads; torch's intra-op pool would only add
    # fork-join overhead to the small per-batch ops (a resident CIFAR batch: 0.2 ms on one
    # thread, often 10x that with 2 threads when another process holds a core).
    torch.set_num_threads(1)
    if min(args.batch_size, args.batches, args.image_size) < 1 or args.warmup < 0:
        print("turbotrain bench: error: --batch-size, --batches and --image-size must be >= 1",
              file=sys.stderr)
        return 2
    try:  # a --data that is no prepared dataset is the user's to fix: status 2, as in train
        dataset = open_dataset(args.data, args.split)
    except DatasetError as e:
        print(f"turbotrain bench: error: {e}", file=sys.stderr)
        return 2
    try:
        results = measure(dataset, args.pipeline or pipeline_names(),
                          image_size=args.image_size, batch_size=args.batch_size,
                          batches=args.batches, warmup=args.warmup, workers=workers,
                          device=device, seed=args.seed,
                          order=getattr(args, "order", "random"))
    except (DatasetError, ValueError) as e:
        print(f"turbotrain bench: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"{args.data} [{args.split}]: {len(dataset)} images, batch {args.batch_size}, "
              f"{args.image_size} px, {args.batches} timed batches after {args.warmup}, "
              f"device {device}")
        print(format_table(results))
    if not any(result.get("images_per_second") for name, result in results.items()
               if name != BARE_DECODE):
        print("turbotrain bench: error: no requested pipeline could run on this data (each one's "
              "reason is in the output); a --batch-size larger than the split is the usual cause",
              file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="turbotrain bench", description=__doc__.split("\n")[0])
    add_bench_arguments(parser)
    return run_bench(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
