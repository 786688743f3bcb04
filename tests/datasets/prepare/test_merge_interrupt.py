"""Ctrl-C or `kill` during `turbotrain merge` ends it with one line, exit code 130, never a
KeyboardInterrupt traceback; SIGTERM says the same as Ctrl-C (issue 31, part 6).

The signal lands while merge hashes a shard (its file is open in /proc/PID/fd): a shard made
512 MiB long with a hole, its manifest's size patched to match, takes about two seconds to
hash here (its checksum no longer matches: uninterrupted, merge would refuse it).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ..cli_run import cli

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("child_processes")]

SHARD = "train-00000-of-00001.beton"


@pytest.fixture(scope="module")
def slow_parts(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("merge_interrupt")
    for label in ("a", "b"):
        (root / "src" / label).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(np.full((16, 16, 3), i * 40, np.uint8)).save(
                root / "src" / label / f"{i}.png")
    out = root / "out"
    done = cli("prepare", root / "src", out, "--shard-size", "8MiB", "--part", "0/1",
               "--workers", "1")
    assert done.returncode == 0, done.stderr
    os.truncate(out / SHARD, 512 << 20)  # a hole: no disk used
    manifest = out / "parts" / "part-00000-of-00001.json"
    data = json.loads(manifest.read_text())
    data["shards"][0]["bytes"] = 512 << 20
    manifest.write_text(json.dumps(data))
    return out


def _hashing(pid: int, shard: Path) -> bool:
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(shard)
                   for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:  # a descriptor closed while we looked
        return False


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_merge_says_so_in_one_line(slow_parts, signum):
    merge = subprocess.Popen([sys.executable, "-m", "turbotrain", "merge", str(slow_parts)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not _hashing(merge.pid, slow_parts / SHARD):
            assert merge.poll() is None and time.monotonic() < deadline, "never hashed"
            time.sleep(0.005)
        merge.send_signal(signum)
        _, stderr = merge.communicate(timeout=30)
    finally:
        merge.kill()
    assert merge.returncode == 130, (merge.returncode, stderr)
    assert stderr.strip() == (f"turbotrain merge: interrupted; run `turbotrain merge "
                              f"{slow_parts}` again to finish"), stderr
    assert not (slow_parts / "dataset.json").exists()
    assert (slow_parts / "parts" / "part-00000-of-00001.json").is_file()
