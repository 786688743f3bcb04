"""`plan()`: every automatic decision of a run, for machines and datasets this box is not.

The table gives, per (machine, dataset), the decisions that matter; the expected numbers are
worked out from the rules (plan/rules.py) by hand in the comments, not read back from a run.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from turbotrain.pipeline.base import PipelineError
from turbotrain.train.config.config import TrainConfig
from turbotrain.train.engine.batch_finder import BatchFit
from turbotrain.train.errors import TrainError
from turbotrain.train.step.distributed import dist_env_from_environ
from turbotrain.train.plan import (PRESETS, DatasetFacts, Observed, OpenedPipeline, WeightsFacts,
                                   detect_machine, plan)

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast

GiB = 2**30

# Datasets, as the facts a split gives (DatasetFacts.of).
CIFAR = DatasetFacts(train_count=50_000, largest_side=32, jpeg_fraction=0.0, num_classes=10,
                     val_count=10_000)  # small raw images
FASHION = DatasetFacts(train_count=60_000, largest_side=28, jpeg_fraction=0.0, num_classes=10,
                       val_count=10_000)
PHOTOS = DatasetFacts(train_count=20_000, largest_side=500, jpeg_fraction=1.0,  # 500x375 JPEG
                      num_classes=10, val_count=2_000)
FEW_PHOTOS = dataclasses.replace(PHOTOS, train_count=2_000, val_count=None,
                                 val_missing="no val split")
IMAGENET = DatasetFacts(train_count=1_281_167, largest_side=500, jpeg_fraction=1.0,
                        num_classes=1000, val_count=50_000)  # does not fit in memory

CPU2 = PRESETS["cpu2"]  # this dev box: 2 cores, AVX-512 bf16, 6 GiB free
NO_BF16 = PRESETS["cpu16-avx2"]
H200 = PRESETS["h200"]  # 16 cores, one H200 (141 GB, compute capability 9.0)
NODE = PRESETS["8xh200"]  # one 8-GPU node, a plain `train` (one process)
NODE_TORCHRUN = PRESETS["8xh200-torchrun"]  # the same node, 8 ranks
TWO_NODES = PRESETS["2x8xh200"]  # 2 nodes x 8 ranks = 16


ROWS = {
    # CPU, 32 px raw: native size, airbench, batch 128 (390 steps/epoch: no halving), SGD
    # 0.8/256 x 128; resident (50,000 x 36 x 36 x 3 x 2 mirrored = 0.36 GiB < 3 GiB); raw data
    # gets round(2 x 25%) -> 1 worker, then resident's 0 leaves torch both cores.
    "cpu2-cifar": (CPU2, CIFAR, dict(
        device="cpu", precision="bf16", compile=False, compile_mode=None, image_size=32,
        model="airbench", batch=128, lr=0.4, warmup=195, pipeline="resident", threads=(0, 2),
        steps_per_epoch=390)),
    "cpu2-fashion": (CPU2, FASHION, dict(
        device="cpu", precision="bf16", compile=False, compile_mode=None, image_size=28,
        model="compact28", batch=128, lr=0.2, warmup=234, pipeline="resident", threads=(0, 2),
        steps_per_epoch=468)),
    # 20 GB of decoded 64 px photos (73 x 73 stored): no resident on 6 GiB; no DALI without CUDA:
    # pytorch, JPEG data: half the cores decode.
    "cpu2-imagenet": (CPU2, IMAGENET, dict(
        device="cpu", precision="bf16", compile=False, compile_mode=None, image_size=64,
        model="airbench", batch=128, lr=0.4, warmup=2000, pipeline="pytorch", threads=(1, 1),
        steps_per_epoch=10_009)),
    # No native bf16: fp32. 2,000 photos x 10 epochs at 128 = 150 steps (>= 64: kept).
    "avx2-few-photos": (NO_BF16, FEW_PHOTOS, dict(
        device="cpu", precision="fp32", compile=False, compile_mode=None, image_size=64,
        model="airbench", batch=128, lr=0.4, warmup=8, pipeline="resident", threads=(0, 16),
        steps_per_epoch=15)),
    # One H200: bf16, compile (mode default); 28 px on CUDA: batch 512, compact28 0.4 x 2.
    "h200-fashion": (H200, FASHION, dict(
        device="cuda:0", precision="bf16", compile=True, compile_mode="default",
        image_size=28, model="compact28", batch=512, lr=0.8, warmup=58, pipeline="resident",
        threads=(0, 16), steps_per_epoch=117)),
    "h200-cifar": (H200, CIFAR, dict(
        device="cuda:0", precision="bf16", compile=True, compile_mode="default",
        image_size=32, model="airbench", batch=512, lr=1.6, warmup=48, pipeline="resident",
        threads=(0, 16), steps_per_epoch=97)),
    # 20,000 photos on CUDA: 224 px, ResNet-18 (< 100,000 images), 256; the decoded split
    # (20,000 x 256 x 256 x 3 = 3.7 GiB) fits in half the H200: resident.
    "h200-photos": (H200, PHOTOS, dict(
        device="cuda:0", precision="bf16", compile=True, compile_mode="default",
        image_size=224, model="resnet18", batch=256, lr=0.1, warmup=39, pipeline="resident",
        threads=(0, 16), steps_per_epoch=78)),
    # 2,000 photos on CUDA: a small set trains at 64 px with the airbench net; 512 halved to
    # 256 (2,000 / 512 x 10 = 30 steps < 64; at 256, 70).
    "h200-few-photos": (H200, FEW_PHOTOS, dict(
        device="cuda:0", precision="bf16", compile=True, compile_mode="default",
        image_size=64, model="airbench", batch=256, lr=0.8, warmup=4, pipeline="resident",
        threads=(0, 16), steps_per_epoch=7)),
    # ImageNet (235 GiB decoded) does not fit: DALI; ResNet-50; the loader gets 15 of 16 cores.
    "h200-imagenet": (H200, IMAGENET, dict(
        device="cuda:0", precision="bf16", compile=True, compile_mode="default",
        image_size=224, model="resnet50", batch=256, lr=0.1, warmup=2000, pipeline="dali",
        threads=(15, 1), steps_per_epoch=5004)),
    # An 8-GPU node, one process: GPU 0, every core for the loader but one.
    "node-imagenet": (NODE, IMAGENET, dict(
        device="cuda:0", precision="bf16", compile=True, compile_mode="default",
        image_size=224, model="resnet50", batch=256, lr=0.1, warmup=2000, pipeline="dali",
        threads=(127, 1), steps_per_epoch=5004)),
    # torchrun, 8 ranks: 128 / 8 = 16 cores a rank; global batch 2,048: lr 0.1 x 8;
    # 1,281,167 / 8 = 160,145 images a rank: 625 steps/epoch.
    "node-torchrun-imagenet": (NODE_TORCHRUN, IMAGENET, dict(
        device="cuda:0", precision="bf16", compile=True, compile_mode="default",
        image_size=224, model="resnet50", batch=256, lr=0.8, warmup=312, pipeline="dali",
        threads=(15, 1), steps_per_epoch=625)),
    # 2 nodes x 8 ranks: global batch 4,096, lr 1.6; 80,072 images a rank: 312 steps/epoch.
    "two-nodes-imagenet": (TWO_NODES, IMAGENET, dict(
        device="cuda:0", precision="bf16", compile=True, compile_mode="default",
        image_size=224, model="resnet50", batch=256, lr=1.6, warmup=156, pipeline="dali",
        threads=(15, 1), steps_per_epoch=312)),
    "two-nodes-cifar": (TWO_NODES, CIFAR, dict(
        device="cuda:0", precision="bf16", compile=True, compile_mode="default",
        image_size=32, model="airbench", batch=256, lr=12.8, warmup=6, pipeline="resident",
        threads=(0, 16), steps_per_epoch=12)),
}


def _threads(p):
    return p.threads.workers, p.threads.torch_threads


@pytest.mark.parametrize("row", list(ROWS))
def test_plan_table(row):
    machine, facts, want = ROWS[row]
    p = plan(TrainConfig(data="DATA"), facts, machine)
    c = p.config
    got = dict(device=str(p.device), precision=c.precision, compile=c.compile,
               compile_mode=p.compile_mode, image_size=c.image_size, model=c.model,
               batch=p.batch_search.limit, lr=pytest.approx(c.lr), warmup=c.warmup_steps,
               pipeline=c.pipeline, threads=_threads(p), steps_per_epoch=p.steps_per_epoch)
    assert got == want
    assert c.batch_size == p.batch_search.limit  # planned with the search's bound
    assert c.workers == p.threads.workers and c.threads == p.threads.torch_threads
    resident = c.pipeline == "resident"
    # the store, and on CUDA the work memory of its photo crops (batched_crops.py)
    crops = facts.resident_crop_bytes(c.image_size) if p.device.type == "cuda" else 0
    reserved = facts.resident_bytes(c.image_size) + crops
    assert (p.batch_search.reserve_bytes == reserved) == resident
    assert (p.batch_search.reserve_bytes == 0) != resident
    for name in ("device", "precision", "compile", "image_size", "model", "batch_size", "lr",
                 "warmup_steps", "pipeline", "threads", "channels_last", "host_memory"):
        assert p[name].reason.strip(), name
    assert all(d.reason.strip() for d in p.decisions.values())
    assert ("evaluation" in p.decisions) == (facts.val_count is None)


# `--order auto` (rules.order): (machine, facts, config changes, expected order, reason part).
STORED_IMAGENET = dataclasses.replace(IMAGENET, stored_bytes=140 * GiB,
                                      same_label_neighbours=0.001)  # shuffled when prepared
CLASS_ORDER_IMAGENET = dataclasses.replace(STORED_IMAGENET, same_label_neighbours=0.999)
ORDER_ROWS = {
    # 140 GiB on disk against 6 GiB of RAM (budget 3 GiB): the page cache cannot hold it.
    "cpu2-imagenet": (CPU2, STORED_IMAGENET, {}, "quasi-random",
                      "exceeds 50% of the 6.0 GiB of available RAM"),
    # ... but stored in class order: a window of 4 blocks would hold ~4 classes.
    "cpu2-imagenet-class-order": (CPU2, CLASS_ORDER_IMAGENET, {}, "random",
                                  "stored in class order (100% of neighbouring samples"),
    "cpu2-forced": (CPU2, CLASS_ORDER_IMAGENET, dict(order="quasi-random"), "quasi-random",
                    "asked for"),
    # 1,800 GiB of RAM on the 8-GPU node: 140 GiB stays in the page cache.
    "node-imagenet": (NODE, STORED_IMAGENET, {}, "random", "fits in 50% of the 1800.0 GiB"),
    # A remote split with a 100 GiB cache on the same node: the cache cannot hold it.
    "node-remote-imagenet": (NODE, dataclasses.replace(STORED_IMAGENET, cache_limit=100 * GiB),
                             {}, "quasi-random", "exceeds the --cache-limit of 100.0 GiB"),
    # The resident store reads nothing during an epoch.
    "cpu2-cifar": (CPU2, dataclasses.replace(CIFAR, stored_bytes=150 * 2**20), {}, "random",
                   "resident holds the decoded split"),
}


@pytest.mark.parametrize("row", list(ORDER_ROWS))
def test_order_table(row):
    machine, facts, changes, want, why = ORDER_ROWS[row]
    p = plan(TrainConfig(data="DATA", **changes), facts, machine)
    assert p.config.order == want and p["order"].value == want
    assert why in p["order"].reason, p["order"].reason
    assert "order" in p.lines and list(p.decisions).index("order") == \
        list(p.decisions).index("pipeline") + 1


def test_dataset_facts_measure_the_stored_order(tmp_path):
    from turbotrain.datasets import open_dataset

    from ..tiny_data import write_tiny_dataset
    split = open_dataset(write_tiny_dataset(tmp_path / "ds", train=64, val=None), "train")
    facts = DatasetFacts.of(split)
    assert facts.stored_bytes == split.beton.file_size and facts.cache_limit is None
    assert facts.same_label_neighbours < 0.5  # random labels: ~1/4 of neighbours agree


def test_the_batch_search_answer_goes_through_the_same_decision():
    """train measures what fits and plans again with the answer (Observed.batch_fit)."""
    config = TrainConfig(data="DATA")
    first = plan(config, PHOTOS, H200)
    assert str(first["batch_size"].value) == "search up to 256"
    assert "measured at start" in first["batch_size"].reason
    fits = plan(config, PHOTOS, H200, Observed(batch_fit=BatchFit(256, 256, "1 trial")))
    assert fits.batch_search is None and fits.config.batch_size == 256
    assert fits["batch_size"].line() == ("256: 256 per GPU on CUDA, the ImageNet reference "
                                         "batch; it fits (1 trial); trial steps eager, the "
                                         "run's compiled (torch.compile: not what was "
                                         "measured)")
    tight = plan(config, PHOTOS, H200, Observed(batch_fit=BatchFit(96, 256, "7 trials")))
    assert tight.config.batch_size == 96 and tight.config.lr == pytest.approx(0.1 * 96 / 256)
    assert "but 256 does not fit: 96 is the largest that does (7 trials)" in \
        tight["batch_size"].reason
    assert tight.steps_per_epoch == 20_000 // 96
    with pytest.raises(TrainError, match="not even one 224 px image fits"):
        plan(config, PHOTOS, H200, Observed(batch_fit=BatchFit(0, 256, "no room")))


def test_a_global_batch_is_split_into_micro_batches_that_fit():
    config = TrainConfig(data="DATA", global_batch_size=4096)
    p = plan(config, IMAGENET, TWO_NODES, Observed(batch_fit=BatchFit(200, 256, "trials")))
    assert (p.config.batch_size, p.config.accum_steps) == (128, 2)  # 256 = 2 x 128
    assert p["accum_steps"].line() == "2: --global-batch-size 4096 = 128 x 16 rank(s) x 2"
    assert p.config.lr == pytest.approx(1.6)  # the global batch is what it was asked to be
    with pytest.raises(TrainError, match="not a multiple of the 16 ranks"):
        plan(TrainConfig(data="DATA", global_batch_size=1000), IMAGENET, TWO_NODES)


def test_asked_for_values_are_kept_and_not_printed_as_decisions():
    config = TrainConfig(data="DATA", model="resnet18", image_size=96, batch_size=48, lr=0.3,
                         pipeline="pytorch", workers=3, threads=2, precision="fp32",
                         compile=False)
    p = plan(config, PHOTOS, H200)
    c = p.config
    assert (c.model, c.image_size, c.batch_size, c.lr, c.pipeline) == \
        ("resnet18", 96, 48, 0.3, "pytorch")
    assert (c.precision, c.compile, _threads(p)) == ("fp32", False, (3, 2))
    assert p.batch_search is None and p["precision"].reason == "asked for"
    shown = p.lines
    assert not {"model", "image_size", "batch_size", "lr"} & set(shown)
    assert {"device", "precision", "compile", "pipeline", "threads"} <= set(shown)


def test_resident_budget_follows_the_machine():
    """The same 3.7 GiB of decoded photos: resident on an H200, not in 6 GiB of RAM (budget
    3 GiB), where the search leaves no reserve."""
    on_cpu = plan(TrainConfig(data="DATA", image_size=224), PHOTOS, CPU2)
    assert on_cpu.config.pipeline == "pytorch" and on_cpu.batch_search.reserve_bytes == 0
    assert "resident: the decoded split needs 3.66 GiB" in on_cpu["pipeline"].reason
    big = dataclasses.replace(CPU2, ram_bytes=64 * GiB)
    assert plan(TrainConfig(data="DATA", image_size=224), PHOTOS, big).config.pipeline == \
        "resident"


def test_a_pipeline_that_fails_to_open_is_planned_around():
    unopenable = (("dali", "no usable GPU for nvJPEG"),)
    p = plan(TrainConfig(data="DATA"), IMAGENET, H200, Observed(unopenable=unopenable))
    assert p.config.pipeline == "pytorch"
    assert "skipped resident: the decoded split needs" in p["pipeline"].reason
    assert "dali: no usable GPU for nvJPEG" in p["pipeline"].reason
    bare = dataclasses.replace(CPU2, pipelines=("resident",))
    with pytest.raises(PipelineError, match="no pipeline can run here"):
        plan(TrainConfig(data="DATA"), IMAGENET, bare)


def test_the_opened_pipeline_sets_the_schedule_and_the_threads():
    opened = OpenedPipeline("pytorch", batches=100, cpu_workers=1)
    p = plan(TrainConfig(data="DATA", accum_steps=2), IMAGENET, CPU2,
             Observed(pipeline=opened))
    assert p.steps_per_epoch == 50 and p.total_steps == 500 and _threads(p) == (1, 1)
    in_process = OpenedPipeline("pytorch", batches=100, cpu_workers=0)
    assert _threads(plan(TrainConfig(data="DATA"), IMAGENET, CPU2,
                         Observed(pipeline=in_process))) == (0, 2)
    with pytest.raises(TrainError, match="yields 1 batches per epoch, fewer than --accum-steps"):
        plan(TrainConfig(data="DATA", accum_steps=2), IMAGENET, CPU2,
             Observed(pipeline=OpenedPipeline("pytorch", 1, 1)))


def test_workers_asked_for_beside_a_pipeline_that_loads_in_process_are_said():
    """--workers 2 with resident (which makes its batches in the training process) ran with 0
    workers beside the model and said only "0 pipeline workers": the threads line now says
    where the 2 went (resident decodes the split with them once), with --threads too."""
    for threads, torch_threads in ((None, 2), (1, 1)):
        p = plan(TrainConfig(data="DATA", workers=2, threads=threads), CIFAR, CPU2)
        assert p.config.pipeline == "resident" and _threads(p) == (0, torch_threads)
        assert p.budget.workers == 2  # what the pipeline is opened with: its loading threads
        line = p.lines["threads"]
        assert line.startswith("0 pipeline workers") and "--workers 2 are used only while " \
            "the resident pipeline loads" in line, line
        assert "no worker runs beside the model" in line
    streaming = plan(TrainConfig(data="DATA", workers=1, pipeline="pytorch"), CIFAR, CPU2)
    assert _threads(streaming) == (1, 1) and "--workers" not in streaming.lines["threads"]


def test_each_rank_plans_its_own_gpu():
    rank3 = dataclasses.replace(NODE_TORCHRUN, local_rank=3)
    assert str(plan(TrainConfig(data="DATA"), IMAGENET, rank3).device) == "cuda:3"
    assert PRESETS["v100"].gpu.capability == (7, 0)
    older = plan(TrainConfig(data="DATA"), IMAGENET, PRESETS["v100"])
    assert older.config.precision == "fp16" and "< 8.0" in older["precision"].reason
    with pytest.raises(TrainError, match="no CUDA device"):
        plan(TrainConfig(data="DATA", device="cuda"), IMAGENET, CPU2)


def test_resume_auto_and_the_starting_weights_are_inputs():
    config = TrainConfig(data="DATA", out="runs/a", resume="auto")
    pending = plan(config, CIFAR, CPU2)
    assert pending["resume"].value == "auto"
    assert plan(config, CIFAR, CPU2, Observed(out_names=("checkpoint.pt",))).config.resume
    assert plan(config, CIFAR, CPU2, Observed(out_names=None)).config.resume is False
    with pytest.raises(TrainError, match="is not empty"):
        plan(config, CIFAR, CPU2, Observed(out_names=("notes.txt",)))
    card = WeightsFacts(model="compact28", image_size=28, reason="the --init-from card",
                        source_classes=10)
    tuned = plan(TrainConfig(data="DATA", init_from="runs/a"), CIFAR, CPU2,
                 Observed(weights=card))
    assert (tuned.config.model, tuned.config.image_size) == ("compact28", 28)
    assert tuned.config.lr == pytest.approx(0.4 * 128 / 256 * 0.1)  # same classes: x0.1
    assert tuned["warmup_steps"].value == round(0.02 * 3900)
    broken = WeightsFacts(error="--init-from runs/a: the folder holds no best.safetensors")
    with pytest.raises(TrainError, match="holds no best"):
        plan(TrainConfig(data="DATA", init_from="runs/a"), CIFAR, CPU2, Observed(weights=broken))
    resumed = TrainConfig(data="DATA", init_from="runs/a", resume=True)
    assert plan(resumed, CIFAR, CPU2, Observed(weights=broken)).config.model == "airbench"


def test_plan_reads_no_device_file_or_environment(monkeypatch):
    """Pure: with every way to look at this machine made to fail, plans still come out."""
    plan(TrainConfig(data="DATA"), PHOTOS, H200)  # imports done (imports read files)

    def fail(*args, **kwargs):
        raise AssertionError("plan() looked at the machine")
    for name in ("is_available", "device_count", "get_device_properties", "mem_get_info",
                 "set_device", "current_device"):
        monkeypatch.setattr(torch.cuda, name, fail)
    import builtins
    import io
    import os
    import pathlib
    monkeypatch.setattr(builtins, "open", fail)
    monkeypatch.setattr(io, "open", fail)
    monkeypatch.setattr(pathlib.Path, "read_text", fail)
    monkeypatch.setattr(pathlib.Path, "read_bytes", fail)
    monkeypatch.setattr(os, "sched_getaffinity", fail)
    monkeypatch.setattr(os, "environ", {})
    for machine, facts, _ in ROWS.values():
        plan(TrainConfig(data="DATA"), facts, machine)
    assert str(plan(TrainConfig(data="DATA"), None, NODE).device) == "cuda:0"


def test_machine_detect_describes_this_box():
    machine = detect_machine(dist_env_from_environ())
    assert machine.cores >= 1 and machine.ram_bytes > 0 and machine.world_size == 1
    assert "pytorch" in machine.pipelines
    assert (machine.gpus == ()) == (not torch.cuda.is_available())
    assert machine.describe().startswith("this machine: ")


@pytest.mark.parametrize("row", ["cpu2-cifar", "cpu2-imagenet", "h200-imagenet"])
def test_a_loader_is_planned_like_train(row):
    """plan_loader (turbotrain.Loader) decides device, pipeline, order and threads as plan()
    does for the same data and machine; it asks no model, batch or schedule rule."""
    from turbotrain.train.plan import plan_loader
    machine, facts, _ = ROWS[row]
    config = TrainConfig(data="d", batch_size=64)
    full, loader = plan(config, facts, machine), plan_loader(config, facts, machine)
    for name in ("device", "pipeline", "order", "image_size", "threads"):
        assert loader[name] == full[name], name
    assert loader.budget == full.budget and loader.threads == full.threads
    assert not {"model", "lr", "warmup_steps", "batch_size"} & set(loader.decisions)
