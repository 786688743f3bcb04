"""A `.beton` truncated while a process reads its memory map: the read faults with SIGBUS, which
killed the process without a word (returncode -7). The map guard (datasets/beton/map_guard.py,
pipeline/csrc/map_guard.c) turns it into one line naming the file and exit code 2, for numpy
reads in Python, the decode kernel's C threads and DataLoader worker processes; a SIGBUS that
is not in a guarded map still dies as before."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import expect
from tests.train.tiny_data import write_tiny_dataset

REPO = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": str(REPO)}

pytestmark = [pytest.mark.usefixtures("child_processes")]
expect.need("native")  # the map guard is the compiled extension's: fails where CI built it

# Reads every sample's bytes through numpy views of the map, for ever, after saying "ready".
READER = """
import sys
from turbotrain.datasets.beton.reader import BetonFile
f = BetonFile(sys.argv[1])
first = True
while True:
    for i in range(len(f)):
        int(f.payload(i).sum())
    if first:
        print("ready", flush=True)
        first = False
"""


def shrank(path: Path, prog: str) -> str:
    return (f"{prog}: error: {path} shrank while it was being read (the dataset was changed "
            "under this run): prepare it again or restore the file")


def test_numpy_reads_of_a_truncated_file_end_in_one_line(tmp_path):
    data = write_tiny_dataset(tmp_path / "ds", train=64, val=None)
    beton = data / "train.beton"
    proc = subprocess.Popen([sys.executable, "-c", READER, str(beton)], env=ENV, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n", proc.communicate(timeout=30)[1]
        os.truncate(beton, 4096)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 2, (proc.returncode, err)
    assert err.strip().splitlines() == [shrank(beton, "turbotrain")]


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_train_on_a_truncated_file_ends_in_one_line(tmp_path, mode):
    """The pytorch pipeline: the C kernel reads the map in its own threads, or DataLoader worker
    processes do (where torch's own SIGBUS handler blamed shared memory)."""
    data = write_tiny_dataset(tmp_path / "ds", train=256, val=None)
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.train.run_with_test_pipelines", "--data", str(data),
         "--out", str(run), "--threads", "1", "--workers", "1", "--worker-mode", mode,
         "--pipeline", "pytorch", "--device", "cpu", "--epochs", "1000", "--batch-size", "8",
         "--log-every", "1"],
        cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (run / "metrics.jsonl").exists():
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no training step in 60 s"
            time.sleep(0.05)
        time.sleep(0.5)
        os.truncate(data / "train.beton", 4096)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 2, (proc.returncode, err[-3000:])
    assert err.strip().splitlines()[-1] == shrank(data / "train.beton", "train"), err[-3000:]
    assert "Traceback" not in err and "bus error" not in err, err[-3000:]


@pytest.mark.parametrize("how", ["kill", "unguarded map"])
def test_a_sigbus_elsewhere_still_kills_the_process(tmp_path, how):
    """The guard only answers for its maps: a SIGBUS sent by kill(), or a fault in a map it was
    not given, ends the process by SIGBUS as before."""
    data = write_tiny_dataset(tmp_path / "ds", train=8, val=None)
    other = tmp_path / "other"
    other.write_bytes(b"x" * 8192)
    script = f"""
import mmap, os, signal
from turbotrain.datasets.beton.reader import BetonFile
f = BetonFile({str(data / "train.beton")!r})
if {how!r} == "kill":
    os.kill(os.getpid(), signal.SIGBUS)
else:
    fd = os.open({str(other)!r}, os.O_RDWR)
    m = mmap.mmap(fd, 8192, prot=mmap.PROT_READ)
    os.ftruncate(fd, 0)
    m[5000]
"""
    ran = subprocess.run([sys.executable, "-c", script], env=ENV, cwd=REPO, capture_output=True,
                         text=True, timeout=30)
    assert ran.returncode == -signal.SIGBUS, (ran.returncode, ran.stderr)
    assert "shrank" not in ran.stderr
