"""The cost of the augmentations after decode (train --aa, --color-jitter, --reprob).

    .venv/bin/python bench/bench_augment.py [--device auto|cpu|cuda] [--sizes 64,224]
        [--batch-size 256] [--batches 10] [--rounds 3] [--threads N]

Times turbotrain's batch-level stage (pipeline/after_decode.py: what every pipeline runs on a
training batch, on the batch's device) on random uint8 channels_last batches already on the
device, one policy at a time, beside torchvision's v2 transforms of the same kind applied one
image at a time (RandAugment(2, 9), TrivialAugmentWide(), ColorJitter(0.4, 0.4, 0.4),
RandomErasing(0.25, value="random")) on the same tensors: how timm/torchvision users run them,
in DataLoader workers. A CUDA batch is timed to a synchronize; the stage's draws are made on
the host, so their cost is included. One untimed batch first, then `--batches` timed ones;
policies run `--rounds` times interleaved and the best round counts (the machine may be
shared). The cost that matters for a run is ms per batch beside the step's: on CUDA the stage
runs on the training stream, between steps; on a CPU, in the training process. Writes
bench/results/augment.json.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "augment.json"
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import common  # noqa: E402

# flag values -> the torchvision v2 transform of the same kind (its name in the table).
POLICIES = {
    "--aa rand-m9-mstd0.5": (dict(aa="rand-m9-mstd0.5"), "RandAugment(num_ops=2, magnitude=9)"),
    "--aa trivial": (dict(aa="trivial"), "TrivialAugmentWide()"),
    "--color-jitter 0.4": (dict(color_jitter=0.4), "ColorJitter(0.4, 0.4, 0.4)"),
    "--reprob 0.25": (dict(reprob=0.25), "RandomErasing(0.25, value='random')"),
    "--aa rand-m9-mstd0.5 --reprob 0.25": (dict(aa="rand-m9-mstd0.5", reprob=0.25), None),
}


def torchvision_transform(name: str):
    from torchvision.transforms import v2
    return {"RandAugment(num_ops=2, magnitude=9)": v2.RandAugment(num_ops=2, magnitude=9),
            "TrivialAugmentWide()": v2.TrivialAugmentWide(),
            "ColorJitter(0.4, 0.4, 0.4)": v2.ColorJitter(0.4, 0.4, 0.4),
            "RandomErasing(0.25, value='random')": v2.RandomErasing(0.25, value="random")}[name]


def time_batches(run, batches: int, sync) -> float:
    """Seconds per batch of `run(epoch)` over `batches` timed calls after one untimed."""
    run(0)
    sync()
    start = time.perf_counter()
    for epoch in range(1, batches + 1):
        run(epoch)
    sync()
    return (time.perf_counter() - start) / batches


def measure(flags: str, size: int, args, device) -> dict:
    import numpy as np
    import torch
    from turbotrain.augment_policy import policy
    from turbotrain.pipeline.after_decode import AfterDecode

    settings, reference = POLICIES[flags]
    images = torch.randint(0, 256, (args.batch_size, 3, size, size), dtype=torch.uint8,
                           device=device).contiguous(memory_format=torch.channels_last)
    indices = np.arange(args.batch_size)
    stage = AfterDecode(policy(**settings), seed=0, mean=(124, 116, 104), std=(58, 57, 57))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    ours = time_batches(lambda epoch: stage(images, indices, epoch), args.batches, sync)
    row = {"policy": flags, "image_size": size, "ours_ms": ours * 1e3,
           "ours_images_per_second": args.batch_size / ours, "torchvision": reference}
    if reference is not None:
        transform = torchvision_transform(reference)
        per_image = time_batches(lambda _: [transform(image) for image in images],
                                 args.batches, sync)
        row.update(torchvision_ms=per_image * 1e3, speedup=per_image / ours)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--sizes", default=None,
                        help="comma-separated image sizes (default: 64,224 on CUDA, 32,64 on "
                             "a CPU)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="default: 256 on CUDA, 64 on a CPU (the trainer's auto batches)")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="torch intra-op threads (default: all cores)")
    args = parser.parse_args(argv)

    import torch
    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    sizes = [int(s) for s in (args.sizes or ("64,224" if cuda else "32,64")).split(",")]
    args.batch_size = args.batch_size or (256 if cuda else 64)

    rows = []
    for size in sizes:
        runs = common.interleaved(args.rounds, {
            flags: (lambda flags=flags: measure(flags, size, args, device))
            for flags in POLICIES}, show=lambda r: f"{r['ours_ms']:.2f} ms/batch")
        for flags in POLICIES:
            best = min(runs[flags], key=lambda r: r["ours_ms"])
            rows.append(best)
            print(f"{size:4d} px  {flags:36s} {best['ours_ms']:8.2f} ms/batch  "
                  f"torchvision per image {best.get('torchvision_ms') or 0:8.2f} ms", flush=True)
    common.write_results(RESULTS, {
        "command": common.command_line(__file__, argv), "device": device.type,
        "batch_size": args.batch_size, "batches": args.batches, "rounds": args.rounds,
        "threads": args.threads, "results": rows})
    print(f"wrote {RESULTS}")
    return 0


def markdown(result: dict) -> str:
    return common.markdown(
        f"The augmentations after decode on {result['device']}: batch {result['batch_size']}, "
        f"{result['batches']} timed batches, best of {result['rounds']} rounds, "
        f"{result['threads']} torch threads. Ours is the batch-level stage every pipeline "
        "runs (pipeline/after_decode.py); torchvision's v2 transform of the same kind runs "
        "one image at a time on the same tensors. No numeric goal: this is the price of "
        "turning them on, to set beside the training step's time.",
        common.md_table(["flags", "px", "ours ms/batch", "ours images/s", "torchvision (per image)",
                         "its ms/batch", "ours faster"],
                        [[r["policy"], r["image_size"], common.decimal(r["ours_ms"], 2),
                          common.rate(r["ours_images_per_second"]), r.get("torchvision"),
                          common.decimal(r.get("torchvision_ms"), 2),
                          common.times(r.get("speedup"))] for r in result["results"]]))


if __name__ == "__main__":
    sys.exit(main())
