"""plan/hardware.py, the one reader of the devices. torch.cuda is stubbed here because nothing
else can show detection a GPU this box does not have; the decisions themselves are tested on
described machines (test_device_choice.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from turbotrain import host
from turbotrain.train.plan import hardware
from turbotrain.train.step.distributed import DistEnv


@pytest.fixture
def fresh_cpu_flag():
    hardware.cpu_native_bf16.cache_clear()
    yield
    hardware.cpu_native_bf16.cache_clear()


def _fake_gpus(monkeypatch, capabilities):
    """torch.cuda as a host with these GPUs; returns the indices each context-making call saw."""
    touched = {"mem_get_info": [], "is_bf16_supported": [], "device": []}
    props = [SimpleNamespace(name=f"GPU{i}", major=major, minor=minor, total_memory=(i + 1) * 2**30)
             for i, (major, minor) in enumerate(capabilities)]
    current = []

    class Device:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            touched["device"].append(self.index)
            current.append(self.index)

        def __exit__(self, *exc):
            current.pop()

    def mem_get_info(index):
        touched["mem_get_info"].append(index)
        return (index + 1) * 2**29, (index + 1) * 2**30

    def is_bf16_supported():
        touched["is_bf16_supported"].append(current[-1])
        return True  # emulated bf16 works on any CUDA GPU torch supports

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(props))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props[index])
    monkeypatch.setattr(torch.cuda, "device", Device)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    return touched


def _cpu(monkeypatch, flags):
    monkeypatch.setattr(host, "cpu_info",
                        lambda: host.CpuInfo("a CPU", frozenset(flags), read=True))


@pytest.mark.parametrize("cpu_flags, cpu_bf16", [({"avx2"}, False), ({"avx512_bf16"}, True),
                                                 ({"amx_bf16"}, True)])
def test_the_cpus_bf16_flag_is_the_cpus_whatever_the_gpus(monkeypatch, fresh_cpu_flag,
                                                           cpu_flags, cpu_bf16):
    """Issue 41: detection reused one variable for both, so an Ampere GPU made any CPU 'bf16'
    (and an older GPU made a bf16 CPU 'fp32')."""
    _cpu(monkeypatch, cpu_flags)
    for capabilities in ([(9, 0), (9, 0)], [(7, 0), (7, 0)]):
        _fake_gpus(monkeypatch, capabilities)
        hardware.cpu_native_bf16.cache_clear()
        machine = hardware.detect_machine(DistEnv(rank=0, local_rank=0, world_size=1,
                                                  local_world_size=1))
        assert machine.cpu_bf16 is cpu_bf16
        assert [g.capability for g in machine.gpus] == capabilities


def test_only_this_ranks_gpu_gets_a_context(monkeypatch, fresh_cpu_flag):
    _cpu(monkeypatch, {"avx2"})
    touched = _fake_gpus(monkeypatch, [(8, 0), (7, 0), (7, 0), (8, 0)])
    gpus = hardware.detect_gpus(local_rank=6)  # 6 % 4 = GPU 2
    assert touched == {"mem_get_info": [2], "is_bf16_supported": [2], "device": [2]}
    assert [g.free_bytes for g in gpus] == [None, None, 3 * 2**29, None]
    # GPU 2 (7.0) runs bf16 emulated (torch says so); the others are described by capability
    assert [g.bf16 for g in gpus] == [True, False, True, True]


def test_a_cpu_run_does_not_touch_cuda(monkeypatch, fresh_cpu_flag):
    _cpu(monkeypatch, {"avx2"})
    touched = _fake_gpus(monkeypatch, [(9, 0)])
    machine = hardware.detect_machine(DistEnv(rank=0, local_rank=0, world_size=1,
                                              local_world_size=1), gpus=False)
    assert machine.gpus == () and touched["mem_get_info"] == []


def test_no_cuda_no_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hardware.detect_gpus(0) == ()
