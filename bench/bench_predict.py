"""`turbotrain predict` on a folder of JPEGs against the eval pipeline on the same files, and
the time to load a run for it.

    .venv/bin/python bench/bench_predict.py [--images 2000] [--image-size 64 224] [--rounds 3]

Data: the photo-like 500x375 q90 JPEGs bench_pipelines.py caches (bench/.cache/photos-N), and
the dataset `prepare-dataset` makes of them with its defaults (every file passes through byte
for byte, so both sides decode the same bytes). Three measurements, each in a fresh process,
contenders interleaved over `--rounds`, the best round counting (the machine is shared):

* input: images/s of predict's batch source (`predict.batches`: read each file through
  `untrusted`, store it as prepare-dataset would, decode and centre-crop it with the pipeline's
  BatchDecoder) against the eval pipeline (`pytorch`, train=False) over the prepared split, both
  with `--workers` threads, batch 64, at each `--image-size`: the cost predict adds per image.
  Goal >= PREDICT_GOAL.
* command: `turbotrain predict --weights W FOLDER` against `turbotrain eval --weights W --data
  DS --split train --pipeline pytorch` with the same model (airbench at 64 px, the CPU default
  for photos; random weights) and batch, each command's own images/s (start-up excluded): both
  decode in a thread while the model runs. Goal >= PREDICT_GOAL.
* load: the "loaded in" seconds `predict` reports (read the weights file, build the model, load
  the state) for airbench and resnet50 (the largest default model, 98 MB), and the whole
  process's wall time for one image. Goal: load < LOAD_GOAL_SECONDS.

Writes bench/results/predict.json.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
RESULTS = ROOT / "results" / "predict.json"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(ROOT))

import common  # noqa: E402

PREDICT_GOAL = 0.9  # predict's images/s over the eval pipeline's (issue 16)
LOAD_GOAL_SECONDS = 2.0
BATCH = 64
COMMAND_SIZE = 64  # the command comparison's model input: what `train` picks for photos on CPU
LOAD_MODELS = ("airbench", "resnet50")


def data(images: int) -> tuple[Path, Path]:
    """(the JPEG folder, the dataset prepared from it), cached under bench/.cache/ (the
    folder bench_pipelines.py and bench_prepare.py use). Made in a child process: preparing
    forks a process pool, which can hang when forked from a process whose JPEG-writing
    threads just ran."""
    from bench_pipelines import CACHE
    root, out = CACHE / f"photos-{images // 10}", CACHE / f"photos-{images // 10}-prepared"
    if not (out / "dataset.json").is_file():
        code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; "
                "from bench_pipelines import photo_folder; photo_folder(int(sys.argv[3]))")
        run([sys.executable, "-c", code, str(ROOT), str(REPO), str(images)])
        run(turbotrain("prepare", root, out))
    return root / "train", out


def weights_file(dataset: Path, model: str, image_size: int) -> Path:
    """A weights file (random init) for `model` on the dataset's classes, cached."""
    import torch

    from turbotrain.datasets import open_dataset
    from turbotrain.train.models.models import build_model, get_model_spec
    from turbotrain.train.weights.weights import ModelCard, save_weights
    path = ROOT / ".cache" / f"predict-{model}-{image_size}.safetensors"
    if not path.exists():
        split = open_dataset(dataset, "train")
        torch.manual_seed(0)
        net = build_model(get_model_spec(model), split.num_classes, split.mean, split.std)
        card = ModelCard(model, tuple(split.classes), image_size, tuple(split.mean),
                         tuple(split.std), info={"note": "random weights, for timing"})
        save_weights(path, net.eval(), card)
    return path


