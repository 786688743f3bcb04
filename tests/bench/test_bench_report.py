"""BENCHMARKS.md rendering (bench/report.py, bench/sections.py, bench/run_all.py) from small fake
results; the one registry both the runner and the report follow (bench/registry.py); the
hand-kept notes a render never erases; the machine each section names; the committed
BENCHMARKS.md against a render of the committed results; and bench/bench_time_to_accuracy.py:
its metrics parsing always, its --quick smoke run when the Fashion-MNIST files are installed."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import bench_engines  # noqa: E402
import bench_kernel  # noqa: E402
import bench_pipelines  # noqa: E402
import bench_time_to_accuracy as tta  # noqa: E402
import common  # noqa: E402
import registry  # noqa: E402
import report  # noqa: E402
import run_all  # noqa: E402
import sections  # noqa: E402

pytestmark = pytest.mark.timeout(120)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# -- fake results, in the shapes the benchmark scripts write -------------------------------------
def fake_results(folder: Path) -> None:
    def write(name: str, data: dict) -> None:
        (folder / f"{name}.json").write_text(json.dumps(data))
    folder.mkdir(parents=True, exist_ok=True)
    write("prepare", {"images": 300, "turbotrain_images_per_second": 1234.0,
                      "plain_ffcv_images_per_second": 617.0, "speedup": 2.0,
                      "goals": [{"what": "prepare-dataset / FFCV DatasetWriter", "ratio": 2.0,
                                 "goal": 1.5, "met": True}]})
    write("sources", {"images": 2000, "images_per_second": {
        "imagefolder": 300.0, "webdataset": 330.0, "parquet": 240.0},
        "ratios": {"webdataset": 1.1, "parquet": 0.8},
        "goals": [{"what": "prepare from webdataset / from ImageFolder", "ratio": 1.1,
                   "goal": 0.9, "met": True},
                  {"what": "prepare from parquet / from ImageFolder", "ratio": 0.8,
                   "goal": 0.9, "met": False}]})
    write("pipelines", {
        "command": ".venv/bin/python bench/bench_pipelines.py --rounds 3", "workers": 2,
        "rounds": 3, "photos": {"images": 300, "size": "500x375 q90", "batch_size": 64,
                                "image_size": 224},
        "cifar": {"images": 5000, "size": "32x32 raw", "batch_size": 512},
        "results": {
            "pytorch": {"images_per_second": 3111.0, "images_per_cpu_second": 1555.0,
                        "what": "ours", "runs": []},
            "plain_ffcv": {"images_per_second": 1777.0, "images_per_cpu_second": 933.0,
                           "what": "FFCV", "runs": []},
            "plain_dali": {"images_per_second": None, "images_per_cpu_second": None,
                         "what": "DALI", "runs": [{"error": "exit 1: no DALI", "load": 1.0}]},
            "bare_decode": {"images_per_second": 3555.0, "images_per_cpu_second": 1777.0,
                            "what": "decode only", "runs": []},
            "resident_cifar": {"images_per_second": 1_100_000.0, "images_per_cpu_second": 1e6,
                               "what": "resident", "runs": []},
            "plain_ffcv_cifar": {"images_per_second": 210_000.0,
                                 "images_per_cpu_second": 150_000.0, "what": "FFCV small",
                                 "runs": []}},
        "goals": [{"ours": "pytorch", "theirs": "plain_ffcv", "goal": 1.2,
                   "ratio_images_per_second": 1.75, "ratio_images_per_cpu_second": 1.67,
                   "met": True},
                  {"ours": "resident_cifar", "theirs": "plain_ffcv_cifar", "goal": 6.0,
                   "ratio_images_per_second": 5.24, "met": False},
                  {"ours": "pytorch", "theirs": "plain_ffcv", "goal": 1.5,
                   "metric": "images_per_cpu_second", "ratio_images_per_second": 1.75,
                   "ratio_images_per_cpu_second": 1.67, "met": True},
                  {"ours": "pytorch", "theirs": "plain_torchvision_simd", "goal": None,
                   "ratio_images_per_second": 1.81, "met": None}]})
    write("kernel", {
        "command": "python bench/bench_kernel.py", "images": 3000, "size": "500x375 q90",
        "batch_size": 64, "image_size": 224,
        "busy": {"pytorch": {"alone": 1500.0, "busy": 1470.0, "kept": 0.98},
                 "pytorch_python": {"alone": 1480.0, "busy": 64.0, "kept": 0.043},
                 "plain_ffcv": {"error": "exit 1: no FFCV"}},
        "modes": {"pytorch": {"alone": 2900.0, "busy": 2700.0, "kept": 0.931}},
        "stages": {"region": {"decode_us": 512.3, "resize_us": 88.0,
                              "python_per_batch_us": 640.0},
                   "full": {"decode_us": 655.0, "resize_us": 87.0, "python_per_batch_us": 600.0},
                   "python_path_us": 812.0},
        "feed": {"before_us": 4.2, "after_us": 1.1},
        "use": {"native": {"predict_images_per_second": 900.0, "resident_load_s": 1.5},
                "python": {"predict_images_per_second": 700.0, "resident_load_s": 2.5}},
        "goals": [{"what": "beside a Python-busy thread, 1 decode thread: busy / alone, "
                           "pytorch", "ratio": 0.98, "goal": 0.9, "met": True}]})
    write("engines", {"command": "python bench/bench_engines.py --rounds 3", "workers": 2,
                      "rounds": 3, "photos": {"images": 300, "size": "500x375 q90",
                                              "batch_size": 64, "image_size": 224},
                      "results": {"pytorch": {"images_per_second": 2000.0, "what": "ours"},
                                  "ffcv": {"images_per_second": 1500.0, "what": "FFCV"}}})
    write("pillow", {"command": "python bench/bench_pillow.py --rounds 5", "images": 200,
                     "size": "512x384 q90", "output": "224x224", "rounds": 5, "repeats": 3,
                     "ratios": {"jpeg_decode_resize": 1.77, "decode": 0.99, "resize": 7.76,
                                "png_prepare": 0.99},
                     "results": {
                         "pillow-simd": {"version": "12.1.1.post0+avx2",
                                         "jpeg_images_per_second": 1316.0, "decode_ms": 0.67,
                                         "resize_ms": 0.09, "png_prepare_images_per_second": 318.0},
                         "pillow": {"version": "13.0.0", "jpeg_images_per_second": 746.0,
                                    "decode_ms": 0.66, "resize_ms": 0.68,
                                    "png_prepare_images_per_second": 320.0}}})
    write("train_precision", {"cpu_native_bf16": True, "threads": 2, "batch_size": 64,
                              "steps": 6, "rounds": 2, "results": [
                                  {"model": "compact28", "image_size": 28, "precision": "fp32",
                                   "channels_last": False, "images_per_second": 971.4,
                                   "speedup_vs_fp32_contiguous": 1.0},
                                  {"model": "compact28", "image_size": 28, "precision": "bf16",
                                   "channels_last": True, "images_per_second": 2212.6,
                                   "speedup_vs_fp32_contiguous": 2.278}]})
    write("time_to_accuracy", {
        "command": "python bench/bench_time_to_accuracy.py", "quick": False, "target": 0.9,
        "epochs": 3, "train_images": 60000, "test_images": 10000, "speedup": 3.456,
        "speedup_with_prepare": 3.21, "speedup_per_epoch": 3.33,
        "turbotrain": {"seconds_to_target": 81.5, "epochs_to_target": 2, "final_accuracy": 0.9134,
                       "images_per_second": 1900.0, "process_seconds": 130.0,
                       "seconds_per_epoch": 41.0,
                       "prepare_seconds": 5.2, "curve": [[40.0, 0.87], [81.5, 0.905],
                                                         [122.0, 0.9134]],
                       "settings": {"precision": "bf16", "channels_last": True,
                                    "pipeline": "resident", "batch_size": 128}},
        "plain_pytorch": {"seconds_to_target": 281.7, "epochs_to_target": 2,
                          "final_accuracy": 0.9101, "images_per_second": 450.0,
                          "seconds_per_epoch": 140.0,
                          "process_seconds": 430.0, "curve": [[140.0, 0.86], [281.7, 0.902],
                                                              [420.0, 0.9101]],
                          "settings": {"precision": "fp32", "channels_last": False}},
        "plain_pytorch_user_recipe": {
            "seconds_to_target": None, "epochs_to_target": None, "final_accuracy": 0.8986,
            "images_per_second": 455.0, "seconds_per_epoch": 139.0, "process_seconds": 425.0,
            "curve": [[139.0, 0.84], [278.0, 0.888], [417.0, 0.8986]],
            "settings": {"recipe": "a user's usual: Adam lr 1e-3"}},
        "speedup_vs_user_recipe": 5.117, "speedup_vs_user_recipe_is_lower_bound": True,
        "goals": [{"what": "seconds to 90%: plain / turbotrain", "ratio": 3.456, "goal": 3.0,
                   "met": True}]})
    write("ddp", {"global_batch": 64, "rounds": 2, "cores": 2, "results": [
        {"model": "compact28", "layout": "1 process x 1 thread", "processes": 1,
         "images_per_second": 1000.0, "data_wait_fraction": 0.005},
        {"model": "compact28", "layout": "2 processes x 1 thread, DDP", "processes": 2,
         "images_per_second": 1710.0, "data_wait_fraction": 0.022,
         "speedup_vs_one_process": 1.71,
         "gradient_allreduce": {"gradient_megabytes": 0.55, "median_ms": 0.62}}]})
    write("predict", {
        "command": "python bench/bench_predict.py --rounds 3", "workers": 2, "batch_size": 64,
        "images": 2000, "size": "500x375 q90", "rounds": 3,
        "results": {"input": {"64": {"predict": 2916.0, "eval_pipeline": 3164.0,
                                     "ratio": 0.9216},
                              "224": {"predict": 1190.0, "eval_pipeline": 1254.0,
                                      "ratio": 0.949}},
                    "command": {"predict": 171.0, "eval": 156.0, "ratio": 1.096}},
        "load": {"airbench": {"load_seconds": 0.11, "process_seconds": 3.5, "bytes": 8e6},
                 "resnet50": {"load_seconds": 1.38, "process_seconds": 4.2, "bytes": 94e6}},
        "goals": [{"what": "input 64 px: predict / eval pipeline", "ratio": 0.9216,
                   "goal": 0.9, "met": True},
                  {"what": "input 224 px: predict / eval pipeline", "ratio": 0.949,
                   "goal": 0.9, "met": True},
                  {"what": "command (64 px airbench): predict / eval", "ratio": 1.096,
                   "goal": 0.9, "met": True},
                  {"what": "load a run (airbench, resnet50), seconds", "seconds": 1.38,
                   "goal_seconds": 2.0, "met": True}]})
    write("order", {
        "command": "python bench/bench_order.py", "split_mib": 2048, "limit_mib": 512,
        "side": 64, "sample_bytes": 12288, "read_ahead_kb": "128",
        "contenders": {"read_random": "random order, read path",
                       "read_quasi": "quasi-random order, read path",
                       "pytorch_random": "pytorch pipeline, random order",
                       "pytorch_quasi": "pytorch pipeline, quasi-random order"},
        "runs": {"read_random": [{"images_per_second": 253.0}],
                 "read_quasi": [{"images_per_second": 6100.0}],
                 "pytorch_random": [{"images_per_second": 240.0}],
                 "pytorch_quasi": [{"error": "exit 1: out of memory", "load": 1.0}]},
        "best": {"read_random": {"images_per_second": 253.0, "stored_mib_per_second": 2.97,
                                 "cache_drops": 3},
                 "read_quasi": {"images_per_second": 6100.0, "stored_mib_per_second": 71.5,
                                "cache_drops": 40},
                 "pytorch_random": {"images_per_second": 240.0, "stored_mib_per_second": 2.8,
                                    "cache_drops": 2},
                 "pytorch_quasi": None},
        "ratios": [{"what": "read_quasi / read_random", "ratio": 24.11},
                   {"what": "pytorch_quasi / pytorch_random", "ratio": None}],
        "goals": [{"what": "quasi-random vs random order, pytorch pipeline, split 4x the "
                           "page-cache limit", "ratio": None, "goal": 1.0, "met": None}]})
    def against_train(ours: str, mine: float, train: float, **extra) -> dict:
        return {"command": f"python bench/bench_{ours}.py", "images": 3000, "image_size": 64,
                "batch_size": 64, "steps": 40, "warmup_steps": 1, "model": "airbench",
                "precision": "fp32", "pipeline": "pytorch", "rounds": 2, "ratio": mine / train,
                "results": {ours: {"images_per_second": mine, "runs": []},
                            "train": {"images_per_second": train, "runs": []}},
                "goals": [{"what": f"{ours} / train, images/s", "ratio": mine / train,
                           "goal": 0.98 if ours == "loader" else 0.9,
                           "met": mine / train >= (0.98 if ours == "loader" else 0.9)}],
                **extra}
    write("loader", against_train("loader", 99.0, 100.0))
    write("lightning", against_train("lightning", 85.0, 100.0, profile={
        "fit_seconds": 12.5, "actions": {"run_training_batch": 10.0,
                                         "[Strategy]SingleDeviceStrategy.backward": 6.0}}))
    write("remote", {
        "command": "python bench/bench_remote.py", "shard_mib": 32, "shards": 4, "rounds": 3,
        "ratios": {"whole": 1.31, "metadata": 2.5, "warm_vs_local": 0.97,
                   "cold_vs_store": 0.62},
        "results": {"s3fs": {"version": "2025.3.0", "whole_mb_per_second": 180.0,
                             "metadata_ms": 5.0, "runs": []},
                    "obstore": {"version": "0.6.0", "whole_mb_per_second": 236.0,
                                "metadata_ms": 2.0, "runs": []}},
        "split": {"shards": 4, "samples": 10000, "side": 32},
        "read": {"local_images_per_second": 410_000.0, "warm_images_per_second": 398_000.0,
                 "cold_images_per_second": 21_000.0, "cold_mb_per_second": 66.0,
                 "store_mb_per_second": 106.0},
        "reads": {},
        "goals": [{"what": "remote with a warm cache vs local, samples/s", "ratio": 0.97,
                   "goal": 0.95, "met": True}]})


def render(tmp_path: Path) -> str:
    """The document from tmp_path/results and tmp_path/NOTES.md (absent unless a test writes
    it), never from the repository's own notes."""
    out = tmp_path / "doc" / "BENCHMARKS.md"
    assert report.render(tmp_path / "results", out, tmp_path / "NOTES.md") == out
    return out.read_text()


