"""Remote datasets: which object-store client (fsspec + s3fs or obstore), and what the shard
cache costs against a local folder.

    .venv/bin/python bench/bench_remote.py [--shard-mib 32] [--shards 4] [--rounds 3]

Our access pattern, against a local S3-compatible server (moto's, the one the tests start):

* whole shard: GET of a tens-of-MB object, streamed to a file in the cache folder (what
  `ShardCache` does for every shard a rank reads): MB/s;
* metadata: two small range reads of one shard, the header + field descriptors (2,106 bytes)
  then a metadata table of 10,000 rows (240 KB), as `RemoteShard.metadata()` reads them on open
  (no sample bytes): milliseconds per shard.

Each client runs in a fresh process (its own connection pool, nothing warm), the clients
alternate over --rounds and the best round counts (the machine is shared). The server runs in
this process: its speed bounds both clients alike, so the numbers compare the clients, not an
S3 region.

Then, through turbotrain itself (`open_dataset`), every sample of a 4-shard split of raw 32 px
images read (`split.read`, no decode: the pure data path, where a difference would show), shard
after shard, samples shuffled within each: from the local folder, from s3:// with a warm cache
(goal: >= 0.95x local), and from s3:// with an empty cache, whose MB/s of shards read (their
downloads, checksums and the reading; the open's range reads apart) is set against the store's
own bandwidth (the same shards downloaded by obstore alone).

Writes bench/results/remote.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "remote.json"
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import common  # noqa: E402

BUCKET, PREFIX = "bench-remote", "data"
HEADER_BYTES = 24 + 2 * 1041  # HEADER_DTYPE + two FIELD_DESC_DTYPE (docs/FORMAT.md)
METADATA_BYTES = 10_000 * 24  # 10,000 rows of our 24-byte metadata row
RANGE_REPEATS = 20


# -- one client, in a child process ---------------------------------------------------------------
def s3fs_client():
    import s3fs
    fs = s3fs.S3FileSystem()  # endpoint and keys from AWS_ENDPOINT_URL / AWS_* as set below

    def whole(key: str, dest: str) -> None:
        fs.get_file(f"{BUCKET}/{PREFIX}/{key}", dest)

    def ranges(key: str) -> None:
        path = f"{BUCKET}/{PREFIX}/{key}"
        fs.cat_file(path, start=0, end=HEADER_BYTES)
        fs.cat_file(path, start=HEADER_BYTES, end=HEADER_BYTES + METADATA_BYTES)
    return whole, ranges


def obstore_client():
    import obstore
    from obstore.store import from_url
    store = from_url(f"s3://{BUCKET}/{PREFIX}", client_options={"allow_http": True})

    def whole(key: str, dest: str) -> None:
        with open(dest, "wb") as f:
            for chunk in obstore.get(store, key).stream(min_chunk_size=1 << 20):
                f.write(chunk)

    def ranges(key: str) -> None:
        obstore.get_range(store, key, start=0, end=HEADER_BYTES)
        obstore.get_range(store, key, start=HEADER_BYTES, end=HEADER_BYTES + METADATA_BYTES)
    return whole, ranges


CLIENTS = {"s3fs": s3fs_client, "obstore": obstore_client}


def installed_clients() -> list[str]:
    """The clients that can run here: s3fs is only the comparison (no extra installs it)."""
    import importlib.util
    return [name for name in CLIENTS if importlib.util.find_spec(name) is not None]

# Raw 32 px samples: ~75 MB a shard. Opening a cached shard costs ~0.5 ms (its lock, the
# BetonFile checks, the metadata compared with the range reads'); with 2,500 samples a shard
# (10 ms of reading) that fixed cost alone made the warm cache 0.92x local, while the reads
# themselves ran at the same speed once open. Real shards (1 GB, 10,000+ photos, each decoded)
# spread it over seconds: 25,000 samples keep it under 1 % here too.
SPLIT_SHARDS, SPLIT_PER_SHARD = 4, 25_000


def make_split(folder: Path) -> Path:
    """A prepared folder with a 4-shard train split of random raw 32 px images (the tests'
    dataset, bigger: SPLIT_PER_SHARD)."""
    from turbotrain.datasets.synthetic import write_random_raw_dataset
    return write_random_raw_dataset(folder / "ds", shards=SPLIT_SHARDS, per_shard=SPLIT_PER_SHARD,
                                    val=10)


def read_split(where: str, cache_dir: str) -> dict:
    """Every sample of the train split at `where` (a folder or URL), shard by shard."""
    import numpy as np
    import obstore  # noqa: F401  (imported before the clock starts, as in a long run)
    from turbotrain.datasets import open_dataset
    started = time.perf_counter()
    split = open_dataset(where, "train", cache_dir=cache_dir, cache_limit="10GB")
    rng = np.random.default_rng(0)
    order = [rng.permutation(np.arange(split.shard_bounds[k], split.shard_bounds[k + 1]))
             for k in range(split.num_shards)]
    split.will_read(list(range(split.num_shards)))
    total = 0
    read_started = time.perf_counter()
    for block in order:
        for i in block:
            total += split.read(int(i))[0].nbytes
    done = time.perf_counter()
    # MB/s of stored shards over the reading (downloads included, the open's range reads not).
    return {"images_per_second": len(split) / (done - read_started),
            "open_seconds": read_started - started, "stored_mb": split.nbytes / 1e6,
            "mb_per_second": split.nbytes / 1e6 / (done - read_started), "sample_bytes": total}


def child(client: str, keys: list[str], shard_bytes: int) -> dict:
    if client.startswith("read:"):
        where, cache_dir = client[5:].rsplit("|", 1)
        return read_split(where, cache_dir)
    whole, ranges = CLIENTS[client]()
    version = __import__("fsspec" if client == "s3fs" else "obstore").__version__
    ranges(keys[0])  # connect once, untimed
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        for key in keys:
            whole(key, os.path.join(tmp, key))
        seconds = time.perf_counter() - started
        assert all(os.path.getsize(os.path.join(tmp, k)) == shard_bytes for k in keys)
    timings = []
    for i in range(RANGE_REPEATS):
        started = time.perf_counter()
        ranges(keys[i % len(keys)])
        timings.append(time.perf_counter() - started)
    return {"version": version, "whole_mb_per_second": len(keys) * shard_bytes / seconds / 1e6,
            "metadata_ms": 1000 * statistics.median(timings)}


# -- the parent: server, upload, rounds -----------------------------------------------------------
def start_server(shards: int, shard_bytes: int) -> tuple[object, list[str]]:
    """A moto S3 server on a free port, holding `shards` random objects; AWS_* set for it."""
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=f"http://{host}:{port}")
    import boto3
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    keys = [f"train-{i:05d}-of-{shards:05d}.beton" for i in range(shards)]
    for key in keys:
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{key}", Body=os.urandom(shard_bytes))
    return server, keys


def run_client(name: str, keys: list[str], shard_bytes: int) -> dict:
    result = common.run_child([__file__, "--child", name, "--keys", ",".join(keys),
                               "--shard-bytes", shard_bytes], timeout=300)
    if "error" in result:
        raise RuntimeError(f"{name} failed: {result['error']}")
    return result


def line(r: dict) -> str:
    if "images_per_second" in r:
        return (f"{r['images_per_second']:,.0f} samples/s read ({r['mb_per_second']:,.0f} MB/s "
                f"of shards, downloads included), open {1000 * r['open_seconds']:.0f} ms")
    return f"{r['whole_mb_per_second']:,.0f} MB/s whole shards, {r['metadata_ms']:.1f} ms metadata"


def run_read(where: str, cache_dir: str) -> dict:
    result = common.run_child([__file__, "--child", f"read:{where}|{cache_dir}"], timeout=300)
    if "error" in result:
        raise RuntimeError(f"reading {where} failed: {result['error']}")
    return result


def cache_rounds(rounds: int, tmp: Path) -> dict:
    """local vs warm cache vs cold cache (see the module docstring), and the store's MB/s."""
    import shutil

    import boto3
    folder = make_split(tmp)
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="bench-split")
    for path in sorted(folder.iterdir()):
        s3.upload_file(str(path), "bench-split", f"ds/{path.name}")
    url, warm, cold = "s3://bench-split/ds", tmp / "warm", tmp / "cold"
    run_read(url, str(warm))  # fills the warm cache

    def cold_read() -> dict:
        shutil.rmtree(cold, ignore_errors=True)
        return run_read(url, str(cold))

    keys = [p.name for p in sorted(folder.glob("train-*.beton"))]
    sizes = {p.stat().st_size for p in folder.glob("train-*.beton")}
    store = {"keys": keys, "prefix": "ds"}
    runs = common.interleaved(rounds, {
        "local": lambda: run_read(str(folder), str(tmp / "unused")),
        "warm cache": lambda: run_read(url, str(warm)),
        "cold cache": cold_read,
        "store (obstore alone)": lambda: run_store(store, max(sizes))}, show=line)
    return runs