# -- children -------------------------------------------------------------------------------------
def child_input(name: str, folder: str, dataset: str, image_size: int, workers: int) -> dict:
    """{"images_per_second": ...} of one input path over the whole folder / split (its second
    pass: the first warms the page cache and the threads)."""
    import torch

    from turbotrain.datasets import open_dataset
    from turbotrain.datasets.sources.image_files import list_images
    from turbotrain.pipeline import build_pipeline
    from turbotrain.train.use.predict import Inputs, batches
    torch.set_num_threads(1)
    if name == "eval_pipeline":
        split = open_dataset(dataset, "train")
        pipeline = build_pipeline("pytorch", split, train=False, batch_size=BATCH,
                                  image_size=image_size, device=torch.device("cpu"),
                                  workers=workers)

        def one_pass() -> int:
            return sum(len(images) for images, _ in pipeline)
    else:
        inputs = Inputs([list_images(folder)])

        def one_pass() -> int:
            return sum(len(b.indices) for b in batches(inputs, batch_size=BATCH,
                                                       image_size=image_size, workers=workers))
    one_pass()
    started = time.perf_counter()
    count = one_pass()
    return {"images_per_second": count / (time.perf_counter() - started)}


def run(argv: list[str], timeout: float = 900) -> tuple[str, float]:
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr[-500:]}")
    return done.stdout + done.stderr, time.perf_counter() - started


def turbotrain(*args) -> list[str]:
    return [sys.executable, "-m", "turbotrain", *map(str, args)]


def measure_input(name: str, folder: Path, dataset: Path, size: int, workers: int) -> dict:
    return common.run_child([__file__, "--child", name, "--folder", folder, "--data", dataset,
                             "--size", size, "--workers", workers], cwd=REPO)


def measure_command(name: str, folder: Path, dataset: Path, weights: Path) -> dict:
    load = common.load_average()
    if name == "predict":
        argv = turbotrain("predict", "--weights", weights, folder, "--batch-size", BATCH,
                          "--out", ROOT / ".cache" / "predict-bench.csv")
        pattern = r"predicted [\d,]+ images in [\d.]+ s \(([\d,]+) images/s\)"
    else:
        # The pytorch pipeline: it decodes while the model runs, as predict does (auto would
        # pick resident here, which decodes the whole split before eval starts its clock).
        argv = turbotrain("eval", "--weights", weights, "--data", dataset, "--split", "train",
                          "--batch-size", BATCH, "--pipeline", "pytorch",
                          "--out", ROOT / ".cache" / "eval" / "eval.json")
        pattern = r"\(([\d,]+) images/s\)"
    try:
        out, _ = run(argv)
        return {"images_per_second": float(re.search(pattern, out).group(1).replace(",", "")),
                "load": load}
    except (RuntimeError, subprocess.TimeoutExpired, AttributeError) as exc:
        return {"images_per_second": None, "load": load, "error": str(exc)[-500:]}