# -- the report -----------------------------------------------------------------------------------
def test_report_has_every_table_with_its_numbers_and_goals(tmp_path):
    fake_results(tmp_path / "results")
    text = render(tmp_path)
    # kernel: both thread counts, the stages, the feed, predict and resident, its goal
    assert "| `pytorch_python` | 1,480 | 64 | 4% |" in text
    assert "| `plain_ffcv` | - | - | failed: exit 1: no FFCV |" in text
    assert "| region decode (the pipelines') | 10.0 | 512 | 88 |" in text
    assert "4.2 µs per image as a per-sample Python loop, 1.1 µs vectorised" in text
    assert "| Python decode path (before) | 700 | 2.50 s |" in text
    assert ("| kernel | beside a Python-busy thread, 1 decode thread: busy / alone, pytorch | "
            ">= 0.9x | 0.98x | met |") in text
    assert ("| pipelines | `pytorch` / `plain_ffcv` per CPU-second | >= 1.5x | 1.67x | met |"
            in text)
    for heading in ("## Machines", "## Goals", "## Contenders", "## Dataset conversion", "## Input pipelines",
                    "## The compiled decode kernel",
                    "## Our pipeline engines", "## PIL decode + resize", "## Training step",
                    "## Time to 90 %",
                    "## Several processes (DDP)", "## Your own loop: turbotrain.Loader vs train",
                    "## Lightning: TurbotrainDataModule vs train", "## Using a model",
                    "## Sample order",
                    "## Datasets in object storage", "## GPU"):
        assert heading in text
    # order: every contender, a failed one with its error, and a goal not measured
    assert "| `read_quasi` | 6,100 | 72 | 40 | quasi-random order, read path |" in text
    assert "| `pytorch_quasi` | - | - | - | failed: exit 1: out of memory |" in text
    assert "read_quasi / read_random **24.11x**; pytorch_quasi / pytorch_random **n/a**" in text
    assert ("| order | quasi-random vs random order, pytorch pipeline, split 4x the page-cache "
            "limit | >= 1x | - | not measured |") in text
    # remote: the warm-cache goal in the goals table; cold cache and the clients without one
    assert ("| remote | remote with a warm cache vs local, samples/s | >= 0.95x | 0.97x | met |"
            in text)
    assert "| s3://, warm cache | 398,000 | - | 0.97x |" in text
    assert "| s3://, empty cache (downloads included) | 21,000 | 66 | - |" in text
    assert "| the store alone (obstore downloads) | - | 106 | - |" in text
    assert "Empty cache / the store's own bandwidth: **0.62x**" in text
    assert "| `obstore` | 0.6.0 | 236 | 2.00 |" in text
    assert "obstore / s3fs: whole shards 1.31x, metadata 2.50x faster" in text
    assert text.count("| remote |") == 1
    # loader and lightning against train: the rows, the goals, where Lightning's time went
    assert "| loader | loader / train, images/s | >= 0.98x | 0.99x | met |" in text
    assert "| lightning | lightning / train, images/s | >= 0.9x | 0.85x | **not met** |" in text
    assert "| `train` | 100 | the `train` command (its summary.json) |" in text
    assert "| `[Strategy]SingleDeviceStrategy.backward` | 6.000 |" in text
    assert "Where the fit's 12.5 s went" in text
    # sources: every kind's rate beside the ImageFolder's, and both goals
    assert "| webdataset | 330 | 1.10x |" in text and "| imagefolder | 300 | 1.00x |" in text
    assert ("| sources | prepare from parquet / from ImageFolder | >= 0.9x | 0.80x | "
            "**not met** |") in text
    assert "## Conversion speed by source" in text
    assert "| predict | input 64 px: predict / eval pipeline | >= 0.9x | 0.92x | met |" in text
    assert "| predict | load a run (airbench, resnet50), seconds | < 2 s | 1.38 s | met |" in text
    assert "| input, 224 px | 1,190 | 1,254 | 0.95x |" in text
    assert "| `resnet50` | 1.38 | 94 MB | 4.2 |" in text
    # goal next to the measured ratio, in the summary table
    assert "| prepare | prepare-dataset / FFCV DatasetWriter | >= 1.5x | 2.00x | met |" in text
    assert "| pipelines | `pytorch` / `plain_ffcv` | >= 1.2x | 1.75x | met |" in text
    assert ("| pipelines | `resident_cifar` / `plain_ffcv_cifar` | >= 6.0x | 5.24x | "
            "**not met** |") in text
    # A comparison without a goal is shown in its section, never in the goals table.
    assert "| `pytorch` / `plain_torchvision_simd` | none (comparison) | 1.81x |" in text
    assert "| pipelines | `pytorch` / `plain_torchvision_simd`" not in text
    assert ">= 3x | 3.46x | met |" in text
    assert ("| compact28 | 2 processes x 1 thread, DDP | 1,710 | 1.71x | 2.20% | 0.6 MB in "
            "0.62 ms (median) |") in text
    # the user-recipe baseline: its row, a lower bound, and no second goal
    assert "| plain PyTorch, a user's recipe | not reached |" in text
    assert "did not reach 90% in 3 epochs (final 89.86%): turbotrain is at least 5.12x" in text
    assert text.count("| time_to_accuracy |") == 1
    # the numbers of each benchmark
    for number in ("1,234", "617", "3,111", "1,100,000", "failed: exit 1: no DALI",
                   "0.75x", "2,212.6", "2.28x", "81.5", "281.7", "91.34%", "counting the "
                   "one-off prepare: 3.21x", "per epoch (after the first): 3.33x",
                   "| 41.0 |", "| 140.0 |", "1,710", "| `pillow-simd` | 12.1.1.post0+avx2 | "
                   "1,316 | 0.67 | 0.09 | 318 |", "decode + resize **1.77x** (decode 0.99x, "
                   "resize 7.76x)"):
        assert number in text, number
    # the exact commands: the JSON's own, else the script's default
    assert ".venv/bin/python bench/bench_pipelines.py --rounds 3" in text
    assert "```\npython bench/bench_prepare.py\n```" in text
    assert "**No GPU table was measured**" in text
    # fake results record no machine: each section says so, and the table has nobody
    assert "Results of " in text and ", the machine was not recorded." in text
    assert "No section recorded its machine." in text


