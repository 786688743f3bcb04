"""Every device decision, made for described machines this box is not (plan/device_choice.py):
the plan is handed "an H100 with a CPU without bf16", "a T4", "a V100", "two A100s in one node"
and each choice is checked, with the CPU's own bf16 flag deciding a CPU run on a GPU host
(issue 41: the GPUs' flag overwrote it)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from turbotrain.train.config.config import TrainConfig
from turbotrain.train.errors import TrainError
from turbotrain.train.plan import DatasetFacts, GpuInfo, Machine, plan
from turbotrain.train.plan.device_choice import (COMPILE_MODE, device_choices, pick_precision,
                                                 slow_precision)

GiB = 2**30
H100 = GpuInfo("NVIDIA H100 80GB HBM3", (9, 0), 80 * GiB)
A100 = GpuInfo("NVIDIA A100-SXM4-80GB", (8, 0), 80 * GiB)
V100 = GpuInfo("Tesla V100-SXM2-32GB", (7, 0), 32 * GiB, bf16=False)
T4 = GpuInfo("Tesla T4", (7, 5), 15 * GiB, bf16=False)
AVX2 = Machine(cores=16, ram_bytes=120 * GiB, cpu_flags=frozenset({"avx2"}), cpu_bf16=False)
BF16_CPU = replace(AVX2, cpu_flags=frozenset({"avx2", "avx512f", "avx512_bf16"}), cpu_bf16=True)

MACHINES = {
    "h100, CPU without bf16": replace(AVX2, gpus=(H100,)),
    "t4": replace(AVX2, cores=8, ram_bytes=30 * GiB, gpus=(T4,)),
    "v100, CPU with bf16": replace(BF16_CPU, gpus=(V100,)),
    # torchrun, 2 ranks in one node; this is rank 1, on the second GPU
    "2 x a100": replace(AVX2, cores=64, gpus=(A100, A100), world_size=2, local_world_size=2,
                        local_rank=1),
}
PHOTOS = DatasetFacts(train_count=200_000, largest_side=500, jpeg_fraction=1.0,
                      num_classes=100, val_count=5_000)
CIFAR = DatasetFacts(train_count=50_000, largest_side=32, jpeg_fraction=0.0, num_classes=10,
                     val_count=10_000)

# machine -> (device, precision, pipeline for PHOTOS, resident reserve for PHOTOS > 0)
EXPECTED = {
    "h100, CPU without bf16": ("cuda:0", "bf16", "resident", True),
    "t4": ("cuda:0", "fp16", "dali", False),  # 15 GiB: the 39 GB store does not fit
    "v100, CPU with bf16": ("cuda:0", "fp16", "dali", False),
    "2 x a100": ("cuda:1", "bf16", "resident", True),
}


@pytest.mark.parametrize("name", list(MACHINES))
def test_every_choice_on_a_described_gpu_machine(name):
    machine = MACHINES[name]
    device, precision, pipeline, reserved = EXPECTED[name]
    photos = plan(TrainConfig(data="d"), PHOTOS, machine)
    assert str(photos.device) == device
    gpu = machine.gpus[machine.local_rank]
    assert photos["precision"].value == precision and gpu.name in photos["precision"].reason
    assert photos["compile"].value is True and gpu.name in photos["compile"].reason
    assert photos.compile_mode == COMPILE_MODE
    assert photos["channels_last"].value is True  # ResNet-50: a conv net
    assert (photos.config.model, photos.config.image_size) == ("resnet50", 224)
    assert photos["pipeline"].value == pipeline
    search = photos.batch_search  # --batch-size auto: measured on the GPU, up to 256
    assert (search.preferred, search.limit) == (256, 256) and "CUDA" in search.why
    assert (search.reserve_bytes > 0) == reserved
    cifar = plan(TrainConfig(data="d"), CIFAR, machine)
    assert (cifar.config.model, cifar["pipeline"].value) == ("airbench", "resident")
    assert cifar.batch_search.preferred == 512 and cifar["precision"].value == precision
    assert cifar.threads.workers == 0  # resident: no CPU workers, every core to torch


@pytest.mark.parametrize("name", list(MACHINES))
def test_a_cpu_run_on_a_gpu_host_follows_the_cpus_own_bf16(name):
    """`--device cpu` on each GPU host: the precision follows the CPU, never the GPU."""
    machine = MACHINES[name]
    planned = plan(TrainConfig(data="d", device="cpu"), PHOTOS, machine)
    assert planned.device == torch.device("cpu")
    assert planned["precision"].value == ("bf16" if machine.cpu_bf16 else "fp32")
    assert planned["compile"].value is False and "compile_mode" not in planned.decisions
    assert planned.config.image_size == 64 and planned["pipeline"].value != "dali"
    assert planned.batch_search.preferred == 128  # 64 px images on a CPU
    asked = plan(TrainConfig(data="d", device="cpu", precision="bf16"), None, machine)
    assert bool(asked["precision"].warning) == (not machine.cpu_bf16)


def test_device_choices_gathers_each_decision_for_the_rank():
    chosen = device_choices(MACHINES["2 x a100"], conv_net=True)
    assert chosen.device.value == torch.device("cuda", 1) and chosen.gpu == A100
    assert (chosen.precision.value, chosen.compile.value) == ("bf16", True)
    assert chosen.compile_mode.value == COMPILE_MODE and chosen.channels_last.value is True
    off = device_choices(MACHINES["t4"], compile=False, channels_last=False, conv_net=True)
    assert off.compile_mode is None and off.channels_last.reason == "asked for"
    assert device_choices(AVX2).channels_last is None  # no model known yet
    assert device_choices(AVX2).device.reason == "no CUDA device found"


def test_what_a_gpu_cannot_do_is_one_clear_error():
    with pytest.raises(TrainError, match="--device cuda was asked for but no CUDA"):
        device_choices(AVX2, device="cuda")
    with pytest.raises(TrainError, match="--precision bf16: this GPU has no bf16 support"):
        device_choices(MACHINES["t4"], precision="bf16")
    assert device_choices(MACHINES["t4"], precision="fp16").precision.reason == "asked for"


def test_precision_on_a_cpu():
    assert pick_precision("auto", "cpu", None, cpu_bf16=True).value == "bf16"
    assert pick_precision("auto", "cpu", None, cpu_bf16=False).value == "fp32"
    assert slow_precision("fp16", "cpu", cpu_bf16=True).startswith("--precision fp16 is 3-6x")
    assert slow_precision("bf16", "cuda", cpu_bf16=False) == ""