def measure_load(weights: Path, image: Path) -> dict:
    out, wall = run(turbotrain("predict", "--weights", weights, image))
    return {"load_seconds": float(re.search(r"loaded in ([\d.]+) s", out).group(1)),
            "process_seconds": wall, "bytes": weights.stat().st_size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--image-size", type=int, nargs="+", default=[64, 224])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        common.print_result(child_input(args.child, args.folder, args.data, args.size,
                                        args.workers))
        return 0

    folder, dataset = data(args.images)
    weights = {m: weights_file(dataset, m, COMMAND_SIZE) for m in LOAD_MODELS}
    contenders = {}
    for size in args.image_size:
        for name in ("predict", "eval_pipeline"):
            contenders[f"input {size} px {name}"] = (
                lambda name=name, size=size: measure_input(name, folder, dataset, size,
                                                           args.workers))
    for name in ("predict", "eval"):
        contenders[f"command {name}"] = (
            lambda name=name: measure_command(name, folder, dataset, weights["airbench"]))
    runs = common.interleaved(args.rounds, contenders)
    inputs = {size: {name: runs[f"input {size} px {name}"]
                     for name in ("predict", "eval_pipeline")} for size in args.image_size}
    commands = {name: runs[f"command {name}"] for name in ("predict", "eval")}
    one_image = next(iter(sorted(folder.rglob("*.jpg"))))
    loads = {m: min((measure_load(w, one_image) for _ in range(args.rounds)),
                    key=lambda r: r["load_seconds"]) for m, w in weights.items()}

    results, goals = {"input": {}, "command": {}}, []
    for size, sides in inputs.items():
        ours, theirs = common.best(sides["predict"]), common.best(sides["eval_pipeline"])
        ratio = common.ratio(ours, theirs)
        results["input"][str(size)] = {"predict": ours, "eval_pipeline": theirs, "ratio": ratio,
                                       "runs": sides}
        goals.append(common.ratio_goal(f"input {size} px: predict / eval pipeline", ratio,
                                       PREDICT_GOAL))
    ours, theirs = common.best(commands["predict"]), common.best(commands["eval"])
    ratio = common.ratio(ours, theirs)
    results["command"] = {"predict": ours, "eval": theirs, "ratio": ratio, "runs": commands}
    goals.append(common.ratio_goal(f"command ({COMMAND_SIZE} px airbench): predict / eval",
                                   ratio, PREDICT_GOAL))
    slowest = max(r["load_seconds"] for r in loads.values())
    goals.append({"what": f"load a run ({', '.join(LOAD_MODELS)}), seconds",
                  "seconds": slowest, "goal_seconds": LOAD_GOAL_SECONDS,
                  "met": slowest < LOAD_GOAL_SECONDS})
    print(f"\n{args.images} JPEGs 500x375 q90, batch {BATCH}, {args.workers} input threads, "
          f"best of {args.rounds} rounds")
    for size, r in results["input"].items():
        print(f"input {size:>4} px: predict {r['predict'] or 0:>7,.0f}/s  eval pipeline "
              f"{r['eval_pipeline'] or 0:>7,.0f}/s  ratio {r['ratio'] or 0:.2f}x")
    c = results["command"]
    print(f"command 64 px : predict {c['predict'] or 0:>7,.0f}/s  eval "
          f"{c['eval'] or 0:>7,.0f}/s  ratio {c['ratio'] or 0:.2f}x")
    for model, r in loads.items():
        print(f"load {model}: {r['load_seconds']:.2f} s ({r['bytes'] / 1e6:.0f} MB), whole "
              f"predict process for one image {r['process_seconds']:.1f} s")
    common.write_results(RESULTS, {
        "command": common.command_line(__file__, argv),
        "cores": len(os.sched_getaffinity(0)), "workers": args.workers, "batch_size": BATCH,
        "images": args.images, "size": "500x375 q90", "rounds": args.rounds,
        "results": results, "load": loads, "goals": goals})
    print(f"wrote {RESULTS}")
    return 0


def markdown(result: dict) -> str:
    results, command = result["results"], result["results"]["command"]
    rows = [[f"input, {size} px", common.rate(r["predict"]), common.rate(r["eval_pipeline"]),
             common.times(r["ratio"])] for size, r in results["input"].items()]
    rows.append([f"command, {COMMAND_SIZE} px", common.rate(command["predict"]),
                 common.rate(command["eval"]), common.times(command["ratio"])])
    return common.markdown(
        f"`turbotrain predict` on a folder of {result['images']} JPEGs {result['size']} against "
        f"the eval pipeline (`pytorch`, train=False) on the dataset `prepare-dataset` made of "
        f"the same files: batch {result['batch_size']}, {result['workers']} input threads, best "
        f"of {result['rounds']} interleaved rounds. *Input*: predict's batch source (read, store "
        "as prepare would, decode and crop with the pipeline's decoder) against the pipeline "
        "alone; *command*: the whole `predict` and `eval` commands with the same model "
        "(airbench, random weights), each one's own images/s.",
        common.md_table(["what", "predict (images/s)", "eval (images/s)", "ratio"], rows),
        common.md_table(["weights", "load (s)", "file", "whole predict of one image (s)"],
                        [[f"`{model}`", f"{r['load_seconds']:.2f}", f"{r['bytes'] / 1e6:.0f} MB",
                          f"{r['process_seconds']:.1f}"]
                         for model, r in result["load"].items()]))


if __name__ == "__main__":
    sys.exit(main())
