"""One writer of turbotrain, run after symlinks were planted where it writes, for
tests/security/test_planted_links.py.

    python tests/security/planting_child.py CASE WORKDIR DATASET

Sets up CASE's folder in WORKDIR, then plants symlinks to victim files outside that folder
under the names the writer creates or could have guessed: its final names (where it replaces
a file: train's, merge's, the cache's), and the temporary names writers used to derive from
the process id (`.eval.json.tmp-<pid>`: this
process's pid, so the guess is right). Runs the writer in this process and prints one JSON
object: {"exit": code or null, "victims_changed": [...], "not_regular": [...]} where
not_regular lists final names that are still links (or missing) afterwards.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

VICTIM_TEXT = "export PATH=/usr/bin\n"


def plant(folder: Path, names: list[str], victims: Path) -> None:
    """A link under each name to its own victim file in `victims`."""
    victims.mkdir(exist_ok=True)
    for name in names:
        victim = victims / name.replace("/", "_")
        victim.write_text(VICTIM_TEXT)
        (folder / name).symlink_to(victim)


def temporary(name: str) -> list[str]:
    """The pid-derived temporary names of the old writers for final name `name`."""
    stem, dot, suffix = name.rpartition(".")
    pid = os.getpid()
    return [f".{name}.tmp-{pid}", f".{stem}.tmp-{pid}.{suffix}"] if dot else \
        [f".{name}.tmp-{pid}"]


def run_writers(work: Path, dataset: Path) -> tuple[int | None, list[Path]]:
    """The run folder's writers, called directly: checkpoint, config, weights, summary,
    metrics, curves (what train writes into RUNDIR)."""
    import torch

    from tests.security.model_child import make_run
    from turbotrain.train.config import config_files
    from turbotrain.train.records import checkpoint, report
    from turbotrain.train.config.config import TrainConfig
    from turbotrain.train.weights.weights import read_weights, save_weights
    run = make_run(work / "source", dataset, ["a", "b"])
    state, card = read_weights(run / "best.safetensors")
    folder = work / "run"
    folder.mkdir()
    finals = ["checkpoint.pt", "config.yaml", "final.safetensors", "summary.json",
              "curves.png"]
    plant(folder, finals + [t for name in finals for t in temporary(name)], work / "victims")
    checkpoint.save_atomic({"model": {"w": torch.zeros(3)}}, folder / "checkpoint.pt")
    config_files.save_yaml(TrainConfig(data=str(dataset), model="compact28", image_size=16,
                                       batch_size=16), folder / "config.yaml")

    class Holder(torch.nn.Module):
        def state_dict(self, *args, **kwargs):
            return state
    save_weights(folder / "final.safetensors", Holder(), card)
    report.write_summary(folder, {"val_accuracy": 0.5})
    plant(folder, ["metrics.jsonl"], work / "victims")
    log = report.MetricsLog(folder)
    step = {"kind": "step", "epoch": 0, "epoch_float": 0.5, "step": 1, "loss": 1.0, "time": 1.0}
    try:
        log.write(step)  # appending through the link must be refused, not done
    except OSError:
        (folder / "metrics.jsonl").unlink()
    log.write(step)
    log.write({"kind": "epoch", "epoch": 0, "epoch_float": 1.0, "step": 2, "loss": 0.9,
               "val_loss": 0.8, "val_accuracy": 0.5, "time": 2.0})
    report.plot_curves(folder)
    return 0, [folder / name for name in finals]


def cli_case(case: str, work: Path, dataset: Path) -> tuple[int | None, list[Path]]:
    from tests.security.model_child import make_run
    from tests.train.tiny_data import tiny_images
    from turbotrain.cli import main
    run = make_run(work / "run", dataset, [f"class{k}" for k in range(4)])
    if case == "eval":
        finals, folder = ["eval.json", "confusion.png"], run
        args = ["eval", "--run", str(run), "--device", "cpu"]
    elif case == "predict":
        from PIL import Image
        images, _ = tiny_images(2, 16, 4, seed=1)
        for k, image in enumerate(images):
            Image.fromarray(image).save(work / f"{k}.png")
        folder = work / "out"
        folder.mkdir()
        finals = ["p.csv"]
        args = ["predict", "--run", str(run), str(work / "0.png"), str(work / "1.png"),
                "--out", str(folder / "p.csv"), "--device", "cpu"]
    else:
        finals, folder = ["model.torchscript.pt"], run  # torch.jit.save writes by name
        args = ["export", "--run", str(run), "--format", "torchscript"]
    # The temporary names only: a link at a final name is an existing file, which these
    # commands refuse to replace without --overwrite (test_outputs.py).
    plant(folder, [t for name in finals for t in temporary(name)], work / "victims")
    return main(args), [folder / name for name in finals]


def merge_case(work: Path) -> tuple[int | None, list[Path]]:
    from turbotrain.cli import main
    from turbotrain.datasets.synthetic import write_shapes_imagefolder
    source, out = work / "src", work / "parts"
    write_shapes_imagefolder(source, train_per_class=2, val_per_class=0, size=(24, 24))
    for part in ("0/2", "1/2"):
        assert main(["prepare", str(source), str(out), "--shard-size", "8MiB", "--part", part,
                     "--workers", "1"]) == 0
    names = ["skipped.txt"] + temporary("dataset.json") + temporary("skipped.txt")
    plant(out, names, work / "victims")
    return main(["merge", str(out)]), [out / "dataset.json"]


def prepare_case(work: Path) -> tuple[int | None, list[Path]]:
    from turbotrain.cli import main
    from turbotrain.datasets.synthetic import write_shapes_imagefolder
    source, out = work / "src", work / "ds"
    write_shapes_imagefolder(source, train_per_class=2, val_per_class=0, size=(24, 24))
    outside = work / "victims" / "folder"
    outside.mkdir(parents=True)
    (outside / "keep.txt").write_text(VICTIM_TEXT)
    (work / f".ds.partial-{os.getpid()}").symlink_to(outside)  # the old partial folder's name
    return main(["prepare", str(source), str(out), "--workers", "1"]), [out / "dataset.json"]


def cache_case(work: Path) -> tuple[int | None, list[Path]]:
    from turbotrain.datasets.remote.shard_cache import ShardCache
    cache = work / "cache"
    cache.mkdir()
    plant(cache, ["k.beton", "k.beton.part"], work / "victims")

    def download(target) -> None:  # an open file (the cache's), or a path (the old cache's)
        if isinstance(target, Path):
            with open(target, "r+b") as f:
                f.write(b"y" * 1000)
        else:
            target.write(b"y" * 1000)
    path = ShardCache(cache, 10_000).acquire("k", 1000, download, what="k")
    return 0, [path]


def main() -> int:
    case, work, dataset = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    work.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the one JSON object
        if case == "run":
            code, finals = run_writers(work, dataset)
        elif case in ("eval", "predict", "export"):
            code, finals = cli_case(case, work, dataset)
        elif case == "merge":
            code, finals = merge_case(work)
        elif case == "prepare":
            code, finals = prepare_case(work)
        else:
            code, finals = cache_case(work)
    victims = sorted((work / "victims").rglob("*"))
    changed = [str(v) for v in victims if v.is_file() and v.read_bytes() != VICTIM_TEXT.encode()]
    not_regular = [str(p) for p in finals if p.is_symlink() or not p.is_file()]
    json.dump({"exit": code, "victims_changed": changed, "not_regular": not_regular},
              sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
