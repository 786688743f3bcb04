"""`tune` on a compute-bound run (tools/tune_levers.py): it stops sweeping loaders once train's
own pick outpaces the model step, and times the levers that change the step instead. The rates
are stubbed (described inputs): no test here compares two timings."""
from __future__ import annotations

import json

import pytest

from turbotrain.train.tools import tune
from turbotrain.train.tools.tune_levers import LOADER_HEADROOM, compute_bound, levers
from turbotrain.train.tools.tune_report import format_report

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast


def test_compute_bound_only_when_the_loader_outpaces_the_step_by_the_headroom():
    # batch 128 at 1.1 s a step: 116 images/s.
    assert compute_bound(LOADER_HEADROOM * 116.5, 1.1, 128, "resident") is not None
    assert compute_bound(2 * 116.4, 1.1, 128, "resident") is None
    assert compute_bound(None, 1.1, 128, "resident") is None
    assert compute_bound(1e6, None, 128, "resident") is None
    why = compute_bound(3_500.0, 1.1, 128, "resident")
    assert why == ("compute-bound: resident alone loads 3,500 images/s, 30x what the model step "
                   "trains (116): no pipeline or worker count changes this run's speed")


def test_the_levers_for_the_issue_s_run_and_for_a_bf16_one():
    """Issue 46: airbench at 64 px on a CPU without native bf16 (fp32)."""
    found = {lever.flag: lever.changes for lever in levers(
        model="airbench", image_size=64, precision="fp32", any_size=True, device_type="cpu",
        bf16_capable=False)}
    assert found == {"--image-size 48": {"image_size": 48, "model": "airbench"}}
    found = [lever.flag for lever in levers(model="resnet18", image_size=224, precision="fp32",
                                            any_size=True, device_type="cuda",
                                            bf16_capable=True)]
    assert found == ["--image-size 168", "--model airbench", "--precision bf16"]
    assert levers(model="vit_small", image_size=16, precision="bf16", any_size=False,
                  device_type="cpu", bf16_capable=True) == []


def test_tune_stops_sweeping_loaders_on_a_compute_bound_run(cli, tiny_dataset, monkeypatch):
    monkeypatch.setattr(tune.Sweep, "loader_rate", lambda self, row, batch, seconds, guess:
                        (1_000_000.0, 0.01))
    monkeypatch.setattr(tune.Sweep, "step_seconds", lambda self, engine, batch, image_size=None:
                        0.5 if image_size and image_size < self.image_size else 1.0)
    model_rows = []
    monkeypatch.setattr(tune, "model_sweep", lambda *a: model_rows.append(a))
    code, out, err = cli("tune", "--data", tiny_dataset, "--budget-seconds", 60, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["compute_bound"].startswith("compute-bound: resident alone loads 1,000,000")
    first, *rest = result["rows"]
    assert first["pipeline"] == "resident" and first["data_wait_fraction"] == 0.0
    assert first["train_images_per_second"] == result["batch_size"] / 1.0
    assert rest and all(r["note"] == "skipped: compute-bound (below)" for r in rest)
    assert model_rows == []  # no model row: the loader cannot slow the step
    assert result["best"]["pipeline"] == "resident" and result["differs"] is None
    # 16 px, bf16 or not, compact28: no smaller size, no lighter model to offer (bf16 may be).
    assert all(lever["flag"].startswith("--precision") for lever in result["levers"])
    text = format_report(result)
    assert "no pipeline or worker count changes this run's speed" in text
    if not result["levers"]:
        assert "none here: nothing to change within seconds" in text
    code, out, err = cli("tune", "--data", tiny_dataset, "--image-size", 32,
                         "--budget-seconds", 60, "--json")
    assert code == 0, err
    result = json.loads(out)
    size = result["levers"][0]
    assert size["flag"] == "--image-size 24" and size["changes"]["model"] == result["model"]
    assert size["speedup"] == 2.0 and "check the accuracy" in size["note"]
    assert "`--image-size 24`: 2.00x the step's speed" in format_report(result)


def test_a_sweep_the_user_chose_runs_whole(cli, tiny_dataset, monkeypatch):
    monkeypatch.setattr(tune.Sweep, "loader_rate", lambda self, row, batch, seconds, guess:
                        (1_000_000.0, 0.01))
    monkeypatch.setattr(tune.Sweep, "step_seconds", lambda self, engine, batch, image_size=None:
                        1.0)
    monkeypatch.setattr(tune, "model_sweep", lambda *a: None)
    code, out, err = cli("tune", "--data", tiny_dataset, "--pipeline", "resident",
                         "test-memory", "--workers", 1, "--budget-seconds", 60, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["compute_bound"] is None and result["levers"] == []
    assert all(r["loader_images_per_second"] == 1_000_000.0 for r in result["rows"])