def test_report_draws_the_plots_and_links_them_relative_to_the_document(tmp_path):
    fake_results(tmp_path / "results")
    text = render(tmp_path)
    for name in ("pipelines.png", "time_to_accuracy.png"):
        plot = tmp_path / "results" / name
        assert plot.read_bytes()[:8] == PNG_MAGIC
        assert plot.stat().st_size > 5000  # bars/lines drawn, not an empty canvas
        assert f"](../results/{name})" in text


def test_report_without_results_says_what_is_missing(tmp_path):
    (tmp_path / "results").mkdir()
    text = render(tmp_path)
    assert "No results (bench/results/prepare.json is missing)." in text
    assert ("**No GPU table was measured** (bench/results/gpu_check.json is missing): it needs "
            "a CUDA GPU.") in text
    assert "No section recorded its machine." in text  # never the rendering machine's
    assert not list((tmp_path / "results").glob("*.png"))


def test_report_leaves_out_a_benchmark_with_neither_script_nor_results(tmp_path, monkeypatch):
    ghost = registry.Benchmark("ghost", "bench_ghost.py", "A benchmark not written yet")
    monkeypatch.setattr(report, "BENCHMARKS", (*registry.BENCHMARKS, ghost))
    (tmp_path / "results").mkdir()
    text = render(tmp_path)
    assert "## A benchmark not written yet" not in text
    assert "## Several processes (DDP)" in text  # its script exists: "No results" is news