def run_store(store: dict, shard_bytes: int) -> dict:
    result = common.run_child([__file__, "--child", "obstore", "--keys", ",".join(store["keys"]),
                               "--shard-bytes", shard_bytes, "--bucket", "bench-split",
                               "--prefix", store["prefix"]], timeout=300)
    if "error" in result:
        raise RuntimeError(f"obstore alone failed: {result['error']}")
    return {**result, "mb_per_second": result["whole_mb_per_second"]}


def main(argv: list[str] | None = None) -> int:
    global BUCKET, PREFIX  # a child reads another bucket's shards (cache_rounds' store side)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--shard-mib", type=int, default=32)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--keys", default="", help=argparse.SUPPRESS)
    parser.add_argument("--shard-bytes", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--bucket", default=BUCKET, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", default=PREFIX, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        BUCKET, PREFIX = args.bucket, args.prefix
        common.print_result(child(args.child, args.keys.split(","), args.shard_bytes))
        return 0

    shard_bytes = args.shard_mib << 20
    clients = installed_clients()
    if "s3fs" not in clients:
        print("note: s3fs is not installed (pip install s3fs): obstore alone, no client ratio")
    server, keys = start_server(args.shards, shard_bytes)
    try:
        runs = common.interleaved(args.rounds, {
            name: (lambda name=name: run_client(name, keys, shard_bytes)) for name in clients},
            show=line)
        with tempfile.TemporaryDirectory(prefix="bench-remote-") as tmp:
            reads = cache_rounds(args.rounds, Path(tmp))
    finally:
        server.stop()
    results = {name: {"version": runs[name][0]["version"],
                      "whole_mb_per_second": common.best(runs[name], "whole_mb_per_second"),
                      "metadata_ms": common.best(runs[name], "metadata_ms", lowest=True),
                      "runs": runs[name]} for name in clients}
    print(f"\n{args.shards} shards of {args.shard_mib} MiB, metadata = 2 range reads "
          f"({HEADER_BYTES:,} + {METADATA_BYTES:,} bytes), best of {args.rounds} rounds")
    for name, r in results.items():
        print(f"{name:<8} {r['version']:<10} {line(r)}")
    ratios = {}
    if "s3fs" in results:
        fast, slow = results["obstore"], results["s3fs"]
        ratios = {"whole": fast["whole_mb_per_second"] / slow["whole_mb_per_second"],
                  "metadata": slow["metadata_ms"] / fast["metadata_ms"]}
        print(f"obstore / s3fs: whole shards {ratios['whole']:.2f}x, "
              f"metadata {ratios['metadata']:.2f}x")
    from turbotrain.datasets.synthetic import RAW_SIDE
    local, warm = common.best(reads["local"]), common.best(reads["warm cache"])
    cold_run = common.best_run(reads["cold cache"], "mb_per_second") or {}
    cold = cold_run.get("mb_per_second")
    store = common.best(reads["store (obstore alone)"], "mb_per_second")
    ratios.update(warm_vs_local=common.ratio(warm, local), cold_vs_store=common.ratio(cold, store))
    print(f"\n{SPLIT_SHARDS} shards x {SPLIT_PER_SHARD} raw 32 px samples, read shard by shard: "
          f"local {local:,.0f}/s, warm cache {warm:,.0f}/s ({ratios['warm_vs_local']:.2f}x); "
          f"cold cache {cold:,.0f} MB/s of shards read, the store alone {store:,.0f} "
          f"MB/s ({ratios['cold_vs_store']:.2f}x)")
    common.write_results(RESULTS, {
        "command": common.command_line(__file__, argv), "shard_mib": args.shard_mib,
        "shards": args.shards, "rounds": args.rounds, "ratios": ratios, "results": results,
        "split": {"shards": SPLIT_SHARDS, "samples": SPLIT_SHARDS * SPLIT_PER_SHARD,
                  "side": RAW_SIDE},
        "read": {"local_images_per_second": local, "warm_images_per_second": warm,
                 "cold_images_per_second": cold_run.get("images_per_second"),
                 "cold_mb_per_second": cold, "store_mb_per_second": store},
        "reads": reads,
        "goals": [common.ratio_goal("remote with a warm cache vs local, samples/s",
                                    ratios["warm_vs_local"], 0.95)]})
    print(f"wrote {RESULTS}")
    return 0


def markdown(result: dict) -> str:
    split, read, ratios = result["split"], result["read"], result["ratios"]
    rate, times = common.rate, common.times
    return common.markdown(
        "Through `open_dataset`, against a local S3-compatible server (moto's, in the benchmark's "
        f"process): every sample of a {split['shards']}-shard split of {split['samples']:,} raw "
        f"{split['side']} px images, read shard after shard (shuffled within each, no decode), "
        f"each read in a fresh process, best of {result['rounds']} interleaved rounds.",
        common.md_table(["read from", "samples/s", "MB/s of shards", "vs local"], [
            ["local folder", rate(read["local_images_per_second"]), None, None],
            ["s3://, warm cache", rate(read["warm_images_per_second"]), None,
             times(ratios.get("warm_vs_local"))],
            ["s3://, empty cache (downloads included)", rate(read["cold_images_per_second"]),
             rate(read["cold_mb_per_second"]), None],
            ["the store alone (obstore downloads)", None, rate(read["store_mb_per_second"]),
             None]]),
        f"Empty cache / the store's own bandwidth: **{times(ratios.get('cold_vs_store'))}** of "
        "its MB/s (no goal: what a first epoch from object storage costs here).",
        f"Object-store clients, each in a fresh process: {result['shards']} whole shards of "
        f"{result['shard_mib']} MiB, and a shard's metadata (two range reads: header + field "
        f"descriptors, then a 10,000-row table), best of {result['rounds']} rounds.",
        common.md_table(["client", "version", "whole shards (MB/s)", "metadata (ms)"],
                        [[f"`{name}`", r.get("version"), rate(r.get("whole_mb_per_second")),
                          common.decimal(r.get("metadata_ms"), 2)]
                         for name, r in result["results"].items()]),
        f"obstore / s3fs: whole shards {times(ratios.get('whole'))}, metadata "
        f"{times(ratios.get('metadata'))} faster (no goal: why turbotrain reads through obstore).")


if __name__ == "__main__":
    # A child that read through obstore ends before finalizing, or its runtime can abort it
    # after its result line (turbotrain/process_end.py): a round would fail for nothing.
    from turbotrain.process_end import run_as_process
    run_as_process(main)
