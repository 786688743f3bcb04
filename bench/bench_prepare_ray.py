"""Ray's overhead on one machine: `prepare-dataset --engine ray` against `--engine local` (the
default), the same photos, the same shard plan, both on this machine's cores.

Same source as bench_prepare.py (photo-like ~500x375 q90 JPEGs as an ImageFolder), max side
512, `--shard-size 8MiB` (the smallest: ~200 photos a shard, so 2,400 photos make ~12 shards and
the engine its default 4 parts per CPU), at 2,400 and 24,000 photos. Local runs one process with
`--workers 2`; Ray runs the parts as tasks of one CPU each on a cluster of 2 CPUs started once
by this script (as a user's cluster is already running: its start is reported apart, not
counted), each driver a fresh `prepare-dataset ... --engine ray --address ADDR` process, so the
driver's start-up, its connection, the workers' start and imports and the merge all count.
Interleaved over `--repeats`, best counting; the goal (Ray >= GOAL x local's rate) is judged at
the largest size, as Ray's fixed ~2 s a run outweighs a small one. The engine's own line gives
the driver's parts/s (parts run / seconds from the first task submitted to the last part in).
The two outputs are compared byte for byte.

    .venv/bin/python bench/bench_prepare_ray.py [--images 2400 24000] [--repeats 2]

Writes bench/results/prepare_ray.json (`--json PATH` elsewhere; `--address ADDR` uses a running
cluster instead of starting one).
"""
from __future__ import annotations

import argparse
import filecmp
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "prepare_ray.json"
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import common  # noqa: E402
from bench_prepare import photo_folder  # noqa: E402

