"""Quasi-random against random order on a split 4x larger than a page-cache limit.

    .venv/bin/python bench/bench_order.py [--mib 2048] [--limit-mib 512] [--seconds 12] [--rounds 2]

Data (generated once, cached under bench/.cache/order/): a bare `.beton` of --mib MiB of raw
64x64 images (12 KiB each, ~175,000 for 2 GiB: the size of downsampled ImageNet's samples),
random pixels and labels (a shuffled split, as the plan's `--order auto` requires).

What is measured, and how the memory limit is imposed. A cgroup memory limit needs root, so the
loader process limits the page cache its split may take: after every batch it counts the
file's resident pages (mincore(2) on its map) and, past --limit-mib, drops the whole file from
the page cache (madvise MADV_DONTNEED on its map, then posix_fadvise POSIX_FADV_DONTNEED;
`fincore` confirms the file leaves the cache). It also starts cold. So the split never holds
more than --limit-mib (plus one batch's reads) of cache. This is harsher than a kernel LRU of
the same size (which would keep the most recent pages instead of none), it is applied to both
orders alike, and the mincore call costs both the same (~1 ms a batch); it does not model
other processes' use of memory. Disk reads go to this VM's virtual disk (whose host may
cache it: the absolute numbers are this machine's, the ratio is the point). The kernel reads
around each page fault of a mapped file (read_ahead_kb, printed with the results): a random
order uses one 12 KiB sample of each such read, a quasi-random one uses all of them while its
window (4 blocks of 64 MiB = 256 MiB) is read.

Contenders, each in a fresh process, --seconds each after 3 untimed batches, interleaved over
--rounds (best round counts):

* read_random / read_quasi: the order's batches of sample indices, every stored byte of each
  sample touched (a sum): the read path alone;
* pytorch_random / pytorch_quasi: the `pytorch` pipeline (2 decode threads, pad-crop + flip
  at 64 px, batch 256), the loader a training run uses on a CPU.

Writes bench/results/order.json; part of `make bench` (bench/run_all.py).
"""
from __future__ import annotations

import argparse
import mmap
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
CACHE = ROOT / ".cache" / "order"
RESULTS = ROOT / "results" / "order.json"
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import common  # noqa: E402

SIDE = 64
BATCH = 256
WARMUP_BATCHES = 3
CONTENDERS = {
    "read_random": "random order, stored bytes touched (read path only)",
    "read_quasi": "quasi-random order (window 4 x 64 MiB), stored bytes touched",
    "pytorch_random": "pytorch pipeline, random order",
    "pytorch_quasi": "pytorch pipeline, quasi-random order",
}
# Ratios reported. The issue sets no goal for them; ours is that quasi-random order is not
# slower than random where training sees it (the pipeline, >= 1x): it exists to be faster
# when the split does not fit in memory, and must cost nothing when reading is not the limit.
RATIOS = [("read_quasi", "read_random"), ("pytorch_quasi", "pytorch_random")]
GOAL = ("pytorch_quasi", "pytorch_random", 1.0)


def write_split(mib: int) -> Path:
    """A bare .beton of about `mib` MiB of raw SIDE x SIDE images (cached)."""
    import numpy as np

    from turbotrain.datasets.beton import layout
    from turbotrain.datasets.beton.writer import BetonWriter
    path = CACHE / f"raw{SIDE}-{mib}mib.beton"
    if path.exists():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    sample = SIDE * SIDE * 3
    count = mib * 2**20 // sample
    rng = np.random.default_rng(0)
    partial = path.with_suffix(".partial")
    with BetonWriter(partial, count, page_size=layout.MIN_PAGE_SIZE) as writer:
        for start in range(0, count, 4096):
            chunk = rng.integers(0, 256, size=(min(4096, count - start), sample), dtype=np.uint8)
            labels = rng.integers(0, 100, size=len(chunk))
            for pixels, label in zip(chunk, labels):
                writer.append(layout.MODE_RAW, SIDE, SIDE, pixels.tobytes(), int(label))
    partial.rename(path)
    return path


