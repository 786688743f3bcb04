"""Device, precision, compile and thread-budget decisions."""
from __future__ import annotations

import pytest
import torch

from turbotrain.train.errors import TrainError
from turbotrain.train.step import device as dev

CPU = torch.device("cpu")


def test_precision_auto_on_cpu_follows_native_bf16(monkeypatch):
    monkeypatch.setattr(dev, "cpu_has_native_bf16", lambda: True)
    assert dev.choose_precision("auto", CPU).value == "bf16"
    monkeypatch.setattr(dev, "cpu_has_native_bf16", lambda: False)
    choice = dev.choose_precision("auto", CPU)
    assert choice.value == "fp32" and "bf16" in choice.reason
    assert dev.choose_precision("fp16", CPU).value == "fp16"


def test_compile_and_channels_last_defaults():
    assert dev.choose_compile(None, CPU).value is False
    assert dev.choose_compile(None, torch.device("cuda")).value is True
    assert dev.choose_compile(True, CPU).value is True
    assert dev.choose_channels_last(None, is_conv_net=True).value is True
    assert dev.choose_channels_last(None, is_conv_net=False).value is False


def test_only_fp16_gets_a_live_grad_scaler():
    assert dev.make_grad_scaler(CPU, "fp16").is_enabled()
    assert not dev.make_grad_scaler(CPU, "bf16").is_enabled()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_asked_for_but_absent():
    with pytest.raises(TrainError, match="no CUDA device"):
        dev.choose_device("cuda")
    assert dev.choose_device("auto").value == CPU


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


H200 = dev.GpuInfo("NVIDIA H200", (9, 0), 141 * 2**30)
V100 = dev.GpuInfo("Tesla V100-SXM2-32GB", (7, 0), 32 * 2**30)
CUDA = torch.device("cuda", 0)


def test_each_cuda_decision_gives_its_gpu_reason():
    """What `train` prints at start on a GPU, decided for GPUs this machine does not have."""
    from types import SimpleNamespace

    from turbotrain.train.engine.builder import threads_after_pipeline
    from turbotrain.train.plan.rules import auto_batch_size
    precision = dev.choose_precision("auto", CUDA, H200)
    assert precision.value == "bf16"
    assert precision.reason.startswith("NVIDIA H200: compute capability 9.0 >= 8.0")
    older = dev.choose_precision("auto", CUDA, V100)
    assert older.value == "fp16" and "compute capability 7.0 < 8.0" in older.reason
    compiled = dev.choose_compile(None, CUDA, H200)
    assert compiled.value is True and compiled.reason.startswith("CUDA (NVIDIA H200): ")
    mode = dev.choose_compile_mode(CUDA, H200)
    assert mode.value == dev.COMPILE_MODE and "on NVIDIA H200" in mode.reason
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
