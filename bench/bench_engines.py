"""Our `dali` (CPU) and `ffcv` pipelines next to `pytorch`, on the same prepared file.

    .venv/bin/python bench/bench_engines.py [--images 3000] [--batches 100] [--rounds 3]

Same data as bench_pipelines.py (cached under bench/.cache/): `--images` photo-like 500x375 q90
JPEGs prepared with `prepare-dataset`'s default options. Every contender is built through the
pipeline registry exactly as the trainer builds it (train: RandomResizedCrop 224 + flip from the
shared boxes, uint8 NCHW channels_last out), batch 64, 2 threads, and timed by
`turbotrain.pipeline.bench.steady_rate` (what `turbotrain bench` reports): `--warmup` untimed
batches, then `--batches` timed ones across epoch boundaries. Each run is a fresh process (DALI
and FFCV keep threads and compiled state); contenders are interleaved over `--rounds` and the
best round counts, because the machine is shared (the load average of every run is recorded).

`dali_own_crop` is `dali` with DALI's own ``decoders.image_random_crop`` instead of the shared
boxes: what feeding our boxes costs (or saves). Writes bench/results/engines.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "engines.json"
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

WORKERS = 2  # both cores of the build machine, for every contender
CONTENDERS = {
    "pytorch": "turbotrain pytorch pipeline (simplejpeg + cv2 in 2 threads)",
    "dali": "turbotrain dali pipeline, CPU-only: external_source + image_slice (shared boxes) "
            "+ resize + flip",
    "dali_own_crop": "the same with DALI's own image_random_crop (its RNG)",
    "ffcv": "turbotrain ffcv pipeline: FFCV Loader, shared-box decoder, 2 numba threads",
}


def dataset_folder(images: int) -> Path:
    from bench_pipelines import photo_folder, prepared  # the lead's cache, shared on purpose
    return prepared(photo_folder(images), f"photos-{images // 10}")


def child(name: str, data: str, args) -> float:
    """Images/s of one contender (runs in a fresh process)."""
    import torch
    from turbotrain.datasets import open_dataset
    from turbotrain.pipeline import PipelineOptions, build_pipeline
    from turbotrain.pipeline.bench import steady_rate
    torch.set_num_threads(1)  # as `turbotrain bench`: the loaders have their own threads
    dataset = open_dataset(data, "train")
    options = dict(train=True, batch_size=args.batch_size, image_size=args.image_size,
                   device=torch.device("cpu"), seed=0, workers=WORKERS)
    if name == "dali_own_crop":
        from turbotrain.pipeline.dali import DaliPipeline
        from turbotrain.pipeline.dali_graph import CROP_DALI
        pipeline = DaliPipeline(dataset, PipelineOptions(**options), crop=CROP_DALI)
    else:
        pipeline = build_pipeline(name, dataset, **options)
    try:
        return steady_rate(pipeline, warmup=args.warmup, batches=args.batches, device="cpu")
    finally:
        pipeline.close()


def run_child(name: str, data: Path, args) -> dict:
    command = [sys.executable, __file__, "--child", name, "--data", str(data),
               "--batches", str(args.batches), "--warmup", str(args.warmup),
               "--batch-size", str(args.batch_size), "--image-size", str(args.image_size)]
    load = os.getloadavg()[0]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode:
        return {"images_per_second": None, "load": load, "error": done.stderr.strip()[-500:]}
    return {"images_per_second": float(done.stdout.strip().splitlines()[-1]), "load": load}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=sorted(CONTENDERS), default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(child(args.child, args.data, args))
        return 0

    data = dataset_folder(args.images)
    names = args.only or list(CONTENDERS)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        for name in names:
            runs[name].append(run_child(name, data, args))
            print(f"round {round_ + 1} {name}: {runs[name][-1]}", flush=True)
    results = {}
    for name in names:
        rates = [r["images_per_second"] for r in runs[name] if r["images_per_second"]]
        results[name] = {"images_per_second": max(rates) if rates else None,
                         "what": CONTENDERS[name], "runs": runs[name]}
    base = results.get("pytorch", {}).get("images_per_second")
    print(f"\n{data}: {args.images} images, batch {args.batch_size}, {args.image_size} px, "
          f"{WORKERS} threads, best of {args.rounds} rounds")
    print(f"{'pipeline':<15} {'images/s':>9} {'vs pytorch':>11}")
    for name, result in results.items():
        rate = result["images_per_second"]
        ratio = f"{rate / base:.2f}x" if rate and base else "-"
        print(f"{name:<15} {rate or 0:>9,.0f} {ratio:>11}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({
        "command": " ".join(["python", "bench/bench_engines.py", *(argv or sys.argv[1:])]),
        "cores": len(os.sched_getaffinity(0)), "workers": WORKERS,
        "photos": {"images": args.images, "size": "500x375 q90", "batch_size": args.batch_size,
                   "image_size": args.image_size},
        "batches": args.batches, "warmup": args.warmup, "rounds": args.rounds,
        "results": results}, indent=2))
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
