"""`train --profile` on a CPU says nothing on stderr for the profiler: kineto's start/stop
markers and its "gpuGetDeviceCount failed" (it looks for GPUs there are none of) are C++ lines
that no Python capture sees, so the real command runs in a child process (issue 36)."""
from __future__ import annotations

import os

import pytest

from ..conftest import FAST, train_subprocess

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast


@pytest.mark.timeout(300)
def test_profiling_on_a_cpu_leaves_stderr_to_the_run(tiny_dataset, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    out = tmp_path / "run"
    proc = train_subprocess("--data", tiny_dataset, "--out", out, "--epochs", 1,
                            "--batch-size", 8, "--max-steps", 6, "--profile", "--device", "cpu",
                            *FAST, env=env)
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr
    assert (out / "trace.json").is_file() and f"wrote {out / 'trace.json'}" in stdout
    assert "gpuGetDeviceCount" not in stderr and "USDT:" not in stderr, stderr
