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
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "engines.json"
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import common  # noqa: E402

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


def child(name: str, data: str, args) -> dict:
    """{"images_per_second": ...} of one contender (runs in a fresh process)."""
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
        return {"images_per_second": steady_rate(pipeline, warmup=args.warmup,
                                                 batches=args.batches, device="cpu")}
    finally:
        pipeline.close()


def run_child(name: str, data: Path, args) -> dict:
    return common.run_child([__file__, "--child", name, "--data", data,
                             "--batches", args.batches, "--warmup", args.warmup,
                             "--batch-size", args.batch_size, "--image-size", args.image_size])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
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
        common.print_result(child(args.child, args.data, args))
        return 0

    data = dataset_folder(args.images)
    names = args.only or list(CONTENDERS)
    runs = common.interleaved(args.rounds, {
        name: (lambda name=name: run_child(name, data, args)) for name in names})
    results = {name: {"images_per_second": common.best(runs[name]), "what": CONTENDERS[name],
                      "runs": runs[name]} for name in names}
    base = results.get("pytorch", {}).get("images_per_second")
    print(f"\n{data}: {args.images} images, batch {args.batch_size}, {args.image_size} px, "
          f"{WORKERS} threads, best of {args.rounds} rounds")
    print(f"{'pipeline':<15} {'images/s':>9} {'vs pytorch':>11}")
    for name, result in results.items():
        rate = result["images_per_second"]
        ratio = f"{rate / base:.2f}x" if rate and base else "-"
        print(f"{name:<15} {rate or 0:>9,.0f} {ratio:>11}")
    common.write_results(RESULTS, {
        "command": common.command_line(__file__, argv),
        "cores": len(os.sched_getaffinity(0)), "workers": WORKERS,
        "photos": {"images": args.images, "size": "500x375 q90", "batch_size": args.batch_size,
                   "image_size": args.image_size},
        "batches": args.batches, "warmup": args.warmup, "rounds": args.rounds,
        "results": results})
    print(f"wrote {RESULTS}")
    return 0


def markdown(result: dict) -> str:
    entries, photos = result["results"], result["photos"]
    base = (entries.get("pytorch") or {}).get("images_per_second")
    return common.markdown(
        f"Our pipelines through the registry, as the trainer builds them: {photos['images']} "
        f"JPEGs {photos['size']}, RandomResizedCrop {photos['image_size']} + flip, batch "
        f"{photos['batch_size']}, {result['workers']} threads, best of {result['rounds']} "
        "rounds. No numeric goal: this is how the engines compare on a CPU.",
        common.md_table(["pipeline", "images/s", "vs pytorch", "what"],
                        [[f"`{name}`", common.rate(r["images_per_second"]),
                          common.times(common.ratio(r["images_per_second"], base)),
                          r["what"] if r["images_per_second"] else common.run_error(r["runs"])]
                         for name, r in entries.items()]))


if __name__ == "__main__":
    sys.exit(main())
