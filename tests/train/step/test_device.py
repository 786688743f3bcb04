"""Carrying the device decisions out: grad scaler and thread budget (the decisions themselves:
tests/train/plan/test_device_choice.py)."""
from __future__ import annotations

import pytest
import torch

from turbotrain.train.plan import GpuInfo, Machine
from turbotrain.train.plan.device_choice import COMPILE_MODE, device_choices
from turbotrain.train.step import device as dev

CPU = torch.device("cpu")


def test_only_fp16_gets_a_live_grad_scaler():
    assert dev.make_grad_scaler(CPU, "fp16").is_enabled()
    assert not dev.make_grad_scaler(CPU, "bf16").is_enabled()


@pytest.mark.parametrize("cores, jpeg, workers, threads", [
    (2, 0.0, 1, 1), (2, 1.0, 1, 1), (16, 1.0, 8, 8), (16, 0.0, 4, 12), (1, 1.0, 0, 1)])
def test_thread_budget_splits_the_cores(cores, jpeg, workers, threads):
    plan = dev.plan_threads(CPU, cores=cores, workers=None, threads=None, jpeg_fraction=jpeg)
    assert (plan.workers, plan.torch_threads) == (workers, threads)
    assert plan.workers + plan.torch_threads <= max(cores, 1)


def test_thread_budget_respects_what_was_asked():
    plan = dev.plan_threads(CPU, cores=8, workers=6, threads=None, jpeg_fraction=1.0)
    assert (plan.workers, plan.torch_threads) == (6, 2)
    plan = dev.plan_threads(CPU, cores=8, workers=None, threads=3, jpeg_fraction=1.0)
    assert (plan.workers, plan.torch_threads) == (5, 3)
    plan = dev.plan_threads(CPU, cores=2, workers=2, threads=2, jpeg_fraction=1.0)
    assert "oversubscribed" in plan.reason


H200 = GpuInfo("NVIDIA H200", (9, 0), 141 * 2**30)
V100 = GpuInfo("Tesla V100-SXM2-32GB", (7, 0), 32 * 2**30)
CUDA = torch.device("cuda", 0)


def test_each_cuda_decision_gives_its_gpu_reason():
    """What `train` prints at start on a GPU, decided for GPUs this machine does not have."""
    from types import SimpleNamespace

    from turbotrain.train.engine.builder import threads_after_pipeline
    from turbotrain.train.plan.rules import auto_batch_size
    on_h200 = device_choices(Machine(cores=16, ram_bytes=2**36, gpus=(H200,)))
    precision = on_h200.precision
    assert precision.value == "bf16"
    assert precision.reason.startswith("NVIDIA H200: compute capability 9.0 >= 8.0")
    older = device_choices(Machine(cores=16, ram_bytes=2**36, gpus=(V100,))).precision
    assert older.value == "fp16" and "compute capability 7.0 < 8.0" in older.reason
    compiled = on_h200.compile
    assert compiled.value is True and compiled.reason.startswith("CUDA (NVIDIA H200): ")
    mode = on_h200.compile_mode
    assert mode.value == COMPILE_MODE and "on NVIDIA H200" in mode.reason
    assert "reduce-overhead" in mode.reason and "gpu_check.py --all" in mode.reason
    plan = dev.plan_threads(CUDA, cores=16, workers=None, threads=None, jpeg_fraction=1.0)
    assert (plan.workers, plan.torch_threads) == (15, 1)
    assert plan.reason.startswith("CUDA: ") and "15 of 16 cores decode" in plan.reason
    resident = threads_after_pipeline(plan, SimpleNamespace(name="resident", cpu_workers=0),
                                      "cuda")
    assert (resident.workers, resident.torch_threads) == (0, 16)
    assert resident.reason.startswith("CUDA: the resident pipeline uses 0 CPU worker(s)")
    for size in (32, 224):
        assert "CUDA" in auto_batch_size(size, "cuda")[1]
    assert str(H200) == "NVIDIA H200, compute capability 9.0, 141 GiB"
