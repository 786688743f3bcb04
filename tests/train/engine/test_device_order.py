"""The order of the CUDA set-up steps (issue 41), checked without a GPU by recording what each
step saw: cuBLAS's workspace is fixed before the first CUDA call, and torch.compile wraps the
DDP module (DDP first). test_device_order_on_the_gpu runs the real order on a GPU."""
from __future__ import annotations

import contextlib
import os
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from turbotrain.train.config.config import TrainConfig
from turbotrain.train.engine import builder
from turbotrain.train.step.distributed import DistEnv


class _Stop(Exception):
    pass


def test_build_run_fixes_cublas_before_it_plans(monkeypatch):
    """The batch search (in _plan_and_open) runs CUDA steps: the variable is set before it."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    seen = []

    def plan_and_open(*args):
        seen.append(os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
        raise _Stop
    monkeypatch.setattr(builder, "_plan_and_open", plan_and_open)
    for deterministic, expected in ((False, None), (True, ":4096:8")):
        with pytest.raises(_Stop), contextlib.ExitStack() as stack:
            builder.build_run(TrainConfig(data="d", deterministic=deterministic), DistEnv(),
                              stack)
    assert seen == [None, ":4096:8"]


def test_the_train_command_fixes_cublas_at_its_start(monkeypatch, tmp_path):
    from turbotrain.train import cli
    from turbotrain.train.engine import trainer
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    seen = []
    monkeypatch.setattr(trainer, "train",
                        lambda config, sources=None: seen.append(
                            os.environ.get("CUBLAS_WORKSPACE_CONFIG")))
    monkeypatch.setattr(cli, "keep_freed_memory", lambda: None)  # leave the allocator alone
    assert cli.main(["--data", str(tmp_path), "--deterministic"]) == 0
    assert seen == [":4096:8"]


def test_torch_compile_wraps_the_ddp_module(monkeypatch):
    """DDP first, then torch.compile (PyTorch's DDP notes: the all-reduce then overlaps the
    compiled backward)."""
    calls = []

    class Wrapped(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

    def wrap(model, env, device):
        calls.append(("ddp", type(model).__name__))
        return Wrapped(model)

    def compile_(model, mode=None):
        calls.append(("compile", type(model).__name__))
        return model
    monkeypatch.setattr(builder, "wrap_model", wrap)
    monkeypatch.setattr(torch, "compile", compile_)
    config = TrainConfig(data="d", compile=True, precision="fp32", channels_last=False)
    planned = SimpleNamespace(config=config, device=torch.device("cpu"), compile_mode="default")
    model, _ = builder._place_model(nn.Linear(2, 2), planned, DistEnv(world_size=2), None,
                                    lambda *a: None)
    assert calls == [("ddp", "Linear"), ("compile", "Wrapped")]
    assert isinstance(model, Wrapped)


@pytest.mark.cuda
def test_device_order_on_the_gpu(monkeypatch):
    """One process group of one rank on NCCL: DDP, then compile; a step trains."""
    import torch.distributed as dist
    store = dist.HashStore()
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        config = TrainConfig(data="d", compile=True, precision="bf16", channels_last=False)
        planned = SimpleNamespace(config=config, device=torch.device("cuda", 0),
                                  compile_mode="default")
        # world_size=2 in the description makes wrap_model build DDP over the 1-rank group
        model, _ = builder._place_model(nn.Linear(8, 4), planned, DistEnv(world_size=2), None,
                                        lambda *a: None)
        assert type(model._orig_mod).__name__ == "DistributedDataParallel"
        out = model(torch.randn(16, 8, device="cuda")).sum()
        out.backward()
        assert model._orig_mod.module.weight.grad is not None
    finally:
        dist.destroy_process_group()
