"""bench/bf16_probe.py's direct step runs and finds what it looks for: weights with one inf
make the step non-finite, and the probe names the module where it began (a finite step is
what `python bench/bf16_probe.py` shows on this CPU, without native bf16)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bf16_probe  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.mark.usefixtures("child_processes")
def test_the_direct_step_names_the_first_module_that_is_not_finite(tmp_path):
    from safetensors.torch import load_file, save_file
    _, _, weights = bf16_probe.write_inputs(tmp_path)
    state = load_file(weights)
    state["layer2.0.conv1.weight"][0, 0, 0, 0] = float("inf")
    poisoned = tmp_path / "poisoned.safetensors"
    save_file(state, str(poisoned))
    result = bf16_probe.step_run(poisoned, 0, bf16_probe.VARIANTS["oneDNN off"])
    assert not result["finite"] and result["first_forward"] == ["layer2.0.conv1"], result
    assert result["bad_grads"], result
