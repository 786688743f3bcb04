"""Conversion speed: the whole `prepare-dataset` command against FFCV's `DatasetWriter`.

Same source (photo-like ~500x375 q90 JPEGs as an ImageFolder), 2 workers each, max side 512,
measured in one run, each as a fresh process so start-up (imports) counts:

    .venv/bin/python bench/bench_prepare.py [--images 3000]

Writes bench/results/prepare.json.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from turbotrain.datasets.synthetic import write_shapes_imagefolder  # noqa: E402

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


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    source = photo_folder(args.images)
    count = sum(1 for _ in (source / "train").rglob("*.jpg"))
    work = Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    ours, theirs = [], []
    try:
        for _ in range(args.repeats):  # interleaved: a noisy neighbour hurts both alike
            shutil.rmtree(work / "ours", ignore_errors=True)
            ours.append(timed([sys.executable, "-m", "turbotrain", "prepare", str(source / "train"),
                               str(work / "ours"), "--workers", "2", "--max-side", "512"]))
            (work / "ffcv.beton").unlink(missing_ok=True)
            theirs.append(timed([sys.executable, "-c", FFCV_SCRIPT, str(source / "train"),
                                 str(work / "ffcv.beton")]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "images": count,
        "turbotrain_images_per_second": count / min(ours),
        "ffcv_images_per_second": count / min(theirs),
    }
    result["speedup"] = result["turbotrain_images_per_second"] / result["ffcv_images_per_second"]
    (ROOT / "results").mkdir(exist_ok=True)
    (ROOT / "results" / "prepare.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"prepare-dataset: {result['turbotrain_images_per_second']:.0f} images/s   "
          f"FFCV DatasetWriter: {result['ffcv_images_per_second']:.0f} images/s   "
          f"ratio {result['speedup']:.2f}x (goal >= 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
