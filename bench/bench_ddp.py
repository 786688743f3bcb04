"""Images/s of `train` as one process vs two under torchrun (DDP over Gloo) on the same CPU.

    .venv/bin/python bench/bench_ddp.py [--models compact28,resnet18] [--steps 300]
        [--rounds 2] [--two-thread-baseline] [--source /usr/share/datasets/fashion-mnist]

The 60,000 Fashion-MNIST training images (28 px, raw) are prepared once into a temporary folder
(no val split, so no evaluation). Every setting then runs the real `train` command with
`--max-steps`, the `pytorch` pipeline with 0 workers and the precision `auto` picks, in these
layouts, all with a global batch of 64:

* 1 process x 1 torch thread, batch 64: one rank's share of the box;
* 2 processes x 1 thread under `torchrun --standalone --nproc-per-node 2`, batch 32 per rank;
* with --two-thread-baseline, 1 process x 2 torch threads: the whole box without DDP. Off by
  default: on the shared dev box (load average 5-8) OpenMP's two threads wait on each other's
  preempted peer, measured 7x slower than one thread, so it times the neighbours.

images/s is the trainer's own (summary.json: all ranks' images over the timed steps, warm-up
and evaluation excluded). Settings run `--rounds` times interleaved and the best round counts
(the machine is shared). Apart from training, the Gloo all-reduce of each model's gradients
(4 bytes a parameter) between two processes is timed alone: the communication DDP adds to every
optimizer step, whatever the neighbours do to the images/s. Writes bench/results/ddp.json.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
RESULTS = ROOT / "results" / "ddp.json"
sys.path.insert(0, str(ROOT))

import common  # noqa: E402

GLOBAL_BATCH = 64
# (label, how, processes, torch threads per process)
ONE_PROCESS = ("1 process x 1 thread", "single", 1, 1)
DDP = ("2 processes x 1 thread, DDP", "torchrun", 2, 1)
TWO_THREADS = ("1 process x 2 threads", "single", 1, 2)


def prepare_train_only(source: Path, folder: Path) -> Path:
    """The source's train split alone, as a prepared dataset (no val: nothing to evaluate)."""
    import numpy as np
    sys.path.insert(0, str(REPO))
    from turbotrain.datasets.sources.detect import detect_source
    split = detect_source(source).splits["train"]
    npz = folder / "train.npz"
    np.savez(npz, images=np.asarray(split.images), labels=np.asarray(split.labels))
    out = folder / "data"
    subprocess.run([sys.executable, "-m", "turbotrain", "prepare", str(npz), str(out)],
                   cwd=REPO, check=True, capture_output=True)
    return out


def train_args(data: Path, out: Path, model: str, batch: int, threads: int,
               steps: int) -> list[str]:
    return ["train", "--data", str(data), "--out", str(out), "--model", model,
            "--batch-size", str(batch), "--max-steps", str(steps), "--epochs", "1",
            "--pipeline", "pytorch", "--workers", "0", "--threads", str(threads),
            "--checkpoint-every", "0", "--log-every", "50"]


