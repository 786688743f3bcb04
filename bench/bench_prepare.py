"""Conversion speed: the whole `prepare-dataset` command against FFCV's `DatasetWriter`.

Same source (photo-like ~500x375 q90 JPEGs as an ImageFolder), 2 workers each, max side 512,
measured in one run, each as a fresh process so start-up (imports) counts, interleaved over
`--repeats` with the best counting (goal: >= GOAL x FFCV's rate):

    .venv/bin/python bench/bench_prepare.py [--images 3000]

Writes bench/results/prepare.json.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "prepare.json"
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import common  # noqa: E402
from turbotrain.datasets.synthetic import write_shapes_imagefolder  # noqa: E402

GOAL = 1.5  # prepare-dataset's images/s over FFCV DatasetWriter's

FFCV_SCRIPT = """
import sys
from ffcv.fields import IntField, RGBImageField
from ffcv.writer import DatasetWriter
from torchvision.datasets import ImageFolder
dataset = ImageFolder(sys.argv[1])
writer = DatasetWriter(sys.argv[2], {"image": RGBImageField(write_mode="jpg", max_resolution=512,
                                                            jpeg_quality=90),
                                     "label": IntField()}, num_workers=2)
writer.from_indexed_dataset(dataset)
"""


def photo_folder(images: int) -> Path:
    per_class = images // 10
    root = ROOT / ".cache" / f"photos-{per_class}"
    write_shapes_imagefolder(root, train_per_class=per_class, val_per_class=0,
                             size=(500, 375), quality=90)
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    source = photo_folder(args.images)
    count = sum(1 for _ in (source / "train").rglob("*.jpg"))
    work = Path(tempfile.mkdtemp(prefix="bench-prepare-"))

    def ours() -> dict:
        shutil.rmtree(work / "ours", ignore_errors=True)
        return common.timed_command([sys.executable, "-m", "turbotrain", "prepare",
                                     str(source / "train"), str(work / "ours"), "--workers", "2",
                                     "--max-side", "512"])

    def plain_ffcv() -> dict:
        (work / "ffcv.beton").unlink(missing_ok=True)
        return common.timed_command([sys.executable, "-c", FFCV_SCRIPT, str(source / "train"),
                                     str(work / "ffcv.beton")])
    try:
        runs = common.interleaved(args.repeats, {"turbotrain": ours, "plain_ffcv": plain_ffcv},
                                  show=lambda r: f"{r['seconds']:.1f} s (load {r['load']:.2f})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "command": common.command_line(__file__, argv),
        "images": count,
        "turbotrain_images_per_second": count / common.best(runs["turbotrain"], "seconds",
                                                            lowest=True),
        "plain_ffcv_images_per_second": count / common.best(runs["plain_ffcv"], "seconds",
                                                            lowest=True),
        "runs": runs,
    }
    result["speedup"] = (result["turbotrain_images_per_second"]
                         / result["plain_ffcv_images_per_second"])
    result["goals"] = [common.ratio_goal("prepare-dataset / FFCV DatasetWriter",
                                         result["speedup"], GOAL)]
    common.write_results(RESULTS, result)
    print(f"prepare-dataset: {result['turbotrain_images_per_second']:.0f} images/s   "
          f"FFCV DatasetWriter: {result['plain_ffcv_images_per_second']:.0f} images/s   "
          f"ratio {result['speedup']:.2f}x (goal >= {GOAL}x)")
    return 0


def markdown(result: dict) -> str:
    return common.markdown(
        "Photo-like 500x375 q90 JPEGs to a .beton, 2 workers each, each a fresh process "
        "(start-up counts), best of the repeats.",
        common.md_table(["images", "prepare-dataset (images/s)", "FFCV DatasetWriter (images/s)",
                         "ratio", "goal"],
                        [[result["images"], common.rate(result["turbotrain_images_per_second"]),
                          common.rate(result["plain_ffcv_images_per_second"]),
                          common.times(result["speedup"]), f">= {GOAL:g}x"]]))


if __name__ == "__main__":
    sys.exit(main())
