"""`info` describes every GPU from detect_machine's one reading: a CUDA context (and its ~500 MB)
only on this rank's GPU, never one per GPU (issue 41)."""
from __future__ import annotations

from turbotrain.train.plan import GpuInfo, Machine
from turbotrain.train.tools import info_facts

from ..plan.test_hardware import _cpu, _fake_gpus, fresh_cpu_flag  # noqa: F401 (a fixture)


def test_info_opens_a_context_on_one_gpu_only(monkeypatch, fresh_cpu_flag):  # noqa: F811
    _cpu(monkeypatch, {"avx2"})
    touched = _fake_gpus(monkeypatch, [(9, 0), (9, 0), (9, 0)])
    info = info_facts.gather()
    assert touched["mem_get_info"] == [0] and touched["device"] == [0]
    assert [g["free GiB"] for g in info["gpus"]] == [0.5, None, None]
    text = info_facts.format_info(info)
    assert "0: GPU0, 1.0 GiB (0.5 free)" in text and "1: GPU1, 2.0 GiB (free not measured)" in text
    assert "native bf16          no" in text  # the CPU's flag, beside Hopper GPUs


def test_a_described_machines_gpus():
    machine = Machine(cores=8, ram_bytes=2**34, gpus=(GpuInfo("T", (7, 5), 2**34, bf16=False),))
    assert info_facts.gpus(machine) == [{"index": 0, "name": "T", "memory GiB": 16.0,
                                         "free GiB": None, "compute capability": "7.5",
                                         "bf16": False}]
