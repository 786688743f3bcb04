"""What turbotrain would do for the data side of an input-bound script whose DataLoader reads
an ImageFolder: `prepare-dataset` once, then `turbotrain.Loader`. The estimate is measured
here, not assumed: a sample of the folder's images (SAMPLE_PER_CLASS from each class, at
most SAMPLE_CLASSES classes) is prepared into a temporary folder and `turbotrain bench`'s
`measure` times our streaming CPU pipeline on it at the script's batch and image size, against the
script's own loader rate (its measured seconds per batch, times its workers).
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from turbotrain.datasets import DatasetError, open_dataset
from turbotrain.datasets.prepare.convert import PrepareError, prepare_dataset
from turbotrain.datasets.prepare.options import PrepareOptions
from turbotrain.datasets.sources.source import IMAGE_EXTENSIONS
from turbotrain.files.safe_create import write_file
from turbotrain.pipeline.bench import measure
from turbotrain.pipeline.registry import streaming_cpu_pipeline

SAMPLE_PER_CLASS = 32
SAMPLE_CLASSES = 16
BENCH_BATCHES, BENCH_WARMUP = 10, 2


def wants_estimate(process: dict) -> bool:
    """An input-bound run whose DataLoader reads a folder of class folders."""
    loader = (process.get("loaders") or [None])[-1]
    root = loader and loader.get("root")
    return process.get("verdict") == "input-bound" and bool(root) and Path(root).is_dir()


def sample_folder(root: Path, into: Path) -> int:
    """Copies up to SAMPLE_PER_CLASS images of up to SAMPLE_CLASSES classes; their count."""
    copied = 0
    classes = sorted(p for p in root.iterdir() if p.is_dir())[:SAMPLE_CLASSES]
    for folder in classes:
        images = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)
        for image in images[:SAMPLE_PER_CLASS]:
            (into / folder.name).mkdir(parents=True, exist_ok=True)
            write_file(into / folder.name / image.name, image.read_bytes(), overwrite=False)
            copied += 1
    return copied


def turbotrain_estimate(process: dict, cores: int) -> dict:
    """{"images_per_second", "yours", "sample", "root"} or {"error": one line}."""
    loader = process["loaders"][-1]
    root = Path(loader["root"])
    batch = int(loader.get("batch_size") or 32)
    shape = (process.get("model") or {}).get("input_shape") or [batch, 3, 224, 224]
    image_size = int(shape[-1])
    load = process.get("load_ms_per_batch")
    yours = (1000 * batch / load * max(1, loader["num_workers"])) if load else None
    work = Path(tempfile.mkdtemp(prefix="turbotrain-doctor-data-"))
    try:
        images = sample_folder(root, work / "source")
        if images < batch:
            return {"error": f"{root} has {images} images in class folders: fewer than a batch"}
        prepare_dataset(str(work / "source"), str(work / "prepared"),
                        PrepareOptions(workers=1, progress=False))
        ours = streaming_cpu_pipeline()
        rate = measure(open_dataset(work / "prepared"), [ours], image_size=image_size,
                       batch_size=batch, batches=BENCH_BATCHES, warmup=BENCH_WARMUP,
                       workers=cores, device="cpu")[ours]
    except (PrepareError, DatasetError, OSError) as e:
        return {"error": str(e).splitlines()[0][:200]}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if rate.get("images_per_second") is None:
        return {"error": rate.get("error", f"the {ours} pipeline did not run")}
    return {"images_per_second": round(rate["images_per_second"], 1),
            "yours": round(yours, 1) if yours else None, "sample": images, "root": str(root),
            "image_size": image_size, "batch_size": batch}