class CacheLimit:
    """Keeps the split's file under `limit` bytes of page cache: after each batch, mincore(2)
    counts its resident pages; past the limit, the whole file is dropped."""

    def __init__(self, split, limit: int):
        import ctypes

        import numpy as np
        self.split, self.limit, self.drops = split, limit, 0
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.length = split.beton.file_size
        self.vector = np.zeros(-(-self.length // self.page), dtype=np.uint8)
        self.drop()

    def resident(self) -> int:
        address = self.split.beton._map.ctypes.data
        if self.libc.mincore(address, self.length, self.vector.ctypes.data) != 0:
            raise OSError(ctypes_errno(), "mincore failed")
        return int((self.vector & 1).sum()) * self.page

    def drop(self) -> None:
        self.split.beton._map._mmap.madvise(mmap.MADV_DONTNEED)  # unmap our pages first
        fd = os.open(self.split.beton.path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        self.drops += 1

    def took(self, indices) -> None:
        if self.resident() > self.limit:
            self.drop()


def ctypes_errno() -> int:
    import ctypes
    return ctypes.get_errno()


def child(args) -> dict:
    import numpy as np
    import torch

    from turbotrain.datasets import open_dataset
    from turbotrain.pipeline import PipelineOptions, build_pipeline
    from turbotrain.pipeline.order import order_for
    torch.set_num_threads(1)
    split = open_dataset(args.data)
    kind, order_name = args.child.split("_")
    options = dict(train=True, batch_size=BATCH, image_size=SIDE, device=torch.device("cpu"),
                   workers=2, order="quasi-random" if order_name == "quasi" else "random")
    limit = CacheLimit(split, args.limit_mib * 2**20)
    if kind == "read":
        order = order_for(split, PipelineOptions(**options))
        beton = split.beton

        def batches():
            epoch = 0
            while True:
                for indices in order.batches(epoch):
                    for i in indices.tolist():
                        beton.payload(i).sum(dtype=np.uint64)  # every byte read
                    yield indices
                epoch += 1
        stream = batches()
        take = next
    else:
        pipeline = build_pipeline("pytorch", split, **options)

        def epochs():  # the indices of each batch the pipeline hands over
            epoch = 0
            while True:
                pipeline.set_epoch(epoch)
                for (_, labels), indices in zip(pipeline, pipeline.order.batches(epoch)):
                    assert len(labels) == len(indices)
                    yield indices
                epoch += 1
        stream = epochs()
        take = next
    for _ in range(WARMUP_BATCHES):
        limit.took(take(stream))
    started, images = time.perf_counter(), 0
    while time.perf_counter() - started < args.seconds:
        indices = take(stream)
        limit.took(indices)
        images += len(indices)
    elapsed = time.perf_counter() - started
    stored = images * SIDE * SIDE * 3
    return {"images_per_second": images / elapsed,
            "stored_mib_per_second": stored / elapsed / 2**20, "images": images,
            "seconds": elapsed, "cache_drops": limit.drops}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--mib", type=int, default=2048, help="split size in MiB (default 2048)")
    p.add_argument("--limit-mib", type=int, default=512,
                   help="page-cache limit of the split in MiB (default 512: the split is 4x "
                   "it, the quasi-random window of 256 MiB half of it)")
    p.add_argument("--seconds", type=float, default=12.0, help="timed seconds per contender")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        common.print_result(child(args))
        return 0
    started = time.perf_counter()
    data = write_split(args.mib)
    print(f"split: {data} ({data.stat().st_size / 2**20:.0f} MiB), page-cache limit "
          f"{args.limit_mib} MiB", flush=True)

    def contender(name):
        return lambda: common.run_child(
            [__file__, "--child", name, "--data", data, "--limit-mib", args.limit_mib,
             "--seconds", args.seconds, "--mib", args.mib], timeout=args.seconds * 10 + 120)
    runs = common.interleaved(args.rounds, {name: contender(name) for name in CONTENDERS})
    best = {name: common.best_run(results) for name, results in runs.items()}
    rate = {name: (b or {}).get("images_per_second") for name, b in best.items()}
    ratios = [{"what": f"{ours} / {theirs}", "ratio": common.ratio(rate[ours], rate[theirs])}
              for ours, theirs in RATIOS]
    readahead = Path("/sys/block") / _disk_of(data) / "queue" / "read_ahead_kb"
    result = {"split_mib": args.mib, "limit_mib": args.limit_mib,
              "side": SIDE, "sample_bytes": SIDE * SIDE * 3,
              "read_ahead_kb": _read(readahead), "contenders": CONTENDERS, "runs": runs,
              "best": best, "ratios": ratios,
              "goals": [common.ratio_goal(
                  f"quasi-random vs random order, pytorch pipeline, split "
                  f"{args.mib / args.limit_mib:g}x the page-cache limit",
                  common.ratio(rate[GOAL[0]], rate[GOAL[1]]), GOAL[2])],
              "command": common.command_line(__file__, argv),
              "wall_seconds": time.perf_counter() - started}
    common.write_results(RESULTS, result)
    for name in CONTENDERS:
        shown = f"{rate[name]:,.0f} images/s" if rate[name] else "failed"
        print(f"{name:<16} {shown:>16}  {CONTENDERS[name]}")
    for r in ratios:
        print(f"{r['what']}: " + (f"{r['ratio']:.2f}x" if r["ratio"] else "not measured"))
    return 0


def _disk_of(path: Path) -> str:
    """The block device under `path` (for its read_ahead_kb), e.g. "vda"; "" if unknown."""
    try:
        dev = os.stat(path).st_dev
        name = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve()
        return name.parent.name if (name.parent / "queue").exists() else name.name
    except OSError:
        return ""


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def markdown(result: dict) -> str:
    rows = []
    for name, what in result["contenders"].items():
        best = result["best"].get(name) or {}
        rows.append([f"`{name}`", common.rate(best.get("images_per_second")),
                     common.rate(best.get("stored_mib_per_second")), best.get("cache_drops"),
                     what if best else common.run_error(result["runs"].get(name, []))])
    return common.markdown(
        f"A split of {result['split_mib']} MiB of raw images ({result['sample_bytes']:,} bytes "
        f"each) read with a page-cache limit of {result['limit_mib']} MiB (the loader drops the "
        f"file from the cache past it; read_ahead_kb {result['read_ahead_kb']}), each contender "
        "in a fresh process, best of the interleaved rounds. The absolute numbers are this "
        "machine's virtual disk; the ratio is the point.",
        common.md_table(["contender", "images/s", "MiB/s stored", "cache drops", "what"], rows),
        "Quasi-random / random: " + "; ".join(f"{r['what']} **{common.times(r['ratio'])}**"
                                              for r in result["ratios"]) + ".")


if __name__ == "__main__":
    sys.exit(main())
