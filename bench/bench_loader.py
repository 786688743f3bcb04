"""`turbotrain.Loader` in a plain training loop vs `train` on the same data, model and precision.

    .venv/bin/python bench/bench_loader.py [--images 3000] [--image-size 64] [--batch-size 64]
        [--steps 40] [--rounds 4] [--model airbench] [--precision auto]

Data: bench_pipelines.py's photo set (`--images` photo-like 500x375 JPEGs, prepared with the
default options, cached under bench/.cache/). Both contenders run in fresh processes, one at a
time, interleaved for `--rounds` rounds, the order swapped every round; the ratio is the median
of the rounds' ratios (one run each: a best-of ratio moved 0.91-1.04x over three runs of the
same code, the machine is shared), with the same
pipeline (`pytorch`), workers and threads (the plan's, unless given), batch size, image size,
model (`build_model`, channels_last) and precision (`auto`: bf16 autocast where the CPU has
native bf16, else fp32, the plan's CPU rule):

* `train`: the `train` command with `--max-steps`; images/s is its summary.json's (the timed
  steps after its one warm-up step, data wait included);
* `loader`: a user's loop (`for images, labels in loader:` forward, cross-entropy, backward,
  SGD step) over `Loader(..., device="cpu")` with `torch.set_num_threads(loader.torch_threads)`
  and freed host memory kept for reuse as `train` keeps it (host_memory.py: otherwise the
  allocator, not the Loader, is measured); timed the same way, after one warm-up step.

Goal: loader / train >= 0.98x (the median of the rounds' ratios). Writes bench/results/loader.json.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
RESULTS = ROOT / "results" / "loader.json"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(ROOT))

import common  # noqa: E402

GOAL = 0.98
WARMUP_STEPS = 1  # as `train` on the CPU (trainer.py: 2 when compiled)


def photo_data(images: int) -> Path:
    """bench_pipelines.py's prepared photo set (made once, cached)."""
    import bench_pipelines
    folder = bench_pipelines.photo_folder(images)
    return bench_pipelines.prepared(folder / "train", folder.name)


def resolved_precision(precision: str) -> str:
    if precision != "auto":
        return precision
    from turbotrain.train.plan.hardware import cpu_native_bf16
    return "bf16" if cpu_native_bf16() else "fp32"


def settings_args(args) -> list[str]:
    """The settings every child gets, as flags of this script's --child mode."""
    flags = ["--image-size", args.image_size, "--batch-size", args.batch_size,
             "--steps", args.steps, "--model", args.model, "--precision", args.precision]
    for name in ("workers", "threads"):
        if getattr(args, name) is not None:
            flags += [f"--{name}", getattr(args, name)]
    return [str(f) for f in flags]


def run_train(data: Path, out: Path, args) -> dict:
    """The `train` command at these settings; its summary.json's speed."""
    command = [sys.executable, "-m", "turbotrain", "train", "--data", str(data), "--out",
               str(out), "--model", args.model, "--image-size", str(args.image_size),
               "--batch-size", str(args.batch_size), "--max-steps", str(args.steps),
               "--epochs", "1000", "--pipeline", "pytorch", "--precision", args.precision,
               "--checkpoint-every", "0", "--log-every", "50", "--device", "cpu"]
    for name in ("workers", "threads"):
        if getattr(args, name) is not None:
            command += [f"--{name}", str(getattr(args, name))]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench_loader: train failed: {done.stderr.strip()[-500:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"images_per_second": summary["images_per_second"],
            "data_wait_fraction": summary["data_wait_fraction"],
            "precision": summary["precision"], "pipeline": summary["pipeline"]}


def open_loader(data: Path, args):
    """The Loader both loops iterate, torch given its share of the cores."""
    import torch
    from turbotrain import Loader
    loader = Loader(data, batch_size=args.batch_size, image_size=args.image_size,
                    pipeline="pytorch", device="cpu", workers=args.workers, threads=args.threads)
    torch.set_num_threads(loader.torch_threads)
    return loader


def build_model(loader, model: str):
    """`train`'s model for the split: the uint8 input stem and the net, channels_last."""
    import torch
    from turbotrain.train.models.models import build_model as build, get_model_spec
    torch.manual_seed(0)
    net = build(get_model_spec(model), loader.num_classes, loader.dataset.mean,
                loader.dataset.std)
    return net.to(memory_format=torch.channels_last)


def autocast(precision: str):
    import contextlib
    import torch
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def run_loader(data: Path, args) -> dict:
    """The plain loop (module docstring), timed after WARMUP_STEPS."""
    import torch
    from turbotrain.train.step.host_memory import keep_freed_memory
    keep_freed_memory()
    loader = open_loader(data, args)
    model = build_model(loader, args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                                weight_decay=5e-4)
    step, start, epoch = 0, None, 0
    while step < args.steps:
        loader.set_epoch(epoch)
        for images, labels in loader:
            with autocast(args.precision):
                loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step == WARMUP_STEPS:
                start = time.perf_counter()
            if step >= args.steps:
                break
        epoch += 1
    seconds = time.perf_counter() - start
    loader.close()
    return {"images_per_second": (args.steps - WARMUP_STEPS) * args.batch_size / seconds,
            "torch_threads": loader.torch_threads, "workers": loader.workers}


def parser_for(doc: str, default_steps: int) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--images", type=int, default=3000, help="photos in the data set")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=default_steps,
                        help="optimizer steps per run, the first one untimed")
    parser.add_argument("--rounds", type=int, default=4,
                        help="rounds of one run each, the order swapped every round")
    parser.add_argument("--model", default="airbench", help="what `train` picks at 64 px")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--workers", type=int, default=None, help="default: the plan's")
    parser.add_argument("--threads", type=int, default=None, help="default: the plan's")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", type=Path, help=argparse.SUPPRESS)
    return parser


