"""Pipelines declare what they need (registry.Capabilities); nothing outside a pipeline's own
module matches its name.

Two toy pipelines are registered here, in this file alone, and `auto`, the plan, `Machine`,
`turbotrain info` and the doctor take them as they take ours: a CPU one preferred over
pytorch, and one ranked first that needs CUDA and a package nobody has installed. The
`toys` fixture unregisters them, so no other test sees them (their "test-" names keep them
out of the contract tests' parametrization too).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import turbotrain.pipeline.auto as auto
from turbotrain.datasets import open_dataset
from turbotrain.pipeline import (Capabilities, OptionalPackage, PipelineOptions, build_auto,
                                 capabilities, choose_pipeline, register_pipeline)
from turbotrain.pipeline.auto import sharded_reason
from turbotrain.pipeline.ordered import OrderedPipeline
from turbotrain.pipeline.registry import auto_order, pipeline_names, unregister_pipeline
from turbotrain.train.config.config import TrainConfig
from turbotrain.train.plan import DatasetFacts, GpuInfo, Machine, plan
from turbotrain.train.records.doctor import Facts, diagnose

GiB = 2**30
TOY, GPU_TOY = "test-toy", "test-toy-gpu"
# Between dali (20) and pytorch (30): on a CPU it is what auto takes once the decoded split
# does not fit the resident budget.
TOY_CAPABILITIES = Capabilities(preference=25)
# Before resident (10): auto takes it wherever CUDA and its package are there.
GPU_TOY_CAPABILITIES = Capabilities(
    preference=5, needs_cuda="the toy's GPU path needs a CUDA device", decodes_on_gpu=True,
    package=OptionalPackage(module="turbotrain_toy_engine", distribution="toy-engine",
                            label="ToyEngine"))
IMAGENET = DatasetFacts(train_count=1_281_167, largest_side=500, jpeg_fraction=1.0,
                        num_classes=1000, val_count=50_000)  # does not fit in memory
H200 = GpuInfo("NVIDIA H200", (9, 0), 141 * GiB)


class ToyPipeline(OrderedPipeline):
    """The batch contract and nothing more: black images, the split's labels."""
    name = TOY

    def _produce(self, epoch, batches):
        labels = np.asarray(self.dataset.labels, dtype=np.int64)
        side = self.options.image_size
        for indices in batches:
            images = torch.zeros((len(indices), side, side, 3), dtype=torch.uint8)
            yield images.permute(0, 3, 1, 2), torch.from_numpy(labels[indices])


@pytest.fixture
def toys():
    register_pipeline(TOY, TOY_CAPABILITIES)(ToyPipeline)
    register_pipeline(GPU_TOY, GPU_TOY_CAPABILITIES)(ToyPipeline)
    yield
    unregister_pipeline(TOY)
    unregister_pipeline(GPU_TOY)


def test_the_order_comes_from_the_declarations(toys):
    assert auto_order() == (GPU_TOY, "resident", "dali", TOY, "pytorch", "ffcv")
    assert capabilities(TOY) == TOY_CAPABILITIES


def test_the_toys_are_gone_after_the_fixture():
    assert TOY not in pipeline_names() and TOY not in auto_order()
    assert auto_order() == ("resident", "dali", "pytorch", "ffcv")


def test_auto_takes_the_toy_before_pytorch(toys, small_path, monkeypatch):
    monkeypatch.setattr(auto, "memory_budget", lambda device: (1000, "a test budget"))
    dataset = open_dataset(small_path)
    options = dict(train=True, batch_size=4, image_size=16, device=torch.device("cpu"))
    name, reason = choose_pipeline(dataset, PipelineOptions(**options))
    assert name == TOY, reason
    assert reason.startswith(f"auto picked {TOY}; skipped {GPU_TOY}: the toy's GPU path needs "
                             "a CUDA device; resident: the decoded split needs")
    pipeline, _ = build_auto(dataset, **options)
    with pipeline:
        images, labels = next(iter(pipeline))
    assert isinstance(pipeline, ToyPipeline) and images.shape == (4, 3, 16, 16)
    assert images.is_contiguous(memory_format=torch.channels_last) and labels.dtype == torch.int64


