"""Fuzzes what a remote server sends, in ONE process, for tests/security/test_remote_reads.py.

    python tests/security/fuzz_remote.py WORKDIR CASES SEED

Writes a small prepared dataset (2 raw train shards and a val split), serves it from a
misbehaving HTTP server on 127.0.0.1 (http_server.py), and CASES times makes one object lie:
dataset.json's JSON mutated (fuzz_dataset_json's mutations), the bytes of a range or of a whole
shard flipped, cut, padded or replaced, or the server's behaviour (an endless or chunked body,
the wrong range, a body cut short, a slow drip, silence). Then it opens the train split from
the URL with a fresh shard cache and reads every sample. Short deadlines
($TURBOTRAIN_REMOTE_TIMEOUT=0.5 s, $TURBOTRAIN_REMOTE_MIN_RATE=10MB) keep a slow case near a
second.

Acceptable: the samples are the local ones (when nothing lied about content), or one
DatasetError line. Prints one JSON object: {"cases": N, "refused": K, "problems": [...]}.
A problem is any other exception, a message that is not one printable line, samples that
differ from the local ones although every byte served was right, or a case over 10 s.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# Deadlines of a second: a read of N bytes is due 0.5 s + N / 10 MB/s after it starts (127.0.0.1
# gives hundreds of MB/s even on the busy 2-core box).
os.environ["TURBOTRAIN_REMOTE_TIMEOUT"] = "0.5"
os.environ["TURBOTRAIN_REMOTE_MIN_RATE"] = "10MB"

from tests.security.fuzz_dataset_json import mutate_json  # noqa: E402
from tests.security.http_server import serve  # noqa: E402
from turbotrain.datasets import DatasetError, open_dataset  # noqa: E402
from turbotrain.datasets.synthetic import write_random_raw_dataset  # noqa: E402
from turbotrain.printable import printable  # noqa: E402

BEHAVIOURS = ["endless", "chunked", "long", "short", "ignore-range", "slow", "silent"]
CASE_SECONDS = 10.0


def byte_lie(rng: random.Random):
    """A function serving other bytes than asked for (what it does, and the function)."""
    op = rng.choice(["flip", "flip", "truncate", "pad", "random", "empty", "zeros"])
    seed = rng.randrange(2**32)

    def lie(data: bytes, start: int, end: int) -> bytes:
        r = random.Random(seed)
        body = bytearray(data[start:end])
        if op == "flip" and body:
            for _ in range(r.randint(1, 8)):
                # Mostly in the first KB: the header and field descriptors.
                body[min(len(body) - 1, int(r.expovariate(1 / 512)))] ^= 1 << r.randrange(8)
        elif op == "truncate":
            del body[r.randrange(len(body) + 1):]
        elif op == "pad":
            body += bytes(r.randrange(256) for _ in range(r.randint(1, 4096)))
        elif op == "random":
            body = bytearray(r.randbytes(len(body)))
        elif op == "empty":
            body = bytearray()
        elif op == "zeros":
            body = bytearray(len(body))
        return bytes(body)
    return op, lie


def plan_case(rng: random.Random, names: list[str], info: dict):
    """(description, {object: behaviour}, dataset.json bytes or None, content is honest)."""
    target = rng.choice(["dataset.json"] * 2 + names)
    kind = rng.choices(["json", "bytes", "behaviour", "ok"], [3, 4, 3, 1])[0]
    if kind == "json":
        data, what = mutate_json(info, rng)
        return f"dataset.json: {what}", {}, data, False
    if kind == "ok":
        return "ok", {}, None, True
    if kind == "bytes":
        op, lie = byte_lie(rng)
        download = target != "dataset.json" and rng.random() < 0.5
        return (f"{target}: bytes {op}{' (download)' if download else ''}",
                {target: lie if not download else _download_only(lie)}, None, False)
    # Slow and silent cost a deadline each: a few of them only.
    behaviour = rng.choice(BEHAVIOURS if rng.random() < 0.3 else BEHAVIOURS[:5])
    if target != "dataset.json" and rng.random() < 0.5:
        behaviour += ":download"
    return f"{target}: {behaviour}", {target: behaviour}, None, True


def _download_only(lie):
    """A lie told only to a download of the whole object (the headers come right)."""
    def serve_bytes(data: bytes, start: int, end: int) -> bytes:
        return lie(data, start, end) if (start, end) == (0, len(data)) else data[start:end]
    return serve_bytes


def read_all(split) -> list[tuple[bytes, int]]:
    return [(split.read(i)[0].tobytes(), int(split.read(i)[1])) for i in range(len(split))]


def main() -> int:
    workdir, cases, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    root = write_random_raw_dataset(workdir / "ds", shards=2, per_shard=20, val=8)
    info_bytes = (root / "dataset.json").read_bytes()
    info = json.loads(info_bytes)
    names = [e["file"] for e in info["splits"]["train"]["shards"]]
    local = read_all(open_dataset(root, "train"))
    problems, refused = [], 0
    with serve(root) as server:
        for case in range(cases):
            what, behave, json_bytes, honest = plan_case(rng, names, info)
            (root / "dataset.json").write_bytes(json_bytes if json_bytes is not None
                                                else info_bytes)
            server.behave = behave
            cache = workdir / f"cache-{case}"
            started = time.monotonic()
            try:
                got = read_all(open_dataset(server.url, "train", cache_dir=cache,
                                            cache_limit="1GB"))
                if honest and got != local:
                    problems.append({"case": what, "error": "samples differ from the local"})
            except DatasetError as e:
                refused += 1
                text = str(e)
                if "\n" in text or printable(text) != text:
                    problems.append({"case": what, "error": f"not one printable line: {text!r}"})
            except Exception as e:  # anything else is a finding
                problems.append({"case": what, "error": f"{type(e).__name__}: {str(e)[:300]}",
                                 "where": traceback.format_exc(limit=-3)[-600:]})
            seconds = time.monotonic() - started
            if seconds > CASE_SECONDS:
                problems.append({"case": what, "error": f"took {seconds:.1f} s"})
            shutil.rmtree(cache, ignore_errors=True)
    json.dump({"cases": cases, "refused": refused, "problems": problems}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