def compare(args, argv, *, name: str, ours: str, goal: float, child_script: str,
            results: Path, extra=None) -> dict:
    """Interleaved rounds of `ours` (a --child of `child_script`) against `train`; writes
    and returns the result file."""
    args.precision = resolved_precision(args.precision)
    if args.steps <= WARMUP_STEPS:
        raise SystemExit(f"--steps {args.steps}: needs more than the {WARMUP_STEPS} warm-up step")
    data = photo_data(args.images)
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        runs_made = iter(range(10**6))

        def train() -> dict:
            out = Path(tmp) / f"train-{next(runs_made)}"
            return common.run_child([Path(child_script), "--child", "train", "--data", data,
                                     "--out-dir", out, *settings_args(args)])

        def mine() -> dict:
            return common.run_child([Path(child_script), "--child", ours, "--data", data,
                                     *settings_args(args)])
        runs = common.interleaved(args.rounds, {ours: mine, "train": train}, alternate=True)
    ratio = common.paired_ratio(runs[ours], runs["train"])
    result = {"command": common.command_line(child_script, argv), "images": args.images,
              "image_size": args.image_size, "batch_size": args.batch_size,
              "steps": args.steps, "warmup_steps": WARMUP_STEPS, "model": args.model,
              "precision": args.precision, "pipeline": "pytorch", "rounds": args.rounds,
              "results": {k: {"images_per_second": common.best(v), "runs": v}
                          for k, v in runs.items()},
              "ratio": ratio,
              "goals": [common.ratio_goal(f"{ours} / train, images/s", ratio, goal)]}
    if extra is not None:
        result.update(extra(result, data))
    common.write_results(results, result)
    shown = "n/a" if ratio is None else f"{ratio:.3f}x"
    print(f"{ours} / train: {shown} (goal >= {goal}x); wrote {results}")
    return result


def child(args) -> dict:
    if args.child == "train":
        return run_train(args.data, args.out_dir, args)
    if args.child == "loader":
        return run_loader(args.data, args)
    raise SystemExit(f"unknown --child {args.child!r}")


def main(argv: list[str] | None = None) -> int:
    parser = parser_for(__doc__, default_steps=40)
    args = parser.parse_args(argv)
    if args.child:
        common.print_result(child(args))
        return 0
    compare(args, argv, name="loader", ours="loader", goal=GOAL,
            child_script=__file__, results=RESULTS)
    return 0


def against_train(result: dict, ours: str, what: str) -> list:
    """The common.markdown parts of a section setting `ours` against `train` on the same
    settings (this benchmark's and bench_lightning.py's)."""
    rows = [[f"`{name}`", common.rate(result["results"][name]["images_per_second"])
             or common.run_error(result["results"][name].get("runs", [])), label]
            for name, label in ((ours, what), ("train", "the `train` command (its summary.json)"))]
    return [f"{result['model']} at {result['image_size']} px, batch {result['batch_size']}, "
            f"{result['precision']}, the `{result['pipeline']}` pipeline on {result['images']} "
            f"photos: {result['steps']} steps of which {result['warmup_steps']} warm-up, "
            f"{result['rounds']} interleaved rounds (the order swapped every round), each run in "
            f"a fresh process; images/s: the best run. {ours} / train, the median of the rounds' "
            f"ratios: **{common.times(result['ratio'])}**.",
            common.md_table(["contender", "images/s", "what"], rows)]


def markdown(result: dict) -> str:
    return common.markdown(*against_train(result, "loader", "`turbotrain.Loader` in a plain "
                                          "loop (forward, cross-entropy, backward, SGD step)"))


if __name__ == "__main__":
    sys.exit(main())
