"""BENCHMARKS.md: each benchmark's table (its script's `markdown`) from a result in the shape the
script writes; the renderer that orders and joins them (bench/report.py): machines, goals, "not
measured", the run_all statuses, the hand-kept notes; the machine block every result records
(bench/common.py); the committed BENCHMARKS.md against a render of the committed results; the
one registry (bench/registry.py) the runner and the report follow; bench_time_to_accuracy.py's
parsing, and its --quick run end to end."""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from tests import expect

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import bench_demo  # noqa: E402
import bench_engines  # noqa: E402
import bench_kernel  # noqa: E402
import bench_pipelines  # noqa: E402
import bench_time_to_accuracy as tta  # noqa: E402
import common  # noqa: E402
import registry  # noqa: E402
import report  # noqa: E402
import run_all  # noqa: E402

pytestmark = pytest.mark.timeout(120)

MACHINE = {"cpu": "AMD EPYC", "cores": 2, "simd": "AVX-512 + bf16", "flags": ["avx2"],
           "ram_gib": 23.5, "gpu": None, "torch": "2.14.1", "python": "3.11.7",
           "platform": "Linux", "commit": "abc123", "load_before": "0.10 0.20 0.30",
           "load_after": "1.10 1.20 1.30"}


def goal(what: str, ratio: float | None, minimum: float) -> dict:
    return common.ratio_goal(what, ratio, minimum)


def against_train(ours: str) -> dict:
    return {"images": 3000, "image_size": 64, "batch_size": 64, "steps": 40, "warmup_steps": 1,
            "model": "airbench", "precision": "fp32", "pipeline": "pytorch", "rounds": 2,
            "ratio": 0.99, "results": {ours: {"images_per_second": 99.0, "runs": []},
                                       "train": {"images_per_second": None,
                                                 "runs": [{"error": "exit 1: boom"}]}},
            "goals": [goal(f"{ours} / train, images/s", 0.99, 0.98)]}