def test_report_notes_failed_absent_and_skipped_scripts(tmp_path):
    results = tmp_path / "results"
    fake_results(results)
    (results / "run_all.json").write_text(json.dumps({
        "benchmarks": {
            "engines": {"status": "failed", "error": "exit 1: boom", "command": "python x"},
            "ddp": {"status": "absent", "script": "bench/bench_ddp.py"},
            "gpu_check": {"status": "skipped", "error": "needs a CUDA GPU; this machine has "
                                                      "none"}}}))
    text = render(tmp_path)
    assert "The last run **failed** (exit 1: boom)" in text
    assert "Not run: bench/bench_ddp.py does not exist yet." in text
    assert "## GPU\n\nNot run: needs a CUDA GPU; this machine has none.\n" in text


def test_report_says_whether_a_failed_run_still_wrote_its_results(tmp_path):
    results = tmp_path / "results"
    fake_results(results)
    failed = {"status": "failed", "error": "exit 1: a check failed"}
    statuses = {"prepare": {**failed, "started": "2000-01-01T00:00:00"},  # JSON newer: this run
                "engines": {**failed, "started": "2999-01-01T00:00:00"}}  # JSON older
    (results / "run_all.json").write_text(json.dumps({"benchmarks": statuses}))
    text = render(tmp_path)
    assert "(exit 1: a check failed); it still wrote the results below." in text
    assert "(exit 1: a check failed); the results below are from an earlier run." in text


