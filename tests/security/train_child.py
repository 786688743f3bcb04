"""Runs the real `train` CLI in a confined child (tests/security/confined.py) the way a user would:
a subprocess with the in-test pipelines of tests/train registered, on the CPU, under an
address-space cap and a peak-RSS cap. What a test checks of the run (`Ran.error_line("train:
error: ")`, `tree_state`, `changed`, `outside`) comes from confined.py.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .confined import REPO, Ran, run_confined

# As tests/train/conftest.py FAST: one torch thread, no workers, the in-test pipeline; on the CPU
# even where a GPU is present (a CUDA context would not start under the address-space cap).
FAST = ["--threads", "1", "--workers", "0", "--pipeline", "test-memory", "--log-every", "1",
        "--device", "cpu", "--no-tta"]

# Address space: a plain 3-step run of the tiny dataset fails to start under 3 GiB (torch maps
# its shared libraries and thread stacks) and completes under 4 GiB; 8 GiB leaves twice that.
ADDRESS_SPACE_LIMIT = 8 << 30
# Resident memory actually touched: such a run peaks at about 0.9 GiB (torch, the model,
# matplotlib), one refused at start about 0.7 GiB; 1.5 GiB leaves room, yet a checkpoint or
# config that made us allocate what it declares would go past it.
PEAK_RSS_LIMIT = 3 << 29  # 1.5 GiB


def run_train(*args, cwd: Path, timeout: float = 60) -> Ran:
    """`train ARGS` in a confined child under the address-space cap, its peak RSS asserted under
    PEAK_RSS_LIMIT. Kills it and fails the test after `timeout` seconds."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    ran = run_confined([sys.executable, "-m", "tests.train.run_with_test_pipelines", *args],
                       address_space=ADDRESS_SPACE_LIMIT, timeout=timeout, cwd=cwd, env=env)
    assert ran.peak_rss < PEAK_RSS_LIMIT, f"the child peaked at {ran.peak_rss / 2**30:.2f} GiB"
    return ran
