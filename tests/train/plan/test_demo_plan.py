"""`turbotrain demo`'s settings per machine (plan/demo_plan.py): planned for machines we are not
on, so the AVX2-only box of issue 32 and a bf16 one each get a tested choice."""
from __future__ import annotations

import subprocess
import sys

import pytest

from turbotrain.train.config.duration import parse_duration
from turbotrain.train.plan.demo_plan import demo_settings
from turbotrain.train.plan.machine import Machine

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast

# Issue 32: the demo's training must end within this on the 2-core box.
DEMO_SECONDS = 120


def test_an_avx2_only_cpu_trains_small_images_with_the_compact_net_in_fp32():
    s = demo_settings(Machine.preset("cpu2-avx2"))
    assert (s.source_side, s.image_size, s.model, s.precision) == (64, 32, "compact28", "fp32")
    assert s.time_budget_s <= DEMO_SECONDS - 20  # room for the finish and the start-up
    assert "--precision=fp32" in s.train_flags()
    assert "AVX2" in s.reasons["precision"]


def test_a_native_bf16_cpu_trains_in_bf16_with_a_shorter_budget():
    bf16, fp32 = demo_settings(Machine.preset("cpu2")), demo_settings(Machine.preset("cpu2-avx2"))
    assert (bf16.model, bf16.image_size, bf16.precision) == ("compact28", 32, "bf16")
    assert bf16.time_budget_s < fp32.time_budget_s  # bf16 steps are 1.5-2.3x faster


@pytest.mark.parametrize("name, precision", [("h200", "bf16"), ("v100", "fp16")])
def test_a_gpu_trains_airbench_at_64_px(name, precision):
    s = demo_settings(Machine.preset(name))
    assert (s.model, s.image_size, s.precision) == ("airbench", 64, precision)


@pytest.mark.parametrize("name", ["cpu2", "cpu2-avx2", "cpu16-avx2", "h200", "v100"])
def test_every_setting_has_a_reason_and_the_budget_flag_parses(name):
    s = demo_settings(Machine.preset(name))
    assert set(s.reasons) == {"images", "image_size", "model", "precision", "time_budget"}
    assert all(line.count(":") >= 2 for line in s.lines())
    budget = [f for f in s.train_flags() if f.startswith("--time-budget=")]
    assert parse_duration(budget[0].split("=", 1)[1]) == s.time_budget_s


@pytest.mark.parametrize("name", ["cpu2", "cpu2-avx2", "h200"])
def test_the_demo_stops_at_a_target_above_its_goal_within_its_budget(name):
    """The sample data is easy: the demo stops at the first evaluation reaching the target
    (>= issue 32's 95 %), the budget bounding a machine too slow to get there."""
    s = demo_settings(Machine.preset(name))
    assert 0.95 <= s.target_accuracy < 1
    assert f"--target-accuracy={s.target_accuracy:g}" in s.train_flags()
    assert any(line.startswith(f"  target_accuracy: {100 * s.target_accuracy:g} %: ")
               for line in s.lines())


def test_demo_machine_prints_the_settings_for_a_preset_and_trains_nothing(tmp_path):
    result = subprocess.run([sys.executable, "-m", "turbotrain", "demo", "--out", str(tmp_path),
                             "--machine", "cpu2-avx2"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--precision=fp32" in result.stdout and "compact28" in result.stdout
    assert not any(tmp_path.iterdir())  # nothing written


def test_demo_an_unknown_machine_is_one_line():
    result = subprocess.run([sys.executable, "-m", "turbotrain", "demo", "--machine", "nope"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0 and "--machine" in result.stderr
    assert "cpu2-avx2" in result.stderr  # the names to choose from