def run_layout(data: Path, out: Path, model: str, layout: tuple, steps: int) -> dict:
    _, how, processes, threads = layout
    args = train_args(data, out, model, GLOBAL_BATCH // processes, threads, steps)
    launcher = (["-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                 str(processes)] if how == "torchrun" else [])
    command = [sys.executable, *launcher, "-m", "turbotrain", *args]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"bench_ddp: {' '.join(command)} failed:\n{result.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"images_per_second": summary["images_per_second"],
            "data_wait_fraction": summary["data_wait_fraction"],
            "world_size": summary["world_size"], "precision": summary["precision"]}


def _time_allreduce(rank: int, init_file: str, floats: int, results: str) -> None:
    import statistics
    import time

    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    gradients = torch.ones(floats)
    for _ in range(3):  # connection set-up and first-touch of the buffers
        dist.all_reduce(gradients)
    seconds = []
    for _ in range(15):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(gradients)
        seconds.append(time.perf_counter() - start)
    if rank == 0:
        Path(results).write_text(json.dumps({"median_ms": statistics.median(seconds) * 1e3,
                                             "min_ms": min(seconds) * 1e3}))
    dist.destroy_process_group()


def allreduce_milliseconds(model: str, folder: Path) -> dict:
    """Median and best time of one all-reduce of `model`'s gradients over 2 Gloo processes."""
    import torch.multiprocessing as mp
    sys.path.insert(0, str(REPO))
    from turbotrain.train.models.models import build_model, get_model_spec
    parameters = sum(p.numel() for p in build_model(get_model_spec(model), 10).parameters())
    results = folder / f"allreduce-{model}.json"
    mp.spawn(_time_allreduce, args=(str(folder / f"init-{model}"), parameters, str(results)),
             nprocs=2)
    return {"parameters": parameters, "gradient_megabytes": parameters * 4 / 1e6,
            **json.loads(results.read_text())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--models", default="compact28,resnet18",
                        help="comma-separated model names (default: compact28,resnet18)")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repetitions")
    parser.add_argument("--two-thread-baseline", action="store_true",
                        help="also time 1 process x 2 torch threads (see above)")
    parser.add_argument("--source", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    layouts = [ONE_PROCESS, DDP] + ([TWO_THREADS] if args.two_thread_baseline else [])
    with tempfile.TemporaryDirectory(prefix="bench-ddp-") as tmp:
        data = prepare_train_only(Path(args.source), Path(tmp))
        numbers = itertools.count()  # a fresh run folder for every run

        def contender(model: str, layout: tuple):
            # resnet18 (11.2 M parameters, 45 MB of gradients a step) is ~10x slower.
            steps = args.steps if model == "compact28" else max(20, args.steps // 10)
            _, how, processes, threads = layout

            def run() -> dict:
                out = Path(tmp) / f"{model}-{how}-{processes}x{threads}-{next(numbers)}"
                return {**run_layout(data, out, model, layout, steps), "steps": steps}
            return run
        runs = common.interleaved(args.rounds, {
            f"{model} {layout[0]}": contender(model, layout)
            for model in models for layout in layouts})
        best = {(model, layout[0]): common.best_run(runs[f"{model} {layout[0]}"])
                for model in models for layout in layouts}
        allreduce = {model: allreduce_milliseconds(model, Path(tmp)) for model in models}
    rows = []
    for model in models:
        one = best[(model, ONE_PROCESS[0])]["images_per_second"]
        ddp = best[(model, DDP[0])]["images_per_second"]
        for label, how, processes, threads in layouts:
            rows.append({"model": model, "layout": label, "processes": processes,
                         "threads_per_process": threads, **best[(model, label)]})
            if label == DDP[0]:
                rows[-1]["speedup_vs_one_process"] = ddp / one
                rows[-1]["gradient_allreduce"] = allreduce[model]
        step_ms = 1e3 * GLOBAL_BATCH / one
        print(f"{model}: DDP on 2 processes = {ddp / one:.2f}x one process; gradient "
              f"all-reduce {allreduce[model]['median_ms']:.1f} ms "
              f"({allreduce[model]['gradient_megabytes']:.1f} MB) vs a {step_ms:.0f} ms "
              "one-process step")
    common.write_results(RESULTS, {"command": common.command_line(__file__, argv),
                                   "global_batch": GLOBAL_BATCH, "rounds": args.rounds,
                                   "cores": os.cpu_count(), "results": rows})
    print(f"wrote {RESULTS}")
    return 0


def markdown(result: dict) -> str:
    def reduce(r: dict) -> str | None:
        a = r.get("gradient_allreduce")
        return a and f"{a['gradient_megabytes']:.1f} MB in {a['median_ms']:.2f} ms (median)"
    return common.markdown(
        f"`train` as one process vs two under `torchrun` (DDP over Gloo) on the same "
        f"{result['cores']}-core CPU: global batch {result['global_batch']}, the trainer's own "
        f"images/s, best of {result['rounds']} interleaved rounds. The all-reduce is timed "
        "alone, between two processes. No numeric goal: on one CPU the processes share the same "
        "cores, so this shows the cost of DDP's machinery rather than scaling.",
        common.md_table(["model", "layout", "images/s", "vs one process", "data wait",
                         "gradient all-reduce"],
                        [[r["model"], r["layout"], common.rate(r.get("images_per_second")),
                          common.times(r.get("speedup_vs_one_process")),
                          common.percent(r.get("data_wait_fraction")), reduce(r)]
                         for r in result["results"]]))


if __name__ == "__main__":
    sys.exit(main())
