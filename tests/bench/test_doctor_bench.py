"""bench/bench_doctor.py's measurement of the hook's cost: doctor_script's --hook-ab turns the
hook's timing off and on in blocks inside one process (the arithmetic, not its numbers)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from bench import bench_doctor

MLP = ["--no-loader", "--model", "mlp", "--width", "16", "--batch-size", "8", "--samples", "256",
       "--threads", "1"]


@pytest.mark.timeout(300)
def test_hook_ab_times_blocks_with_the_hook_on_and_off_in_turn(tmp_path):
    _, result = bench_doctor.doctor([*MLP, "--hook-ab", "3"], tmp_path / "doctor",
                                    doctor_steps=1000, warmup=2, script_steps=2 + 12,
                                    stop=False)
    blocks = result.get("hook_ab")
    assert blocks is not None, result
    # 12 timed steps in blocks of 3: on, off, on, off
    assert len(blocks["on"]) == 2 and len(blocks["off"]) == 2, blocks
    assert all(seconds > 0 for side in blocks.values() for seconds in side)


def test_hook_ab_outside_the_doctor_says_how_to_run_it():
    done = subprocess.run([sys.executable, str(bench_doctor.SCRIPT), *MLP, "--steps", "3",
                           "--warmup", "1", "--hook-ab", "2"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "--hook-ab: run this script under `turbotrain doctor`")