# A result in the shape each script writes, and what its table must show of it.
FAKES = {
    "prepare": ({"images": 300, "turbotrain_images_per_second": 1234.0,
                 "plain_ffcv_images_per_second": 617.0, "speedup": 2.0,
                 "goals": [goal("prepare-dataset / FFCV DatasetWriter", 2.0, 1.5)]},
                ["| 300 | 1,234 | 617 | 2.00x | >= 1.5x |"]),
    "sources": ({"images": 20, "images_per_second": {"imagefolder": 300.0, "webdataset": 330.0,
                                                     "parquet": 240.0},
                 "ratios": {"webdataset": 1.1, "parquet": 0.8}},
                ["| imagefolder | 300 | 1.00x |", "| parquet | 240 | 0.80x |"]),
    "prepare_ray": ({"shard_size": "8MiB", "cpus": 2, "cluster_start_seconds": 3.9,
                     "sizes": [{"images": 2400, "parts": 8, "local_images_per_second": 1699.0,
                                "ray_images_per_second": 702.0, "ratio": 0.41,
                                "overhead_seconds": 2.0}]},
                    ["| 2,400 | 8 | 1,699 | 702 | 0.41x | 2.0 |", "start, 3.9 s, does not"]),
    "pipelines": ({"workers": 2, "rounds": 3,
                   "photos": {"images": 300, "size": "500x375 q90", "batch_size": 64,
                              "image_size": 224},
                   "cifar": {"images": 5000, "size": "32x32 raw", "batch_size": 512},
                   "results": {"pytorch": {"images_per_second": 3111.0,
                                           "images_per_cpu_second": 1555.0, "what": "ours",
                                           "runs": []},
                               "plain_spdl": {"images_per_second": None,
                                              "images_per_cpu_second": None, "what": "SPDL",
                                              "runs": [{"error": "exit 1: no libavutil"}]}},
                   "goals": [{**goal("`pytorch` / `plain_spdl`", None, 3.0),
                              "ratio_images_per_second": None,
                              "ratio_images_per_cpu_second": None}],
                   "comparisons": [{"what": "`pytorch` / `plain_torchvision_simd`",
                                    "ratio_images_per_second": 1.81,
                                    "ratio_images_per_cpu_second": 1.5}]},
                  ["| `pytorch` | 3,111 | 1,555 | ours |",
                   "| `plain_spdl` | - | - | failed: exit 1: no libavutil |",
                   "| `pytorch` / `plain_spdl` | >= 3x | - | - | not measured |",
                   "| `pytorch` / `plain_torchvision_simd` | none (comparison) | 1.81x | 1.50x |"]),
    "kernel": ({"images": 3000, "size": "500x375 q90", "batch_size": 64, "image_size": 224,
                "busy": {"pytorch": {"alone": 1500.0, "busy": 1470.0, "kept": 0.98},
                         "plain_spdl": {"error": "exit 1: no SPDL"}},
                "stages": {"region": {"decode_us": 512.3, "resize_us": 88.0,
                                      "python_per_batch_us": 640.0},
                           "full": {"decode_us": 655.0, "resize_us": 87.0,
                                    "python_per_batch_us": 600.0}, "python_path_us": 812.0},
                "feed": {"before_us": 4.2, "after_us": 1.1},
                "use": {"native": {"predict_images_per_second": 900.0, "resident_load_s": 1.5},
                        "python": {"predict_images_per_second": 700.0, "resident_load_s": 2.5}}},
               ["| `pytorch` | 1,500 | 1,470 | 98% |", "| `plain_spdl` | - | - | failed: exit 1",
                "| region decode (the pipelines') | 10.0 | 512 | 88 |",
                "| Python decode path (before) | 700 | 2.50 s |", "4.2 µs per image"]),
    "engines": ({"workers": 2, "rounds": 3, "photos": {"images": 300, "size": "500x375 q90",
                                                       "batch_size": 64, "image_size": 224},
                 "results": {"pytorch": {"images_per_second": 2000.0, "what": "ours",
                                         "runs": []},
                             "ffcv": {"images_per_second": 1500.0, "what": "FFCV",
                                      "runs": []}}},
                ["| `ffcv` | 1,500 | 0.75x | FFCV |"]),
    "pillow": ({"images": 200, "size": "512x384 q90", "output": "224x224", "rounds": 5,
                "ratios": {"jpeg_decode_resize": 1.77, "decode": 0.99, "resize": 7.76,
                           "png_prepare": 0.99},
                "results": {"pillow": {"version": "13.0.0", "jpeg_images_per_second": 746.0,
                                       "decode_ms": 0.66, "resize_ms": 0.68,
                                       "png_prepare_images_per_second": 320.0}}},
               ["| `pillow` | 13.0.0 | 746 | 0.66 | 0.68 | 320 |", "resize **1.77x**"]),
    "train_precision": ({"cpu_native_bf16": True, "threads": 2, "batch_size": 64, "steps": 6,
                         "rounds": 2, "results": [{"model": "compact28", "image_size": 28,
                                                   "precision": "bf16", "channels_last": True,
                                                   "images_per_second": 2212.6,
                                                   "speedup_vs_fp32_contiguous": 2.278}]},
                        ["| compact28 | 28 | bf16 | channels_last | 2212.6 | 2.28x |"]),
    "time_to_accuracy": ({"quick": True, "target": 0.9, "epochs": 3, "train_images": 60000,
                          "test_images": 10000, "speedup": 3.456, "speedup_with_prepare": 3.21,
                          "speedup_per_epoch": None, "plot": "time_to_accuracy.png",
                          "turbotrain": {"seconds_to_target": 81.5, "epochs_to_target": 2,
                                         "final_accuracy": 0.9134,
                                         "settings": {"precision": "bf16",
                                                      "channels_last": True}},
                          "plain_pytorch": {"seconds_to_target": None, "settings": {}}},
                         ["Smoke run (--quick)", "| turbotrain | 81.5 | 2 | 91.34% |",
                          "| plain PyTorch | not reached |", "Speedup: **3.46x** (goal >= 3x)",
                          "per epoch (after the first): n/a", "(bf16, channels_last)",
                          "![val accuracy against wall time](bench/results/time_to_accuracy.png)"]),
    "augment": ({"device": "cuda", "batch_size": 256, "batches": 10, "rounds": 3, "threads": 16,
                 "results": [{"policy": "--aa trivial", "image_size": 224, "ours_ms": 4.25,
                              "ours_images_per_second": 60235.3,
                              "torchvision": "TrivialAugmentWide()", "torchvision_ms": 85.0,
                              "speedup": 20.0},
                             {"policy": "--aa rand-m9-mstd0.5 --reprob 0.25",
                              "image_size": 224, "ours_ms": 7.5,
                              "ours_images_per_second": 34133.3, "torchvision": None}]},
                ["| --aa trivial | 224 | 4.25 | 60,235 | TrivialAugmentWide() | 85.00 | 20.00x |",
                 "| --aa rand-m9-mstd0.5 --reprob 0.25 | 224 | 7.50 | 34,133 | - | - | - |",
                 "on cuda: batch 256"]),
    "ddp": ({"global_batch": 64, "rounds": 2, "cores": 2, "results": [
        {"model": "compact28", "layout": "2 processes", "images_per_second": 1710.0,
         "data_wait_fraction": 0.022, "speedup_vs_one_process": 1.71,
         "gradient_allreduce": {"gradient_megabytes": 0.55, "median_ms": 0.62}}]},
            ["| compact28 | 2 processes | 1,710 | 1.71x | 2.20% | 0.6 MB in 0.62 ms (median) |"]),
    "loader": (against_train("loader"), ["| `loader` | 99 |", "| `train` | failed: exit 1: boom |",
                                         "ratios: **0.99x**"]),
    "lightning": ({**against_train("lightning"),
                   "profile": {"fit_seconds": 12.5, "actions": {"run_training_batch": 10.0}}},
                  ["| `lightning` | 99 |", "| `run_training_batch` | 10.000 |"]),
    "predict": ({"workers": 2, "batch_size": 64, "images": 2000, "size": "500x375 q90",
                 "rounds": 3,
                 "results": {"input": {"64": {"predict": 2916.0, "eval_pipeline": 3164.0,
                                              "ratio": 0.9216}},
                             "command": {"predict": 171.0, "eval": 156.0, "ratio": 1.096}},
                 "load": {"resnet50": {"load_seconds": 1.38, "process_seconds": 4.2,
                                       "bytes": 94e6}},
                 "goals": [{"what": "load a run, seconds", "seconds": 1.38, "goal_seconds": 2.0,
                            "met": True}]},
                ["| input, 64 px | 2,916 | 3,164 | 0.92x |", "| command, 64 px | 171 | 156 |",
                 "| `resnet50` | 1.38 | 94 MB | 4.2 |"]),
    "order": ({"split_mib": 2048, "limit_mib": 512, "sample_bytes": 12288, "read_ahead_kb": "128",
               "contenders": {"read_random": "random", "pytorch_quasi": "quasi"},
               "runs": {"pytorch_quasi": [{"error": "exit 1: out of memory"}]},
               "best": {"read_random": {"images_per_second": 253.0,
                                        "stored_mib_per_second": 2.97, "cache_drops": 3},
                        "pytorch_quasi": None},
               "ratios": [{"what": "pytorch_quasi / read_random", "ratio": None}]},
              ["| `read_random` | 253 | 3 | 3 | random |",
               "| `pytorch_quasi` | - | - | - | failed: exit 1: out of memory |",
               "pytorch_quasi / read_random **None**"]),
    "remote": ({"shard_mib": 32, "shards": 4, "rounds": 3,
                "ratios": {"whole": 1.31, "metadata": 2.5, "warm_vs_local": 0.97,
                           "cold_vs_store": 0.62},
                "results": {"obstore": {"version": "0.6.0", "whole_mb_per_second": 236.0,
                                        "metadata_ms": 2.0}},
                "split": {"shards": 4, "samples": 10000, "side": 32},
                "read": {"local_images_per_second": 410_000.0, "warm_images_per_second": 398e3,
                         "cold_images_per_second": 21_000.0, "cold_mb_per_second": 66.0,
                         "store_mb_per_second": 106.0}},
               ["| s3://, warm cache | 398,000 | - | 0.97x |", "| `obstore` | 0.6.0 | 236 | 2.00 |",
                "**0.62x**"]),
    "demo": ({"demo": {"train_seconds": 5.0, "model": "compact28", "image_size": 32,
                       "precision": "bf16", "epochs": 6, "val_accuracy": 0.988,
                       "total_seconds": 8.1, "outcome": "time_budget",
                       "time_budget_seconds": 80.0},
              "budgets": [{"budget_seconds": 30.0, "train_seconds": 27.6, "used_fraction": 0.92,
                           "epochs": 4, "val_accuracy": 1.0, "flags": ["--model", "compact28"]}]},
             ["images; it ran to its 80 s time budget.", "| 30 s | 27.6 s | 92.00% | 4 |",
              "dataset (--model compact28)"]),
    "gpu_check": ({"device": "NVIDIA H100", "torch": "2.14.1", "settings": {
        "device": "cuda", "model": "resnet50", "image_size": 176, "batch_size": 256},
        "rows": [{"pipeline": "dali", "alone": 9000.0, "train": 2400.0, "of_bound": 0.97},
                 {"pipeline": "pytorch", "alone": 2100.0, "train": 2000.0, "of_bound": 0.8},
                 {"pipeline": "ffcv", "error": "no FFCV"}],
        "checks": [{"check": "dali decodes on the GPU", "ok": True, "detail": "nvjpeg"}],
        "notes": ["a note"]},
                  ["| dali | 9,000 | 2,400 | 97.00% |  |", "| pytorch | 2,100 | 2,000 | 80.00% | "
                   "< 95% |", "| ffcv | - | - | - | failed: no FFCV |", "- a note"]),
}


