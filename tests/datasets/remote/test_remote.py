"""Datasets in object storage: a real S3 server (moto's, tests/datasets/s3_server.py) read
through our obstore client and shard cache, compared with the same folder read locally."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.datasets.s3_server import CuttingProxy
from turbotrain.datasets import DatasetError, open_dataset
from turbotrain.datasets.beton.shards import shard_filename
from turbotrain.datasets.remote.shard_cache import ShardCache, cache_key
from turbotrain.datasets.remote.split import cache_settings
from turbotrain.datasets.synthetic import RAW_SIDE, write_random_raw_dataset

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast

REPO = Path(__file__).resolve().parents[3]
SIDE = RAW_SIDE  # raw 32x32 RGB samples: 3 KiB each, exact pixels to compare


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def dataset(s3_server, tmp_path_factory):
    """(local folder, its s3:// URL): 4 train shards + an unsharded val split."""
    out = write_random_raw_dataset(tmp_path_factory.mktemp("remote") / "ds")
    return out, s3_server.upload(out, "sharded")


def cache_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.beton*") if p.is_file())


def read_all(split) -> list[tuple[bytes, int]]:
    return [(split.image(i).tobytes(), int(split.labels[i])) for i in range(len(split))]


def test_every_sample_equals_local(dataset, tmp_path):
    out, url = dataset
    for split in ("train", "val"):  # sharded, and unsharded (one shard)
        remote = open_dataset(url, split, cache_dir=tmp_path / "cache", cache_limit="1GB")
        local = open_dataset(out, split)
        assert remote.num_shards == local.num_shards
        assert np.array_equal(remote.shard_bounds, local.shard_bounds)
        assert read_all(remote) == read_all(local)
        assert remote.classes == local.classes


def test_open_reads_metadata_by_ranges_only(s3_server, dataset, tmp_path):
    _, url = dataset
    before = len(s3_server.requests)
    split = open_dataset(url, "train", cache_dir=tmp_path / "cache", cache_limit="1GB")
    opened = s3_server.requests[before:]
    shard_gets = [r for r in opened if r[0] == "GET" and "/train-" in r[1]]
    assert shard_gets and all(r[2] for r in shard_gets), "a whole shard was downloaded on open"
    assert len(shard_gets) <= 3 * split.num_shards  # header, metadata table, allocation table
    assert cache_bytes(tmp_path / "cache") == 0
    split.image(0)  # the first read downloads shard 0, whole, once
    whole = [r for r in s3_server.requests[before:] if r[0] == "GET" and "/train-" in r[1]
             and not r[2]]
    assert len(whole) == 1 and "train-00000-of-00004" in whole[0][1]


def test_a_run_fetches_dataset_json_once(s3_server, dataset, tmp_path):
    """Issue 33: a run opens the train split, asks whether there is a val split and opens it
    (train/engine/data.py open_splits, what builder.py calls): dataset.json is fetched once,
    where it was fetched three times."""
    from turbotrain.train.engine.data import open_splits  # the trainer's (loads torch)
    _, url = dataset
    before = len(s3_server.requests)
    train, val, missing, _ = open_splits(url, cache_dir=tmp_path / "cache", cache_limit="1GB")
    assert missing == "" and len(val) == len(open_dataset(dataset[0], "val"))
    assert val.info is train.info
    index = [r for r in s3_server.requests[before:] if r[1].split("?")[0].endswith("/dataset.json")]
    assert sorted(r[0] for r in index) == ["GET", "HEAD"], index  # its size, then its bytes


def test_cache_limit_respected_while_reading_everything(dataset, tmp_path):
    out, url = dataset
    shard_bytes = max(e["bytes"] for e in json.loads((out / "dataset.json").read_text())
                      ["splits"]["train"]["shards"])
    limit = int(2.5 * shard_bytes)  # room for two shards: the read one and one prefetched
    cache = tmp_path / "cache"
    split = open_dataset(url, "train", cache_dir=cache, cache_limit=limit)
    seen, stop = [], threading.Event()

    def watch():  # the folder's total, sampled while shards download and get evicted
        while not stop.is_set():
            seen.append(cache_bytes(cache))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for epoch in range(2):
            split.will_read([3, 1, 0, 2] if epoch else [0, 1, 2, 3])
            order = np.concatenate([np.arange(split.shard_bounds[k], split.shard_bounds[k + 1])
                                    for k in ([3, 1, 0, 2] if epoch else [0, 1, 2, 3])])
            local = open_dataset(out, "train")
            for i in order:
                assert split.image(i).tobytes() == local.image(i).tobytes()
                seen.append(cache_bytes(cache))
    finally:
        stop.set()
        watcher.join()
    assert max(seen) <= limit, f"cache held {max(seen)} bytes, limit {limit}"
    assert max(seen) > shard_bytes  # it did cache (and prefetch) beyond one shard


def _fake_download(payload: bytes):
    def write(f) -> None:
        f.write(payload)
    return write


def _keys(folder: Path) -> list[str]:
    """The keys of the shard files in a cache folder (`<key>.<random>.beton`)."""
    return sorted(p.name.split(".")[0] for p in folder.glob("*.beton"))


def test_lru_eviction_order(tmp_path):
    cache = ShardCache(tmp_path, 3000)
    for key in "abc":
        cache.acquire(key, 1000, _fake_download(key.encode() * 1000), what=key)
        cache.release(key)
        time.sleep(0.01)  # distinct mtimes
    hit = cache.acquire("a", 1000, _fake_download(b"x" * 1000), what="a")  # a is now newest
    cache.release("a")
    cache.acquire("d", 1000, _fake_download(b"d" * 1000), what="d")
    assert _keys(tmp_path) == ["a", "c", "d"]  # b was oldest
    assert hit.read_bytes() == b"a" * 1000  # served from the cache


def test_held_shards_are_not_evicted_and_too_large_is_one_line(tmp_path):
    cache = ShardCache(tmp_path, 2000)
    cache.acquire("a", 1000, _fake_download(b"a" * 1000), what="a")  # held
    cache.acquire("b", 1000, _fake_download(b"b" * 1000), what="b")
    cache.release("b")
    cache.acquire("c", 1000, _fake_download(b"c" * 1000), what="c")
    assert _keys(tmp_path) == ["a", "c"]
    with pytest.raises(DatasetError, match="--cache-limit") as err:
        cache.acquire("big", 5000, _fake_download(b""), what="s3://b/big.beton")
    assert "\n" not in str(err.value)


def test_cache_limit_from_the_flag_else_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TURBOTRAIN_CACHE_LIMIT", "2GiB")
    assert cache_settings(tmp_path, "50GB") == (tmp_path, 50 * 10**9)
    assert cache_settings(tmp_path, None) == (tmp_path, 2 << 30)
    with pytest.raises(DatasetError, match="^--cache-limit '12 parsecs'"):
        cache_settings(tmp_path, "12 parsecs")
    monkeypatch.setenv("TURBOTRAIN_CACHE_LIMIT", "0")
    with pytest.raises(DatasetError, match=r"^\$TURBOTRAIN_CACHE_LIMIT '0'"):
        cache_settings(tmp_path, None)


READER = """
import sys
from turbotrain.datasets import open_dataset
split = open_dataset(sys.argv[1], "train", cache_dir=sys.argv[2], cache_limit="1GB")
print(sum(int(split.image(i).sum()) for i in range(len(split))))
"""


def test_processes_share_the_cache_without_downloading_twice(s3_server, dataset, tmp_path):
    _, url = dataset
    before = len(s3_server.requests)
    env = {**s3_server.env(), "PYTHONPATH": str(REPO)}
    children = [subprocess.Popen([sys.executable, "-c", READER, url, str(tmp_path / "cache")],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for _ in range(3)]
    results = [child.communicate(timeout=180) for child in children]
    assert all(child.returncode == 0 for child in children), [r[1][-500:] for r in results]
    assert len({r[0] for r in results}) == 1  # all read the same pixels
    whole = [r[1] for r in s3_server.requests[before:] if r[0] == "GET" and "/train-" in r[1]
             and not r[2]]
    assert len(whole) == 4 and len(set(whole)) == 4, whole  # each shard downloaded once


HANGING_DOWNLOAD = """
import sys, time
from pathlib import Path
from turbotrain.datasets.remote.shard_cache import ShardCache
def download(f):
    f.write(b"x" * 500)
    f.flush()
    print("writing", flush=True)
    time.sleep(600)
ShardCache(sys.argv[1], 10_000).acquire("k", 1000, download, what="k")
"""


def test_a_killed_download_leaves_no_corrupt_shard(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", HANGING_DOWNLOAD, str(tmp_path)],
                             env={**os.environ, "PYTHONPATH": str(REPO)},
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "writing"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    (killed,) = tmp_path.glob("k.*.beton")  # the killed download's file, recorded incomplete
    cache = ShardCache(tmp_path, 10_000)
    path = cache.acquire("k", 1000, _fake_download(b"y" * 1000), what="k")  # not blocked
    assert path.read_bytes() == b"y" * 1000  # never the half-written file
    assert path != killed and not killed.exists()  # which the next download removed


def test_a_connection_dropped_mid_shard_is_retried(s3_server, dataset, tmp_path, monkeypatch):
    out, url = dataset
    smallest = min(p.stat().st_size for p in out.glob("train-*.beton"))
    proxy = CuttingProxy(s3_server.endpoint, after_bytes=smallest // 2, cut_first=2)  # mid-body
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    try:
        split = open_dataset(url, "train", cache_dir=tmp_path / "cache", cache_limit="1GB")
        assert read_all(split) == read_all(open_dataset(out, "train"))
    finally:
        proxy.close()
    assert proxy.cuts == 2  # two shard downloads were cut mid-way, and resumed


def test_cache_key_changes_with_the_content():
    assert cache_key("s3://b/x.beton", "a" * 64) != cache_key("s3://b/x.beton", "b" * 64)


def _train(url: str, env: dict, tmp_path: Path):
    return subprocess.run([sys.executable, "-m", "turbotrain", "train", "--data", url,
                           "--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "c"),
                           "--epochs", "1", "--device", "cpu"],
                          capture_output=True, text=True, timeout=240,
                          env={**env, "PYTHONPATH": str(REPO)})


def test_missing_object_is_one_line(s3_server, dataset, tmp_path):
    result = _train("s3://sharded/no-such-prefix", s3_server.env(), tmp_path)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "s3://sharded/no-such-prefix/dataset.json" in lines[0] and "404" in lines[0]


def test_denied_credential_is_one_line_without_the_secret(s3_server, dataset,
                                                         denied_s3_server, tmp_path):
    _, url = dataset
    result = _train(url, s3_server.env(endpoint=denied_s3_server), tmp_path)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert url in lines[0] and "denied" in lines[0]
    secret = s3_server.env()["AWS_SECRET_ACCESS_KEY"]
    assert secret not in result.stderr + result.stdout


def test_a_replaced_shard_is_refused(s3_server, tmp_path):
    out = write_random_raw_dataset(tmp_path / "ds", shards=2, per_shard=10, val=5)
    url = s3_server.upload(out, "replaced")
    split = open_dataset(url, "train", cache_dir=tmp_path / "cache", cache_limit="1GB")
    other = write_random_raw_dataset(tmp_path / "other", shards=2, per_shard=10, val=5, seed=1)
    s3_server.client().upload_file(str(other / shard_filename("train", 1, 2)), "replaced",
                                   f"data/{shard_filename('train', 1, 2)}")
    with pytest.raises(DatasetError, match="SHA-256") as err:
        split.image(15)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------ training from s3://

def test_a_rank_downloads_only_the_shards_it_reads(s3_server, tmp_path):
    """Rank 0 of 2 with the quasi-random order: the shards downloaded are those its samples
    are in (the prefetch follows its own sequence), not the other rank's."""
    from turbotrain.pipeline import build_pipeline
    out = write_random_raw_dataset(tmp_path / "ds", shards=4, per_shard=16, val=4)
    url = s3_server.upload(out, "ranked")
    split = open_dataset(url, "train", cache_dir=tmp_path / "cache", cache_limit="1GB")
    before = len(s3_server.requests)
    with build_pipeline("pytorch", split, train=True, batch_size=8, image_size=SIDE,
                        device="cpu", seed=0, rank=0, world_size=2, workers=0,
                        order="quasi-random", order_window=2) as pipeline:
        pipeline.set_epoch(0)
        assert sum(len(labels) for _, labels in pipeline) == 32
        read = {split.shard_of(i) for batch in pipeline.order.batches(0) for i in batch}
    whole = {r[1].rsplit("/", 1)[1] for r in s3_server.requests[before:]
             if r[0] == "GET" and "/train-" in r[1] and not r[2]}
    assert whole == {shard_filename("train", k, 4) for k in read}
    assert len(whole) < 4, whole  # the other rank's shards are never fetched


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_two_ranks_train_from_s3_and_a_killed_run_resumes_the_same(s3_server, tmp_path):
    """torchrun, 2 CPU ranks (Gloo), quasi-random order over 4 shards in s3://, a shared
    cache: a run killed with SIGKILL mid-epoch and resumed logs the same losses as one that
    was never interrupted."""
    import torch

    from tests.train.conftest import logged_steps, step_losses, wait_until
    from tests.train.step.test_ddp import kill_job, run_torchrun, start_torchrun
    from turbotrain.train.records.checkpoint import checkpoint_path
    out = write_random_raw_dataset(tmp_path / "ds", shards=4, per_shard=48, val=16)
    url = s3_server.upload(out, "ddp")
    steps = 2 * (4 * 48) // 16  # 2 epochs, global batch 2 x 8
    args = ("--data", url, "--cache-dir", tmp_path / "cache", "--cache-limit", "64MiB",
            "--order", "quasi-random", "--order-window", 2, "--pipeline", "pytorch",
            "--epochs", 2, "--batch-size", 8, "--threads", 1, "--workers", 0, "--log-every", 1,
            "--checkpoint-every", 4, "--deterministic", "--seed", 0, "--device", "cpu")
    full = tmp_path / "full"
    run_torchrun(*args, "--out", full, tmp_path=tmp_path, timeout=180)
    reference = step_losses(full)
    assert sorted(reference) == list(range(1, steps + 1))

    killed, pids, log = tmp_path / "killed", tmp_path / "pids-killed", tmp_path / "killed.log"
    proc = start_torchrun(*args, "--out", killed, pid_dir=pids, log=log)
    try:
        wait_until(lambda: logged_steps(killed) >= 6, proc, timeout=120, log=log)
    finally:
        kill_job(proc, pids)
    saved = torch.load(checkpoint_path(killed), weights_only=False)["counters"]
    assert 4 <= saved["step"] < steps
    run_torchrun("--out", killed, "--resume", tmp_path=tmp_path, timeout=180)
    assert step_losses(killed) == reference


def test_a_remote_split_pickles_for_worker_processes(dataset, tmp_path):
    import pickle
    out, url = dataset
    split = open_dataset(url, "train", cache_dir=tmp_path / "cache", cache_limit="1GB")
    split.image(0)
    copy = pickle.loads(pickle.dumps(split))  # what a DataLoader worker process gets
    local = open_dataset(out, "train")
    assert copy.image(len(copy) - 1).tobytes() == local.image(len(local) - 1).tobytes()


def test_keys_from_an_aws_credentials_file(s3_server, dataset, tmp_path):
    """No AWS_* keys in the environment: boto3's chain finds them in the shared credentials
    file (~/.aws/credentials; AWS_SHARED_CREDENTIALS_FILE points there)."""
    from tests.datasets.s3_server import FAKE_KEYS
    _, url = dataset
    (tmp_path / "credentials").write_text(
        "[default]\naws_access_key_id = key-from-the-credentials-file\n"
        f"aws_secret_access_key = {FAKE_KEYS['AWS_SECRET_ACCESS_KEY']}\n")
    (tmp_path / "config").write_text("[default]\nregion = us-east-1\n")
    env = {k: v for k, v in s3_server.env().items() if k not in FAKE_KEYS}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "credentials"),
               AWS_CONFIG_FILE=str(tmp_path / "config"), PYTHONPATH=str(REPO))
    before = len(s3_server.requests)
    done = subprocess.run([sys.executable, "-c", READER, url, str(tmp_path / "cache")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) > 0
    signers = {r[3] for r in s3_server.requests[before:]}
    assert signers == {"key-from-the-credentials-file"}, signers


def test_a_crafted_allocation_pointer_is_refused_without_reading_the_data(s3_server, tmp_path):
    """A header whose allocation table "starts" at byte 4096 would make the table read fetch
    the whole file into memory: refused on one line, and nothing past the header is read."""
    out = write_random_raw_dataset(tmp_path / "ds", shards=2, per_shard=10, val=5)
    shard = out / shard_filename("train", 0, 2)
    data = bytearray(shard.read_bytes())
    data[16:24] = (4096).to_bytes(8, "little")  # HEADER_DTYPE's alloc_table_ptr
    shard.write_bytes(bytes(data))
    info = json.loads((out / "dataset.json").read_text())
    info["splits"]["train"]["shards"][0]["sha256"] = _sha256(shard)
    (out / "dataset.json").write_text(json.dumps(info))
    url = s3_server.upload(out, "crafted")
    before = len(s3_server.requests)
    with pytest.raises(DatasetError, match="allocation table") as err:
        open_dataset(url, "train", cache_dir=tmp_path / "cache", cache_limit="1GB")
    assert "\n" not in str(err.value) and "crafted/data/train-00000" in str(err.value)
    ranges = [r[2] for r in s3_server.requests[before:] if "train-00000" in r[1]]
    assert len(ranges) == 2 and all(ranges), ranges  # the header, the metadata table


def test_a_dataset_sharded_by_prepare_reads_the_same_from_s3(s3_server, tmp_path):
    """`prepare-dataset --shard-size` output, uploaded as it is."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (6000, SIDE, SIDE, 3), dtype=np.uint8)
    np.savez(tmp_path / "src.npz", images=images, labels=np.arange(6000) % 7)
    out = tmp_path / "ds"
    done = subprocess.run([sys.executable, "-m", "turbotrain", "prepare", str(tmp_path / "src.npz"),
                           str(out), "--shard-size", "8MiB", "--val-fraction", "0.1",
                           "--workers", "1"], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    url = s3_server.upload(out, "prepared")
    for split in ("train", "val"):
        remote = open_dataset(url, split, cache_dir=tmp_path / "cache", cache_limit="1GB")
        local = open_dataset(out, split)
        assert remote.num_shards == local.num_shards and (split == "val" or local.num_shards > 1)
        assert read_all(remote) == read_all(local)


def test_without_obstore_the_error_says_what_to_install(dataset, tmp_path, monkeypatch):
    _, url = dataset
    monkeypatch.setitem(sys.modules, "obstore", None)  # `import obstore` now fails
    with pytest.raises(DatasetError, match=r"pip install 'turbotrain\[remote\]'"):
        open_dataset(url, "train", cache_dir=tmp_path / "cache", cache_limit="1GB")


def test_dataloader_worker_processes_read_a_remote_split(dataset, tmp_path):
    """`--worker-mode processes` over s3://: the workers start fresh ("spawn": the client's
    runtime, the prefetch threads and the cache's locks do not survive fork; a forked worker
    once hung here for good) and yield the local folder's batches."""
    from turbotrain.pipeline import build_pipeline
    out, url = dataset
    batches, methods = {}, {}
    for name, where in (("local", out), ("remote", url)):
        split = open_dataset(where, "train", cache_dir=tmp_path / "cache", cache_limit="1GB")
        with build_pipeline("pytorch", split, train=False, batch_size=16, image_size=SIDE,
                            device="cpu", seed=0, workers=2, worker_mode="processes") as pipeline:
            context = pipeline.source.loader.multiprocessing_context
            methods[name] = context.get_start_method() if context is not None else "default"
            pipeline.set_epoch(0)
            batches[name] = [(images.clone(), labels.clone()) for images, labels in pipeline]
    assert methods == {"local": "default", "remote": "spawn"}, methods
    assert len(batches["remote"]) == len(batches["local"]) == 10
    for (a, la), (b, lb) in zip(batches["local"], batches["remote"]):
        assert (a == b).all() and (la == lb).all()


def _read_first_sample(split, results) -> None:
    results.put(bytes(split.read(0)[0]))


def test_a_forked_process_downloads_through_a_fresh_process(dataset, tmp_path, monkeypatch):
    """A program that forks after opening a remote split (its own DataLoader, say): the child
    downloads through a fresh process (obstore's runtime does not survive fork: it would
    hang) and reads the right bytes."""
    import multiprocessing

    from turbotrain.datasets.remote.object_store import Store
    out, url = dataset
    log, original = tmp_path / "fresh-processes.log", Store._in_fresh_process

    def logged(self, deadline, *args, **kwargs):  # the forked child inherits this patch
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {args[0]}\n")
        return original(self, deadline, *args, **kwargs)

    monkeypatch.setattr(Store, "_in_fresh_process", logged)
    split = open_dataset(url, "train", cache_dir=tmp_path / "cache", cache_limit="1GB")
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_read_first_sample, args=(split, results))
    child.start()
    try:
        got = results.get(timeout=120)
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
    assert got == bytes(open_dataset(out, "train").read(0)[0])
    downloads = log.read_text().split("\n") if log.exists() else []
    assert any(line.endswith(" download") for line in downloads), downloads
    assert str(os.getpid()) not in {line.split()[0] for line in downloads if line}
