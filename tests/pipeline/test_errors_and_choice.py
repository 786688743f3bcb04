"""Bad input gives one clear line; failing workers never hang; `auto` explains its choice."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from turbotrain.datasets import open_dataset
from turbotrain.pipeline import (PipelineError, PipelineOptions, PipelineUnavailable, build_auto,
                                 build_pipeline, choose_pipeline, choose_workers, pipeline_names,
                                 resident)
from turbotrain.pipeline.pytorch import MODES, PyTorchPipeline

from .conftest import build, product_pipelines, run_epoch

pytestmark = pytest.mark.timeout(60)

CPU = torch.device("cpu")

# Worker processes are child processes: that case runs in `make test` only (fast_lane.py).
WORKER_MODES = [pytest.param(mode, marks=pytest.mark.heavy) if mode == "processes" else mode
                for mode in sorted(MODES)]


def opts(image_size=32, **overrides):
    base = dict(train=True, batch_size=4, image_size=image_size, device=CPU, workers=2)
    base.update(overrides)
    return base


def test_unknown_pipeline_lists_the_choices(small_path):
    with pytest.raises(PipelineError) as error:
        build_pipeline("turbo", open_dataset(small_path), **opts())
    message = str(error.value)
    assert "turbo" in message and "\n" not in message
    assert all(name in message for name in pipeline_names())


@pytest.mark.parametrize("mode", WORKER_MODES)
def test_corrupt_sample_fails_in_the_caller_naming_it(mode, corrupt_path):
    """Sample 13 is garbage: the error reaches the main thread/process, one line, no hang."""
    dataset = open_dataset(corrupt_path)
    with PyTorchPipeline(dataset, PipelineOptions(**opts(train=False)), mode=mode) as pipeline:
        with pytest.raises(PipelineError) as error:
            run_epoch(pipeline)
    message = str(error.value)
    assert "sample 13" in message and corrupt_path in message and "\n" not in message


@pytest.mark.parametrize("name", product_pipelines())
def test_every_pipeline_reports_a_corrupt_sample(name, corrupt_path):
    with pytest.raises(PipelineError, match="sample 13"):
        with build(name, open_dataset(corrupt_path), **opts(train=False)) as pipeline:
            run_epoch(pipeline)


@pytest.mark.parametrize("mode", WORKER_MODES)
def test_processes_and_threads_agree(mode, photo_path):
    dataset = open_dataset(photo_path)
    runs = []
    for m in (mode, "threads"):
        with PyTorchPipeline(dataset, PipelineOptions(**opts()), mode=m) as pipeline:
            runs.append(run_epoch(pipeline, epoch=2))
    for (a, la), (b, lb) in zip(*runs):
        assert torch.equal(la, lb) and torch.equal(a, b)


def test_unknown_mode_lists_the_choices(small_path):
    with pytest.raises(PipelineError, match="threads"):
        PyTorchPipeline(open_dataset(small_path), PipelineOptions(**opts()), mode="fibers")


@pytest.mark.parametrize("mode", WORKER_MODES)
def test_stopping_early_and_closing_does_not_hang(mode, photo_path):
    pipeline = PyTorchPipeline(open_dataset(photo_path), PipelineOptions(**opts()), mode=mode)
    assert len(run_epoch(pipeline, limit=1)) == 1
    pipeline.close()
    pipeline.close()


def test_resident_refuses_over_budget_naming_both_sizes(small_path, monkeypatch):
    monkeypatch.setattr(resident, "memory_budget", lambda device: (1000, "a test budget"))
    with pytest.raises(PipelineUnavailable) as error:
        build_pipeline("resident", open_dataset(small_path), **opts(16))
    message = str(error.value)
    assert "needs" in message and "GiB" in message and "a test budget" in message


def test_auto_prefers_resident_then_falls_back(small_path, monkeypatch):
    dataset = open_dataset(small_path)
    options = PipelineOptions(**opts(16))
    name, reason = choose_pipeline(dataset, options)
    assert name == "resident" and "fits" in reason
    monkeypatch.setattr(resident, "memory_budget", lambda device: (1000, "a test budget"))
    import turbotrain.pipeline.auto as auto
    monkeypatch.setattr(auto, "memory_budget", lambda device: (1000, "a test budget"))
    name, reason = choose_pipeline(dataset, options)
    assert name == "pytorch" and "resident" in reason and "budget" in reason
    pipeline, reason = build_auto(dataset, **opts(16))
    with pipeline:
        assert pipeline.name == "pytorch"


def test_worker_choice_has_a_reason():
    assert choose_workers(3, "cpu") == (3, "3 workers as requested")
    count, reason = choose_workers(None, "cpu")
    assert count >= 1 and "cores" in reason


def test_bench_prints_json(small_path, capsys):
    from turbotrain.pipeline.bench import main
    assert main(["--data", small_path, "--image-size", "16", "--batch-size", "8",
                 "--batches", "3", "--warmup", "1", "--workers", "1", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    for name in [*pipeline_names(), "bare_decode"]:
        assert name in results and "images_per_second" in results[name]
    assert results["pytorch"]["images_per_second"] > 0


def test_bench_on_a_missing_dataset_is_one_line(tmp_path, capsys):
    """A user error, exit status 2 as train's; a raw folder gets train's two commands."""
    from turbotrain.pipeline.bench import main
    assert main(["--data", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("turbotrain bench: error:") and "\n" not in err
    (tmp_path / "photos" / "cat").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "photos" / "cat" / "0.png")
    assert main(["--data", str(tmp_path / "photos")]) == 2
    err = capsys.readouterr().err.strip()
    assert "is not a prepared dataset but a SOURCE" in err and "\n" not in err



def test_bench_fails_when_no_pipeline_could_run(small_path, capsys):
    from turbotrain.pipeline.bench import main
    # A batch larger than the split: every pipeline is unavailable, so the command must fail.
    assert main(["--data", small_path, "--pipeline", "pytorch", "--image-size", "16",
                 "--batch-size", "100000", "--batches", "1", "--workers", "1"]) == 1
    captured = capsys.readouterr()
    assert "unavailable" in captured.out
    err = captured.err.strip()
    assert err.startswith("turbotrain bench: error:") and "\n" not in err


def test_resident_asks_for_no_cores_beside_the_model(split):
    # Its batches, photo crops on a cv2 pool included, are made inside next() between steps:
    # the trainer's thread budget must give torch every core (it gave the demo only 1 of 2).
    _, dataset, _ = split
    with build_pipeline("resident", dataset, **opts(16)) as pipeline:
        assert pipeline.cpu_workers == 0
        assert run_epoch(pipeline, limit=2)


def test_thread_budget_gives_torch_the_cores_a_pipeline_leaves():
    from turbotrain.train.engine.builder import threads_after_pipeline
    from turbotrain.train.step.device import ThreadPlan

    class InProcess:
        cpu_workers = 0
    plan = threads_after_pipeline(ThreadPlan(2, 1, 1, "JPEG data"), InProcess())
    assert (plan.workers, plan.torch_threads) == (0, 2)
    plan = ThreadPlan(2, 1, 1, "JPEG data")
    assert threads_after_pipeline(plan, object()) is plan  # a loader with its own workers