def test_report_gpu_table_when_gpu_check_ran_on_cuda(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "gpu_check.json").write_text(json.dumps({
        "device": "NVIDIA H200", "torch": "2.14.1",
        "settings": {"device": "cuda", "model": "resnet50", "image_size": 224,
                     "batch_size": 256},
        "rows": [{"pipeline": "synthetic (on GPU)", "alone": None, "train": 3000.0,
                  "of_bound": 1.0},
                 {"pipeline": "dali", "alone": 9000.0, "train": 2950.0, "of_bound": 0.983},
                 {"pipeline": "pytorch", "alone": 1200.0, "train": 1100.0, "of_bound": 0.367},
                 {"pipeline": "ffcv", "error": "RuntimeError: no"}],
        "checks": [{"check": "dali on cuda", "ok": True, "detail": "labels equal"}],
        "notes": ["simplejpeg is MISSING"], "pipeline_goal": 0.95,
        "goals": [{"goal": "train defaults on dali >= 95% of the synthetic bound",
                   "measured": "2,950 / 3,000 images/s = 98.3%", "verdict": "met"}]}))
    text = render(tmp_path)
    assert "| train defaults on dali >= 95% of the synthetic bound | 2,950 / 3,000 images/s " \
           "= 98.3% | met |" in text
    assert "No GPU table was measured" not in text
    assert "NVIDIA H200" in text and "| dali | 9,000 | 2,950 | 98.30% |  |" in text
    assert "36.7% (worst: pytorch) | **not met** |" in text
    assert "failed: RuntimeError: no" in text and "- simplejpeg is MISSING" in text


def test_report_treats_the_gpu_check_smoke_run_as_no_gpu(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "gpu_check.json").write_text(json.dumps({
        "device": "cpu (smoke)", "settings": {"device": "cpu"}, "rows": []}))
    assert "**No GPU table was measured** (gpu_check.json holds only the CPU smoke run)" in \
        render(tmp_path)


# -- the machine each section was measured on ------------------------------------------------------
def test_each_section_names_the_machine_that_measured_it(tmp_path):
    results = tmp_path / "results"
    fake_results(results)
    avx512 = {"cpu": "Test EPYC", "cores": 2, "simd": "AVX-512 + bf16", "gpu": None,
              "torch": "2.99", "python": "3.11.7", "platform": "Linux-test",
              "load_average": "0.50 0.40 0.30"}
    avx2 = {**avx512, "simd": "AVX2 without AVX-512", "load_average": "1.90 1.80 1.70"}
    for name, machine, measured in (("prepare", avx512, "2030-01-01T10:00:00"),
                                    ("engines", {**avx512, "load_average": "1.00 1.00 1.00"},
                                     "2030-01-01T10:05:00"),
                                    ("pipelines", avx2, "2030-01-02T08:30:00")):
        path = results / f"{name}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "machine": machine,
                                    "measured": measured}))
    text = render(tmp_path)
    # one row per machine (the load is not the machine), citing the sections it measured
    assert ("| A | Test EPYC | 2 | AVX-512 + bf16 | none | 2.99 | 3.11.7 | Linux-test | "
            "prepare, engines |") in text
    assert "| B | Test EPYC | 2 | AVX2 without AVX-512 | none |" in text and "| pipelines |" in text
    # each section: when (the JSON's time, not the file's) and where, its own load
    assert ("Results of 2030-01-01 10:00, on machine A (Test EPYC, 2 cores, AVX-512 + bf16, "
            "no GPU; load average 0.50 0.40 0.30).") in text
    assert "Results of 2030-01-01 10:05, on machine A (Test EPYC, 2 cores, AVX-512 + bf16, " \
           "no GPU; load average 1.00 1.00 1.00)." in text
    assert "Results of 2030-01-02 08:30, on machine B (Test EPYC, 2 cores, AVX2 without " \
           "AVX-512, no GPU; load average 1.90 1.80 1.70)." in text
    assert ", the machine was not recorded." in text  # the fakes left as they were
    # the one machine table: no "## Machine" describing a single box for the whole file
    assert text.count("| machine | CPU |") == 1 and "## Machine\n" not in text


