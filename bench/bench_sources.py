"""Conversion speed by source kind: `prepare-dataset` on the same photos as an ImageFolder, as
WebDataset .tar shards and as Parquet (HF's Image struct, 100 rows a row group as `datasets`
writes image datasets), each run as a fresh process (start-up counts), 2 workers, max side 512,
interleaved over `--repeats` with the best counting (goal: each sharded source >= GOAL x the
ImageFolder's rate: reading a shard by offset or a row group must cost no more than opening
files):

    .venv/bin/python bench/bench_sources.py [--images 2000] [--repeats 2]

Writes bench/results/sources.json.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "sources.json"
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import common  # noqa: E402
from turbotrain.datasets.synthetic import write_shapes_imagefolder  # noqa: E402

GOAL = 0.9  # a sharded source's images/s over the ImageFolder's
SHARD_SAMPLES = 1000  # per .tar, as webdataset's ShardWriter(maxcount=...) would cut them
ROW_GROUP_ROWS = 100  # datasets' PARQUET_ROW_GROUP_SIZE_FOR_IMAGE_DATASETS


def photos(images: int) -> list[tuple[str, str, Path]]:
    """(class, key, file) of `images` photo-like 500x375 q90 JPEGs, cached in bench/.cache."""
    per_class = images // 10
    root = ROOT / ".cache" / f"photos-{per_class}"
    write_shapes_imagefolder(root, train_per_class=per_class, val_per_class=0,
                             size=(500, 375), quality=90)
    files = sorted((root / "train").glob("*/*.jpg"))
    return [(path.parent.name, f"{path.parent.name}-{path.stem}", path) for path in files]


def write_webdataset(items, folder: Path) -> None:
    import webdataset as wds
    folder.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(folder / "train-%06d.tar"), maxcount=SHARD_SAMPLES,
                         verbose=0) as sink:
        for name, key, path in items:
            sink.write({"__key__": key, "jpg": path.read_bytes(), "txt": name})


def write_parquet(items, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    with pq.ParquetWriter(path, pa.schema([("image", image), ("label", pa.string())])) as out:
        for start in range(0, len(items), ROW_GROUP_ROWS):
            rows = items[start:start + ROW_GROUP_ROWS]
            out.write_table(pa.table({
                "image": pa.array([{"bytes": p.read_bytes(), "path": None} for _, _, p in rows],
                                  type=image),
                "label": pa.array([name for name, _, _ in rows])}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    items = photos(args.images)
    work = Path(tempfile.mkdtemp(prefix="bench-sources-"))
    try:
        write_webdataset(items, work / "wds")
        write_parquet(items, work / "train.parquet")
        sources = {"imagefolder": items[0][2].parents[1], "webdataset": work / "wds",
                   "parquet": work / "train.parquet"}

        def contender(kind: str):
            def run() -> dict:
                shutil.rmtree(work / f"out-{kind}", ignore_errors=True)
                return common.timed_command([
                    sys.executable, "-m", "turbotrain", "prepare", str(sources[kind]),
                    str(work / f"out-{kind}"), "--workers", "2", "--max-side", "512"])
            return run
        runs = common.interleaved(args.repeats, {kind: contender(kind) for kind in sources},
                                  show=lambda r: f"{r['seconds']:.1f} s (load {r['load']:.2f})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rates = {kind: len(items) / common.best(runs[kind], "seconds", lowest=True)
             for kind in runs}
    result = {"command": common.command_line(__file__, argv), "images": len(items),
              "images_per_second": rates, "runs": runs,
              "ratios": {kind: rates[kind] / rates["imagefolder"]
                         for kind in ("webdataset", "parquet")}}
    result["goals"] = [common.ratio_goal(f"prepare from {kind} / from ImageFolder",
                                         result["ratios"][kind], GOAL)
                       for kind in ("webdataset", "parquet")]
    common.write_results(RESULTS, result)
    print("   ".join(f"{kind}: {rate:.0f} images/s" for kind, rate in rates.items())
          + f"   (goal: each sharded source >= {GOAL}x ImageFolder)")
    return 0


def markdown(result: dict) -> str:
    rates, ratios = result["images_per_second"], result["ratios"]
    return common.markdown(
        f"The same {result['images']} photo-like 500x375 q90 JPEGs as an ImageFolder, WebDataset "
        ".tar shards and Parquet (100-row groups), 2 workers, each a fresh process, best of the "
        "repeats.",
        common.md_table(["source", "prepare-dataset (images/s)", "vs ImageFolder"],
                        [[kind, common.rate(rates.get(kind)), common.times(ratios.get(kind, 1.0))]
                         for kind in ("imagefolder", "webdataset", "parquet")]))


if __name__ == "__main__":
    sys.exit(main())