def test_the_plan_and_machine_take_the_toys(toys):
    cpu = Machine(cores=2, ram_bytes=6 * GiB)  # lists every registered pipeline by default
    assert {TOY, GPU_TOY} <= set(cpu.pipelines) and GPU_TOY in cpu.installed
    p = plan(TrainConfig(data="DATA"), IMAGENET, cpu)
    assert p.config.pipeline == TOY
    assert f"skipped {GPU_TOY}: the toy's GPU path needs a CUDA device" in p["pipeline"].reason
    # A streaming pipeline with loader workers: the same split of the cores as pytorch's.
    asked = plan(TrainConfig(data="DATA", pipeline="pytorch"), IMAGENET, cpu)
    assert p.threads == asked.threads and p.threads.workers >= 1
    gpu = Machine(cores=16, ram_bytes=120 * GiB, gpus=(H200,))
    assert plan(TrainConfig(data="DATA"), IMAGENET, gpu).config.pipeline == GPU_TOY
    without = Machine(cores=16, ram_bytes=120 * GiB, gpus=(H200,), installed=frozenset({"dali"}))
    p = plan(TrainConfig(data="DATA"), IMAGENET, without)
    assert p.config.pipeline == "dali"
    assert f"skipped {GPU_TOY}: toy-engine is not installed" in p["pipeline"].reason


def test_info_lists_the_toys_and_the_package_version(toys):
    from turbotrain.train.tools import info_facts as info
    planned = plan(TrainConfig(data="DATA"), IMAGENET, Machine(cores=2, ram_bytes=6 * GiB))
    listed = info.pipelines(planned, IMAGENET)
    assert listed[TOY] == "usable"
    assert listed[GPU_TOY] == "unavailable: the toy's GPU path needs a CUDA device"
    assert info.versions()["ToyEngine"] == "not installed"


def test_the_doctor_advises_by_capability(toys):
    base = dict(timed_steps=50, seconds=10.0, images_per_second=500.0, pipeline=TOY,
                precision="fp32", compiled=False, channels_last=True, batch_size=64,
                image_size=224)
    cpu = diagnose(Facts(device="cpu", data_wait=5.0, compute=4.8, workers=1, torch_threads=4,
                         cores=2, resident_fits=True, **base))
    advice = " ".join(cpu.next_steps)
    # The toy has loader workers (not loads_in_process), so it gets the worker advice.
    assert "--pipeline resident" in advice and "--workers 3 --threads 2" in advice
    cuda = diagnose(Facts(device="cuda", data_wait=6.8, compute=3.0, workers=4, torch_threads=1,
                          cores=16, dali_usable=True, jpeg_fraction=1.0, **base))
    # The first pipeline in auto's order that decodes on the GPU is now the GPU toy.
    assert f"`--pipeline {GPU_TOY}`" in " ".join(cuda.next_steps)


def test_the_shards_message_lists_the_pipelines_that_read_shards():
    assert sharded_reason(capabilities("ffcv"), 3) == (
        "FFCV's Loader reads one .beton file, and this split is stored in 3 shards; use "
        "--pipeline pytorch, resident or dali (or prepare without --shard-size)")


def test_no_pipeline_name_is_matched_outside_its_own_module():
    """A pipeline's name is a string literal only in pipeline/<name>*.py (its module and its
    helpers): every other module asks its capabilities."""
    package = Path(__file__).resolve().parents[2] / "turbotrain"
    names = [name for name in pipeline_names() if not name.startswith("test-")]
    found = []
    for path in sorted(package.rglob("*.py")):
        source = path.read_text()
        for name in names:
            own = path.parent == package / "pipeline" and path.stem.startswith(name)
            if not own and re.search(rf"""["']{re.escape(name)}["']""", source):
                found.append(f"{path.relative_to(package)}: {name!r}")
    assert not found, found