def test_write_results_records_when_and_where(tmp_path):
    path = common.write_results(tmp_path / "x.json", {"command": "python bench/x.py"})
    written = json.loads(path.read_text())
    assert written["command"] == "python bench/x.py"
    assert set(written["machine"]) >= {"cpu", "cores", "simd", "gpu", "torch", "python",
                                       "platform", "load_average"}
    assert written["machine"]["cores"] >= 1
    assert report.measured_at(written, path).year >= 2026
    # a result that brings its own machine (a recovered one) keeps it
    kept = common.write_results(tmp_path / "y.json", {"machine": {"note": "recorded by hand"}})
    assert json.loads(kept.read_text())["machine"] == {"note": "recorded by hand"}


def test_simd_names_what_changes_the_rates():
    assert common.simd(frozenset({"avx2", "avx512f", "avx512_bf16"})) == "AVX-512 + bf16"
    assert common.simd(frozenset({"avx2", "avx512f", "avx512_bf16", "amx_tile"})) == \
        "AVX-512 + bf16 + AMX"
    assert common.simd(frozenset({"avx2"})) == "AVX2 without AVX-512"
    assert common.simd(frozenset()) == "no AVX2"


# -- the hand-kept notes --------------------------------------------------------------------------
def test_render_only_keeps_the_hand_written_notes(tmp_path):
    results = tmp_path / "results"
    fake_results(results)
    path = results / "pipelines.json"
    path.write_text(json.dumps({**json.loads(path.read_text()),
                                "measured": "2030-01-02T08:30:00"}))
    notes = tmp_path / "NOTES.md"
    notes.write_text("# Notes\n\nThe preamble, not rendered.\n\n"
                     "## pipelines (about the results of 2030-01-02 08:30)\n\n"
                     "Three more runs gave 1.89x, 2.08x and 2.10x.\n\n"
                     "## gpu_check\n\nRun `make gpu-check` on a GPU machine.\n")
    before = notes.read_text()
    out = tmp_path / "BENCHMARKS.md"
    argv = ["--render-only", "--results", str(results), "--output", str(out),
            "--notes", str(notes)]
    for _ in range(2):  # a second render from the document's own inputs loses nothing
        assert run_all.main(argv) == 0
        text = out.read_text()
        assert ("*Notes on these results (bench/NOTES.md):*\n\nThree more runs gave 1.89x, "
                "2.08x and 2.10x.") in text
        assert "*Notes (bench/NOTES.md):*\n\nRun `make gpu-check` on a GPU machine." in text
        assert "The preamble" not in text
    assert notes.read_text() == before  # the renderer never writes the notes
    # each note sits in its own section, after the section's tables
    pipelines = text.split("## Input pipelines")[1].split("\n## ")[0]
    assert pipelines.index("| ours / theirs |") < pipelines.index("Three more runs")
    # newer results: the note is kept and says which results it was about
    path.write_text(json.dumps({**json.loads(path.read_text()),
                                "measured": "2030-02-01T09:00:00"}))
    assert run_all.main(argv) == 0
    assert ("*Notes on the results of 2030-01-02 08:30, not the ones above (bench/NOTES.md):*"
            in out.read_text())


def test_a_note_for_no_benchmark_is_refused_with_the_names(tmp_path):
    notes = tmp_path / "NOTES.md"
    notes.write_text("## pipeline\n\ntypo\n")
    with pytest.raises(ValueError, match="'## pipeline' names no benchmark.*pipelines, kernel"):
        report.read_notes(notes)
    assert report.read_notes(tmp_path / "absent.md") == {}


# -- the committed document ------------------------------------------------------------------------
def test_benchmarks_md_is_what_render_only_makes_of_the_committed_files(tmp_path):
    """BENCHMARKS.md is a function of bench/results/ and bench/NOTES.md: rendering them again
    (into a copy, so the committed plots stay as they are) gives the committed file, every
    result file says when and where it was measured, and each section cites a machine."""
    copy = tmp_path / "bench" / "results"
    copy.mkdir(parents=True)
    for result in sorted(report.RESULTS_DIR.glob("*")):
        if result.suffix in (".json", ".png"):
            (copy / result.name).write_bytes(result.read_bytes())
            if result.suffix == ".json" and result.name != report.RUN_ALL_NAME:
                data = json.loads(result.read_text())
                assert data.get("measured") and data.get("machine"), result.name
    out = tmp_path / "BENCHMARKS.md"
    report.render(copy, out, report.NOTES)
    assert out.read_text() == report.OUTPUT.read_text(), (
        "BENCHMARKS.md differs from a render of bench/results/ and bench/NOTES.md: run "
        "`python bench/run_all.py --render-only` and commit the result")
    assert out.read_text().count(", on machine ") == len(list(copy.glob("*.json"))) - int(
        (copy / report.RUN_ALL_NAME).is_file())


# -- run_all --------------------------------------------------------------------------------------
def test_run_all_render_only_writes_the_document(tmp_path, capsys):
    fake_results(tmp_path / "results")
    out = tmp_path / "BENCHMARKS.md"
    assert run_all.main(["--render-only", "--results", str(tmp_path / "results"),
                         "--output", str(out)]) == 0
    assert "3.46x" in out.read_text()
    assert not (tmp_path / "results" / "run_all.json").exists()  # nothing ran