def write_fakes(folder: Path, names=FAKES) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        data = {"measured": "2026-12-06T01:02:03", "machine": MACHINE, **FAKES[name][0]}
        (folder / f"{name}.json").write_text(json.dumps(data))


def render(tmp_path: Path, notes: Path | None = None) -> str:
    out = tmp_path / "BENCHMARKS.md"
    assert report.render(tmp_path / "results", out, notes or tmp_path / "NOTES.md") == out
    return out.read_text()


# -- each benchmark's table -------------------------------------------------------------------------
@pytest.mark.parametrize("bench", registry.BENCHMARKS, ids=lambda b: b.name)
def test_each_benchmark_owns_its_table(bench):
    """Every benchmark's script has `markdown(result)`; given a result in the shape the script
    writes, its table shows the numbers."""
    markdown = importlib.import_module(Path(bench.script).stem).markdown
    if bench.name in FAKES:
        data, shown = FAKES[bench.name]
        text = markdown(data)
        for expected in shown:
            assert expected in text, (expected, text)


def test_the_gpu_smoke_run_is_not_a_gpu_measurement():
    import gpu_check
    assert "**Not measured** on a GPU" in gpu_check.markdown({"settings": {"device": "cpu"}})


def test_the_plots_are_drawn_beside_the_results(tmp_path):
    data, _ = FAKES["pipelines"]
    assert bench_pipelines.plot(data, tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    curve = {"target": 0.9, "turbotrain": {"curve": [[1.0, 0.5], [2.0, 0.91]],
                                           "seconds_to_target": 2.0}}
    assert tta.plot(curve, tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    assert tta.plot({"target": 0.9}, tmp_path / "none.png") is None


# -- the renderer ---------------------------------------------------------------------------------
def test_the_document_joins_the_tables_in_the_registry_order(tmp_path):
    write_fakes(tmp_path / "results")
    text = render(tmp_path)
    titles = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert titles == ["Machines", "Goals", "Contenders", *(b.title for b in registry.BENCHMARKS)]
    # one machine: one row naming every section it measured
    assert ("| A | AMD EPYC | 2 | AVX-512 + bf16 | avx2 | 23.5 | none | 2.14.1 | 3.11.7 | Linux | "
            + ", ".join(FAKES) + " |") in text
    assert ("Measured 2026-12-06 01:02 on machine A, commit abc123; load average (1, 5, 15 min) "
            "0.10 0.20 0.30 at the start, 1.10 1.20 1.30 at the end.") in text
    # the goals each result recorded, whatever their kind
    assert "| prepare | prepare-dataset / FFCV DatasetWriter | >= 1.5x | 2.00x | met |" in text
    assert "| pipelines | `pytorch` / `plain_spdl` | >= 3x | - | not measured |" in text
    assert "| predict | load a run, seconds | < 2 s | 1.38 s | met |" in text
    assert "| `plain_spdl` | SPDL |" in text  # the Contenders table
    for bench in registry.BENCHMARKS:
        assert f"```\npython bench/{bench.script}" in text


def test_a_benchmark_without_its_result_file_is_not_measured(tmp_path):
    write_fakes(tmp_path / "results", ["prepare"])
    text = render(tmp_path)
    assert "**Not measured** (no bench/results/kernel.json written by bench/bench_kernel.py)." \
        in text
    assert "**Not measured** (it needs a CUDA GPU; no bench/results/gpu_check.json" in text
    assert "| kernel | - | - | - | not measured |" in text
    assert text.count("| A |") == 1 and "| B |" not in text


def test_the_last_runs_failures_are_said(tmp_path):
    write_fakes(tmp_path / "results", ["prepare", "sources"])
    (tmp_path / "results" / report.RUN_ALL_NAME).write_text(json.dumps({"benchmarks": {
        "prepare": {"status": "failed", "error": "exit 1: boom", "started": "2026-12-06T01:00"},
        "sources": {"status": "failed", "error": "exit 2", "started": "2026-12-07T00:00"},
        "kernel": {"status": "absent"},
        "gpu_check": {"status": "skipped", "error": "needs a CUDA GPU; this machine has none"}}}))
    text = render(tmp_path)
    assert "The last run **failed** (exit 1: boom); it still wrote the results below." in text
    assert "The last run **failed** (exit 2)." in text
    assert "Not run by the last `make bench`: no such script." in text
    assert "Not run by the last `make bench`: needs a CUDA GPU; this machine has none." in text


def test_the_hand_kept_notes_are_included_and_a_wrong_heading_refused(tmp_path):
    write_fakes(tmp_path / "results", ["prepare"])
    notes = tmp_path / "NOTES.md"
    notes.write_text("preamble, not rendered\n## prepare (about the results of 2026-12-06 01:02)"
                     "\nThree more runs agreed.\n## kernel (about the results of 2026-01-01 "
                     "00:00)\nOld.\n## sources\nAny time.\n")
    text = render(tmp_path, notes)
    assert "*Notes on these results (bench/NOTES.md):*\n\nThree more runs agreed." in text
    assert "*Notes on the results of 2026-01-01 00:00, no longer shown" in text
    assert "*Notes (bench/NOTES.md):*\n\nAny time." in text and "preamble" not in text
    notes.write_text("## no_such_benchmark\ntext\n")
    with pytest.raises(ValueError, match="names no benchmark.*NAME one of: prepare, sources"):
        render(tmp_path, notes)


def test_write_results_records_the_machine_block(tmp_path):
    path = common.write_results(tmp_path / "r.json", {"command": "python bench/x.py"})
    data = json.loads(path.read_text())
    machine = data["machine"]
    for key in ("cpu", "cores", "simd", "flags", "ram_gib", "gpu", "torch", "python", "commit",
                "load_before", "load_after"):
        assert key in machine, key
    assert machine["load_before"] == common.LOAD_AT_START and len(machine["commit"]) >= 12
    assert data["measured"] and data["command"] == "python bench/x.py"


def test_the_isa_names_what_changes_the_rates():
    from turbotrain.host import isa_name
    assert isa_name(frozenset({"avx2", "avx512f", "avx512_bf16"})) == "AVX-512 + bf16"
    assert isa_name(frozenset({"avx2", "avx512f", "avx512_bf16", "amx_tile"})) == \
        "AVX-512 + bf16 + AMX"
    assert isa_name(frozenset({"avx2"})) == "AVX2 without AVX-512"
    assert isa_name(frozenset()) == "no AVX2"


def test_benchmarks_md_is_the_render_of_the_committed_results(tmp_path):
    """BENCHMARKS.md is a function of bench/results/ and bench/NOTES.md, and every committed
    result file was written by its script: it records when and where, and none is a hand-made
    `recovered` one."""
    for result in report.RESULTS_DIR.glob("*.json"):
        if result.name != report.RUN_ALL_NAME:
            data = json.loads(result.read_text())
            assert data.get("measured") and data.get("machine") and "recovered" not in data, \
                result.name
            assert result.stem in registry.BY_NAME, result.name
    out = tmp_path / "BENCHMARKS.md"
    report.render(report.RESULTS_DIR, out, report.NOTES)
    assert out.read_text() == report.OUTPUT.read_text(), (
        "BENCHMARKS.md differs from a render of bench/results/ and bench/NOTES.md: run "
        "`python bench/run_all.py --render-only` and commit the result")


# -- run_all and the registry ---------------------------------------------------------------------
def test_run_all_render_only_writes_the_document(tmp_path):
    write_fakes(tmp_path / "results")
    out = tmp_path / "B.md"
    assert run_all.main(["--render-only", "--results", str(tmp_path / "results"),
                         "--output", str(out), "--notes", str(tmp_path / "NOTES.md")]) == 0
    assert "| 300 | 1,234 | 617 | 2.00x |" in out.read_text()
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
    assert [statuses[n]["status"] for n in ("ok", "bad", "missing", "gpu", "hangs")] == \
        ["ok", "failed", "absent", "skipped", "failed"]
    assert statuses["bad"]["error"] == "exit 3: something broke"
    assert statuses["hangs"]["error"] == "timed out after 1 s"
    run_all.record(tmp_path / "results", None, {"bad": statuses["bad"]})
    run_all.record(tmp_path / "results", None, {"ok": statuses["ok"]})  # --only keeps the rest
    recorded = json.loads((tmp_path / "results" / "run_all.json").read_text())
    assert set(recorded["benchmarks"]) == {"bad", "ok"} and recorded["machine"]["cores"] >= 1


def test_one_registry_orders_the_runner(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(run_all, "cuda_device", lambda: None)
    monkeypatch.setattr(run_all, "run_one", lambda b, gpu, timeout: ran.append(b) or
                        {"status": "ok", "command": b.command})
    argv = ["--results", str(tmp_path / "results"), "--output", str(tmp_path / "B.md"),
            "--notes", str(tmp_path / "NOTES.md")]
    assert run_all.main(argv) == 0 and ran == list(registry.BENCHMARKS)
    ran.clear()
    assert run_all.main(["--only", "demo", "prepare", *argv]) == 0
    assert ran == [registry.BY_NAME["demo"], registry.BY_NAME["prepare"]]
    with pytest.raises(SystemExit):
        run_all.main(["--only", "no_such_benchmark", *argv])


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
    for ours_name, theirs, *_ in bench_pipelines.GOALS:
        assert {ours_name, theirs} <= set(registry.CONTENDERS)


def test_spdls_crop_box_is_random_resized_crops():
    import random
    rng = random.Random(0)
    for _ in range(200):
        x, y, w, h = bench_pipelines._random_resized_crop(500, 375, rng)
        assert 0 <= x <= 500 - w and 0 <= y <= 375 - h
        assert 0.08 * 500 * 375 * 0.9 <= w * h <= 500 * 375 and 0.7 <= w / h <= 1.4


# -- bench_time_to_accuracy and bench_demo ---------------------------------------------------------
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
def test_time_to_accuracy_quick_runs_both_sides_end_to_end(tmp_path):
    """~30 s on a quiet 2-core machine; minutes when the machine is busy."""
    expect.need("fashion_mnist")
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
    assert (tmp_path / result["plot"]).read_bytes()[:4] == b"\x89PNG"
    assert "Smoke run (--quick)" in tta.markdown(result)


def test_bench_demo_judges_the_demo_and_each_budget_within_ten_percent():
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


def test_the_demo_section_says_when_it_stopped_at_its_target():
    data = json.loads(json.dumps(FAKES["demo"][0]))
    data["demo"].update(outcome="target_accuracy", target_reached_epoch=6, target_accuracy=0.98)
    assert ("images; it stopped at epoch 6, the first to reach its 98.00% target (time budget "
            "80 s).") in bench_demo.markdown(data)
