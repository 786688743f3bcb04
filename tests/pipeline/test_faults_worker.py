"""A `pytorch` pipeline worker process killed mid-run (`--worker-mode processes`; the kernel's OOM
killer sends SIGKILL) ends `train` with one line naming the worker, its pid and the signal, within
seconds: before, torch's SIGCHLD handler raised a RuntimeError traceback from wherever the main
thread was, or the shared-memory hand-over a ConnectionResetError traceback."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.train.tiny_data import write_tiny_dataset

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast

REPO = Path(__file__).resolve().parents[2]


def children(pid: int) -> list[int]:
    """Pids whose parent is `pid` (from /proc/*/stat, which every kernel has)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return sorted(found)


def test_killed_worker_is_one_line_naming_it(tmp_path):
    data = write_tiny_dataset(tmp_path / "ds", train=256, val=None)
    run = tmp_path / "run"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.train.run_with_test_pipelines", "--data", str(data),
         "--out", str(run), "--threads", "1", "--workers", "2", "--worker-mode", "processes",
         "--pipeline", "pytorch", "--device", "cpu", "--epochs", "1000", "--batch-size", "8",
         "--log-every", "1"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ((run / "metrics.jsonl").exists() and len(children(proc.pid)) >= 2):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no training step with two workers in 60 s"
            time.sleep(0.05)
        workers = children(proc.pid)
        os.kill(workers[1], signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - killed
    finally:
        proc.kill()
    lines = err.strip().splitlines()
    assert proc.returncode == 2, err[-3000:]
    assert lines[-1] == (
        f"train: error: pipeline worker 1 (pid {workers[1]}) was killed by SIGKILL (signal 9; "
        "the usual cause is running out of memory: the kernel's OOM killer ends the largest "
        "process (see `dmesg`); use fewer --workers, a smaller --batch-size, or "
        "--worker-mode threads)"), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert took < 15, f"took {took:.1f} s to end after the kill"
