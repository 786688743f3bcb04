"""bench/bench_doctor.py's measurement of the hook's cost: doctor_script's --hook-ab turns the
hook's timing off and on in blocks inside one process (the arithmetic, not its numbers); and a
finding's change applied to the script's flags and environment."""
from __future__ import annotations

import subprocess
import sys

import pytest

from bench import bench_doctor

MLP = ["--no-loader", "--model", "mlp", "--width", "16", "--batch-size", "8", "--samples", "256",
       "--threads", "1"]


@pytest.mark.timeout(300)
def test_hook_ab_times_blocks_with_the_hook_on_and_off_in_turn(tmp_path):
    _, result = bench_doctor.doctor([*MLP, "--hook-ab", "3"], bench_doctor.CLEAN_ENV,
                                    tmp_path / "doctor",
                                    doctor_steps=1000, warmup=2, script_steps=2 + 12,
                                    stop=False)
    blocks = result.get("hook_ab")
    assert blocks is not None, result
    # 12 timed steps in blocks of 3: on, off, on, off
    assert len(blocks["on"]) == 2 and len(blocks["off"]) == 2, blocks
    assert all(seconds > 0 for side in blocks.values() for seconds in side)


def test_each_off_block_is_compared_with_the_on_blocks_on_both_sides():
    # on came first and the process sped up by 10 % a block: one-way pairs would say the hook
    # costs 10 %; both neighbours cancel the drift (1.1/1.0 and 0.9/1.0 around a true 0 %)
    on, off = [1.1, 0.9], [1.0]
    assert bench_doctor.neighbour_ratios(on, off) == [1.1, 0.9]
    assert bench_doctor.neighbour_ratios([2.0, 4.0, 6.0], [1.0, 2.0]) == [2.0, 2.0, 4.0, 3.0]


def test_hook_ab_outside_the_doctor_says_how_to_run_it():
    done = subprocess.run([sys.executable, str(bench_doctor.SCRIPT), *MLP, "--steps", "3",
                           "--warmup", "1", "--hook-ab", "2"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "--hook-ab: run this script under `turbotrain doctor`")


def test_a_findings_change_becomes_the_scripts_flags_and_environment():
    args, env = ["--batch-size", "8", "--bf16"], {"MALLOC_MMAP_THRESHOLD_": "65536"}
    assert bench_doctor.applied(args, env, {"batch_size": 128, "bf16": False}) == (
        ["--batch-size", "128"], env)
    assert bench_doctor.applied(args, env, {"workers": 1}) == (
        ["--batch-size", "8", "--bf16", "--workers", "1"], env)
    assert bench_doctor.applied(args, env, {"env": bench_doctor.CLEAN_ENV}) == (
        args, bench_doctor.CLEAN_ENV)  # both of glibc's settings, the planted one replaced
    assert bench_doctor.applied(args, env, {"loader": "turbotrain"}) is None