@pytest.mark.usefixtures("child_processes")
def test_run_all_records_absent_failed_and_ok_scripts(tmp_path, monkeypatch):
    scripts = tmp_path / "bench"
    scripts.mkdir()
    (scripts / "ok.py").write_text("print('fine')\n")
    (scripts / "bad.py").write_text("import sys\nprint('something broke')\nsys.exit(3)\n")
    (scripts / "hangs.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setattr(run_all, "ROOT", scripts)
    suite = [run_all.Benchmark("ok", "ok.py", "OK"), run_all.Benchmark("bad", "bad.py", "Bad"),
             run_all.Benchmark("missing", "missing.py", "Missing"),
             run_all.Benchmark("gpu", "ok.py", "GPU", needs_cuda=True)]
    statuses = {b.name: run_all.run_one(b, gpu=None, timeout=30) for b in suite}
    statuses["hangs"] = run_all.run_one(run_all.Benchmark("hangs", "hangs.py", "Hangs"), None,
                                        timeout=1)
    assert statuses["ok"]["status"] == "ok"
    assert statuses["bad"]["status"] == "failed"
    assert statuses["bad"]["error"] == "exit 3: something broke"
    assert statuses["missing"]["status"] == "absent"
    assert statuses["gpu"]["status"] == "skipped"
    assert statuses["hangs"] == {**statuses["hangs"], "status": "failed",
                                 "error": "timed out after 1 s"}
    run_all.record(tmp_path / "results", None, {"bad": statuses["bad"]})
    run_all.record(tmp_path / "results", None, {"ok": statuses["ok"]})  # --only keeps the rest
    recorded = json.loads((tmp_path / "results" / "run_all.json").read_text())
    assert set(recorded["benchmarks"]) == {"bad", "ok"}
    assert recorded["machine"]["cores"] >= 1


def test_one_registry_orders_the_runner_and_the_report(tmp_path, monkeypatch):
    names = [b.name for b in registry.BENCHMARKS]
    # the runner runs the registry's benchmarks, in its order; --only takes its names
    ran = []
    monkeypatch.setattr(run_all, "cuda_device", lambda: None)
    monkeypatch.setattr(run_all, "run_one", lambda b, gpu, timeout: ran.append(b) or
                        {"status": "ok", "command": b.command})
    argv = ["--results", str(tmp_path / "results"), "--output", str(tmp_path / "B.md"),
            "--notes", str(tmp_path / "NOTES.md")]
    assert run_all.main(argv) == 0
    assert ran == list(registry.BENCHMARKS)
    ran.clear()
    assert run_all.main(["--only", "demo", "prepare", *argv]) == 0
    assert ran == [registry.BY_NAME["demo"], registry.BY_NAME["prepare"]]
    with pytest.raises(SystemExit):
        run_all.main(["--only", "no_such_benchmark", *argv])
    # the report: a renderer for every benchmark and a benchmark for every renderer
    assert set(sections.RENDERERS) == set(names)
    with pytest.raises(KeyError, match="no benchmark 'nope'; the benchmarks: prepare, sources"):
        sections.renders("nope")
    # ... and its sections come in the registry's order, under the registry's titles (the
    # runs above only recorded their statuses: every section says "No results")
    text = render(tmp_path)
    titles = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert titles[3:] == [b.title for b in registry.BENCHMARKS]
    for benchmark in registry.BENCHMARKS:
        assert (BENCH / benchmark.script).is_file()
        assert f"```\n{benchmark.command}\n```" in text


def test_every_contender_has_one_name_whose_code_it_says():
    shown = (set(bench_pipelines.CONTENDERS) | set(bench_kernel.BUSY) | set(bench_kernel.MODES)
             | set(bench_engines.CONTENDERS))
    assert shown <= set(registry.CONTENDERS), shown - set(registry.CONTENDERS)
    ours = {"pytorch", "resident", "dali", "ffcv"}  # our pipelines, as --pipeline takes them
    for name, contender in registry.CONTENDERS.items():
        if contender.whose == registry.TURBOTRAIN:
            assert name.split("_")[0] in ours | {"native"}, name
        elif name != "bare_decode":  # a reference, neither side's loader
            assert name.startswith("plain_"), name
    # a goal compares two contenders by those names
    for ours_name, theirs, *_ in bench_pipelines.GOALS:
        assert {ours_name, theirs} <= set(registry.CONTENDERS)


# -- bench_time_to_accuracy -----------------------------------------------------------------------
def test_user_recipe_speedup_is_exact_or_a_lower_bound():
    reached = {"seconds_to_target": 100.0, "curve": [[50.0, 0.88], [100.0, 0.9]]}
    assert tta.user_recipe_speedup(reached, 25.0) == {
        "speedup_vs_user_recipe": 4.0, "speedup_vs_user_recipe_is_lower_bound": False}
    # Never reached: its whole training time over ours is the most it can be held to.
    missed = {"seconds_to_target": None, "curve": [[50.0, 0.8], [150.0, 0.89]]}
    assert tta.user_recipe_speedup(missed, 30.0) == {
        "speedup_vs_user_recipe": 5.0, "speedup_vs_user_recipe_is_lower_bound": True}
    assert tta.user_recipe_speedup(missed, None)["speedup_vs_user_recipe"] is None


def test_time_to_target_parsing_of_a_metrics_file(tmp_path):
    lines = [{"kind": "step", "epoch": 0, "step": 20, "loss": 1.8, "time": 8.0},
             {"kind": "epoch", "epoch": 0, "step": 469, "val_accuracy": 0.871, "time": 40.2},
             {"kind": "epoch", "epoch": 1, "step": 938, "val_accuracy": 0.9004, "time": 80.7},
             {"kind": "epoch", "epoch": 2, "step": 1407, "val_accuracy": 0.8999, "time": 120.0}]
    text = "\n".join(json.dumps(line) for line in lines) + "\n{\"kind\": \"epo"  # torn last line
    (tmp_path / "metrics.jsonl").write_text(text)
    records = tta.epoch_records(tmp_path)
    assert [r["epoch"] for r in records] == [0, 1, 2]
    assert tta.first_reaching(records, 0.9) == (80.7, 2)
    assert tta.first_reaching(records, 0.95) == (None, None)
    assert tta.curve(records) == [[40.2, 0.871], [80.7, 0.9004], [120.0, 0.8999]]
    assert tta.seconds_per_epoch(records) == pytest.approx((120.0 - 40.2) / 2)
    assert tta.seconds_per_epoch(records[:1]) == 40.2 and tta.seconds_per_epoch([]) is None
    assert tta.epoch_records(tmp_path / "absent") == []


def test_time_to_target_summary_line_and_fastest_round():
    ours = [{"seconds_to_target": 90.0, "epochs_to_target": 2, "final_accuracy": 0.91},
            {"seconds_to_target": 80.0, "epochs_to_target": 2, "final_accuracy": 0.912}]
    best = tta.fastest(ours)
    assert best["seconds_to_target"] == 80.0 and best["rounds_seconds_to_target"] == [90.0, 80.0]
    line = tta.summary_line({
        "target": 0.9, "epochs": 3, "speedup": 3.5, "speedup_with_prepare": 3.3,
        "turbotrain": {**best, "prepare_seconds": 5.0},
        "plain_pytorch": {"seconds_to_target": 280.0, "epochs_to_target": 2,
                          "final_accuracy": 0.91}})
    assert "turbotrain 80.0 s (2 epochs" in line and "speedup 3.50x" in line and "met" in line
    assert "per epoch" not in line  # not in the report: not said
    missed = tta.summary_line({
        "target": 0.9, "epochs": 3, "speedup": None, "speedup_with_prepare": None,
        "turbotrain": {**best, "prepare_seconds": 5.0},
        "plain_pytorch": {"seconds_to_target": None, "epochs_to_target": None,
                          "final_accuracy": 0.88}})
    assert "plain PyTorch did not reach 90% in 3 epochs (final 88.00%)" in missed
    assert "speedup n/a" in missed


@pytest.mark.usefixtures("child_processes")
@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.skipif(not tta.SOURCE.is_dir(), reason="Debian's dataset-fashion-mnist is not "
                    "installed")
@pytest.mark.slow
def test_time_to_accuracy_quick_runs_both_sides_end_to_end(tmp_path):
    """~30 s on a quiet 2-core machine; minutes when the machine is busy."""
    out = tmp_path / "tta.json"
    assert tta.main(["--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["quick"] and result["train_images"] == tta.QUICK["train"]
    for side in ("turbotrain", "plain_pytorch", "plain_pytorch_user_recipe"):
        r = result[side]
        assert 0.2 < r["final_accuracy"] <= 1.0  # learnt something in 15 steps
        assert r["images_per_second"] > 0 and len(r["curve"]) == result["epochs"]
    assert result["turbotrain"]["settings"]["precision"] in ("bf16", "fp32")
    assert result["turbotrain"]["prepare_seconds"] > 0
    doc = tmp_path / "BENCHMARKS.md"
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "time_to_accuracy.json").write_text(out.read_text())
    report.render(tmp_path / "results", doc)
    assert "Smoke run (--quick)" in doc.read_text()


# -- bench_demo.py: its goals and how its section says the demo ended ----------------------------
def test_bench_demo_judges_the_demo_and_each_budget_within_ten_percent():
    import bench_demo
    demo = {"train_seconds": 4.8, "val_accuracy": 0.988, "total_seconds": 8.1}
    budgets = [{"budget_seconds": 30.0, "train_seconds": 27.6, "used_fraction": 0.92,
                "val_accuracy": 1.0},
               {"budget_seconds": 60.0, "train_seconds": 50.0, "used_fraction": 0.833,
                "val_accuracy": 0.998}]
    goals = bench_demo.goals(demo, budgets)
    assert [g["met"] for g in goals] == [True, True, True, False]  # 50 s is under 54 s
    assert goals[2]["what"] == "--time-budget 30s: training in 27-33 s"
    assert bench_demo.summary_line(demo, budgets[:1]) == (
        "demo: training 5 s, val accuracy 98.8 %, total 8 s; budget 30 s: used 27.6 s (92 %), "
        "val accuracy 100.0 %")


@pytest.mark.parametrize("demo, ending", [
    ({"outcome": "target_accuracy", "target_reached_epoch": 6, "target_accuracy": 0.98,
      "time_budget_seconds": 80.0},
     "; it stopped at epoch 6, the first to reach its 98.00% target (time budget 80 s)."),
    ({"outcome": "time_budget", "time_budget_seconds": 80.0},
     "; it ran to its 80 s time budget.")])
def test_the_demo_section_says_how_the_demo_ended(tmp_path, demo, ending):
    data = {"demo": {"train_seconds": 5.0, "model": "compact28", "image_size": 32,
                     "precision": "bf16", "epochs": 6, "val_accuracy": 0.988,
                     "total_seconds": 8.1, **demo}, "budgets": []}
    body = sections.RENDERERS["demo"](data, sections.Where(tmp_path, tmp_path / "B.md"))
    assert body.lines[0].endswith(f"with writing and preparing the images{ending}\n")