GOAL = 0.8  # --engine ray's images/s over --engine local's, on one machine, at the largest size
# Ray's ~2 s a run (see _measure) is more than a whole local run of 2,400 pass-through photos
# (1.4 s); at 24,000 it is a share a real conversion (hours) never sees.
SIZES = (2400, 24000)
SHARD_SIZE = "8MiB"
CPUS = 2
ENGINE_LINE = re.compile(r"on Ray: (\d+) parts \((\d+) already done, (\d+) run, ([\d.]+) parts/s\)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--images", type=int, nargs="+", default=list(SIZES),
                        help="photo counts to measure (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, default=RESULTS, help="where the results go")
    parser.add_argument("--address", default=None,
                        help="a running Ray cluster (default: start one of 2 CPUs here)")
    args = parser.parse_args(argv)
    address, cluster_seconds, ray = args.address, None, None
    if address is None:
        import ray
        started = time.perf_counter()
        ray.init(num_cpus=CPUS, include_dashboard=False, log_to_driver=False)
        cluster_seconds = time.perf_counter() - started
        address = ray.get_runtime_context().gcs_address
    try:
        sizes = [_measure(images, args.repeats, address) for images in args.images]
    finally:
        if ray is not None:
            ray.shutdown()
    largest = max(sizes, key=lambda size: size["images"])
    result = {"command": common.command_line(__file__, argv), "shard_size": SHARD_SIZE,
              "cpus": CPUS, "cluster_start_seconds": cluster_seconds, "sizes": sizes,
              "goals": [common.ratio_goal(
                  f"--engine ray / --engine local, one machine, {largest['images']:,} photos",
                  largest["ratio"], GOAL)]}
    common.write_results(args.json, result)
    for size in sizes:
        print(f"{size['images']:,} photos: --engine local {size['local_images_per_second']:.0f} "
              f"images/s, --engine ray {size['ray_images_per_second']:.0f} images/s "
              f"({size['parts']} parts, driver {size['driver_parts_per_second']} parts/s), "
              f"ratio {size['ratio']:.2f}x, byte-identical: {size['byte_identical']}; Ray's "
              f"overhead {size['overhead_seconds']:.1f} s")
    print(f"goal: ratio >= {GOAL}x at {largest['images']:,} photos: "
          f"{'met' if largest['ratio'] >= GOAL else 'NOT met'}")
    return 0


def _measure(images: int, repeats: int, address: str) -> dict:
    """Local and Ray, interleaved over `repeats`, on `images` photos: one size's figures."""
    source = photo_folder(images) / "train"
    count = sum(1 for _ in source.rglob("*.jpg"))
    work = Path(tempfile.mkdtemp(prefix="bench-prepare-ray-"))
    prepare = [sys.executable, "-m", "turbotrain", "prepare", str(source)]
    common_flags = ["--shard-size", SHARD_SIZE, "--max-side", "512", "--no-progress"]

    def local() -> dict:
        shutil.rmtree(work / "local", ignore_errors=True)
        return common.timed_command([*prepare, str(work / "local"), *common_flags,
                                     "--workers", str(CPUS)])

    def on_ray() -> dict:
        shutil.rmtree(work / "ray", ignore_errors=True)
        started = time.perf_counter()
        done = subprocess.run([*prepare, str(work / "ray"), *common_flags, "--engine", "ray",
                               "--address", address], capture_output=True, text=True,
                              check=True)
        seconds = time.perf_counter() - started
        match = ENGINE_LINE.search(done.stdout)
        return {"seconds": seconds, "load": common.load_average(),
                "parts": int(match[1]) if match else None,
                "driver_parts_per_second": float(match[4]) if match else None}
    try:
        print(f"{count:,} photos")
        runs = common.interleaved(repeats, {"local": local, "ray": on_ray},
                                  show=lambda r: f"{r['seconds']:.1f} s (load {r['load']:.2f})")
        identical = _same_bytes(work / "local", work / "ray")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    local_rate = count / common.best(runs["local"], "seconds", lowest=True)
    ray_best = common.best_run(runs["ray"], "seconds", lowest=True)
    # Ray's cost beyond local's, in seconds: the driver connecting (~1 s) and the job's worker
    # processes starting (~0.7 s: Ray starts them per job), one task a part, the merge.
    overhead = ray_best["seconds"] - count / local_rate
    return {"images": count, "parts": ray_best["parts"],
            "local_images_per_second": local_rate,
            "ray_images_per_second": count / ray_best["seconds"],
            "ratio": count / ray_best["seconds"] / local_rate,
            "driver_parts_per_second": ray_best["driver_parts_per_second"],
            "overhead_seconds": overhead, "byte_identical": identical, "runs": runs}


def _same_bytes(a: Path, b: Path) -> bool:
    names = sorted(os.listdir(a))
    return names == sorted(os.listdir(b)) and all(
        filecmp.cmp(a / name, b / name, shallow=False) for name in names)


def markdown(result: dict) -> str:
    start = result.get("cluster_start_seconds")
    return common.markdown(
        f"The same photo-like 500x375 q90 JPEGs, --shard-size {result['shard_size']}, on "
        f"{result['cpus']} cores: one process with 2 workers, or the parts as Ray tasks of one "
        "CPU on a running local cluster (each driver a fresh process: its start and connection, "
        "the job's workers starting and the merge count"
        + (f"; the cluster's own start, {start:.1f} s, does not" if start else "") + "), best "
        "of the repeats. Ray's overhead (its seconds beyond local's) is mostly fixed, so the "
        "goal is judged at the largest size.",
        common.md_table(["photos", "parts", "--engine local (images/s)",
                         "--engine ray (images/s)", "ratio", "Ray's overhead (s)",
                         "driver (parts/s)", "byte-identical"],
                        [[f"{s['images']:,}", s["parts"], common.rate(s["local_images_per_second"]),
                          common.rate(s["ray_images_per_second"]), common.times(s["ratio"]),
                          common.decimal(s.get("overhead_seconds")),
                          s.get("driver_parts_per_second"), s.get("byte_identical")]
                         for s in result["sizes"]]))


if __name__ == "__main__":
    sys.exit(main())
