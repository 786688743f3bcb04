"""BENCHMARKS.md is the render of the committed results; each table (its script's `markdown`)
renders from a result in its script's shape; bench/report.py joins them with the machines, goals,
"not measured", the last run's failures and the notes; run_all follows the one registry; the plots,
SPDL's crop boxes, bench_demo.py's goals (bench_time_to_accuracy's: test_time_to_accuracy.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

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
PHOTOS = {"images": 300, "size": "500x375 q90", "batch_size": 64, "image_size": 224}
FAILED = {"images_per_second": None, "images_per_cpu_second": None, "what": "x",
          "runs": [{"error": "exit 1: boom"}]}
AGAINST_TRAIN = {"images": 3000, "image_size": 64, "batch_size": 64, "steps": 40,
                 "warmup_steps": 1, "model": "airbench", "precision": "fp32",
                 "pipeline": "pytorch", "rounds": 2, "ratio": 0.99,
                 "results": {"loader": {"images_per_second": 99.0}, "lightning": {
                     "images_per_second": 99.0}, "train": {"images_per_second": None, **FAILED}}}

# For each benchmark without a committed result (those with one are in the committed render): a
# result in the shape its script writes, and a line its table must show of it.
FAKES = {
    "prepare": ({"images": 300, "turbotrain_images_per_second": 1234.0,
                 "plain_ffcv_images_per_second": 617.0, "speedup": 2.0,
                 "goals": [common.ratio_goal("prepare-dataset / FFCV DatasetWriter", 2.0, 1.5)]},
                "| 300 | 1,234 | 617 | 2.00x | >= 1.5x |"),
    "sources": ({"images": 20, "images_per_second": {"imagefolder": 300.0, "parquet": 240.0},
                 "ratios": {"parquet": 0.8}}, "| parquet | 240 | 0.80x |"),
    "pipelines": ({"workers": 2, "rounds": 3, "photos": PHOTOS,
                   "cifar": {"images": 5000, "size": "32x32 raw", "batch_size": 512},
                   "results": {"pytorch": {"images_per_second": 3111.0, "what": "ours",
                                           "images_per_cpu_second": 1555.0}, "plain_spdl": FAILED},
                   "goals": [{**common.ratio_goal("`pytorch` / `plain_spdl`", None, 3.0),
                              "ratio_images_per_second": None,
                              "ratio_images_per_cpu_second": None}], "comparisons": []},
                  "| `plain_spdl` | - | - | failed: exit 1: boom |"),
    "kernel": ({"images": 3000, "size": "500x375 q90", "batch_size": 64, "image_size": 224,
                "busy": {"pytorch": {"alone": 1500.0, "busy": 1470.0, "kept": 0.98}},
                "stages": {"region": {"decode_us": 512.3, "resize_us": 88.0,
                                      "python_per_batch_us": 640.0},
                           "full": {"decode_us": 655.0, "resize_us": 87.0,
                                    "python_per_batch_us": 600.0}, "python_path_us": 812.0},
                "feed": {"before_us": 4.2, "after_us": 1.1},
                "use": {k: {"predict_images_per_second": 900.0, "resident_load_s": 1.5}
                        for k in ("python", "native")}},
               "| region decode (the pipelines') | 10.0 | 512 | 88 |"),
    "engines": ({"workers": 2, "rounds": 3, "photos": PHOTOS, "results": {
        "pytorch": {"images_per_second": 2000.0, "what": "ours", "runs": []},
        "ffcv": {"images_per_second": 1500.0, "what": "FFCV", "runs": []}}},
                "| `ffcv` | 1,500 | 0.75x | FFCV |"),
    "pillow": ({"images": 200, "size": "512x384 q90", "output": "224x224", "rounds": 5,
                "ratios": {"jpeg_decode_resize": 1.77, "decode": 0.99, "resize": 7.76,
                           "png_prepare": 0.99},
                "results": {"pillow": {"version": "13.0.0", "jpeg_images_per_second": 746.0,
                                       "decode_ms": 0.66, "resize_ms": 0.68,
                                       "png_prepare_images_per_second": 320.0}}},
               "| `pillow` | 13.0.0 | 746 | 0.66 | 0.68 | 320 |"),
    "train_precision": ({"cpu_native_bf16": True, "threads": 2, "batch_size": 64, "steps": 6,
                         "rounds": 2, "results": [{"model": "compact28", "image_size": 28,
                                                   "precision": "bf16", "channels_last": True,
                                                   "images_per_second": 2212.6,
                                                   "speedup_vs_fp32_contiguous": 2.278}]},
                        "| compact28 | 28 | bf16 | channels_last | 2212.6 | 2.28x |"),
    "time_to_accuracy": ({"quick": True, "target": 0.9, "epochs": 3, "train_images": 60000,
                          "test_images": 10000, "speedup": 3.456, "speedup_with_prepare": 3.21,
                          "speedup_per_epoch": None,
                          "turbotrain": {"seconds_to_target": 81.5, "epochs_to_target": 2,
                                         "final_accuracy": 0.9134},
                          "plain_pytorch": {"seconds_to_target": None}},
                         "| plain PyTorch | not reached |"),
    "augment": ({"device": "cuda", "batch_size": 256, "batches": 10, "rounds": 3, "threads": 16,
                 "results": [{"policy": "--aa trivial", "image_size": 224, "ours_ms": 4.25,
                              "ours_images_per_second": 60235.3,
                              "torchvision": "TrivialAugmentWide()", "torchvision_ms": 85.0,
                              "speedup": 20.0}]},
                "| --aa trivial | 224 | 4.25 | 60,235 | TrivialAugmentWide() | 85.00 | 20.00x |"),
    "ddp": ({"global_batch": 64, "rounds": 2, "cores": 2, "results": [
        {"model": "compact28", "layout": "2 processes", "images_per_second": 1710.0,
         "data_wait_fraction": 0.022, "speedup_vs_one_process": 1.71,
         "gradient_allreduce": {"gradient_megabytes": 0.55, "median_ms": 0.62}}]},
            "| 1.71x | 2.20% | 0.6 MB in 0.62 ms (median) |"),
    "loader": (AGAINST_TRAIN, "| `train` | failed: exit 1: boom |"),
    "lightning": ({**AGAINST_TRAIN, "profile": {"fit_seconds": 12.5,
                                                "actions": {"run_training_batch": 10.0}}},
                  "| `run_training_batch` | 10.000 |"),
    "predict": ({"workers": 2, "batch_size": 64, "images": 2000, "size": "500x375 q90",
                 "rounds": 3, "results": {
                     "input": {"64": {"predict": 2916.0, "eval_pipeline": 3164.0, "ratio": 0.92}},
                     "command": {"predict": 171.0, "eval": 156.0, "ratio": 1.096}},
                 "load": {"resnet50": {"load_seconds": 1.38, "process_seconds": 4.2,
                                       "bytes": 94e6}},
                 "goals": [{"what": "load a run, seconds", "seconds": 1.38, "goal_seconds": 2.0,
                            "met": True}]},
                "| input, 64 px | 2,916 | 3,164 | 0.92x |"),
    "order": ({"split_mib": 2048, "limit_mib": 512, "sample_bytes": 12288, "read_ahead_kb": "128",
               "contenders": {"read_random": "random", "pytorch_quasi": "quasi"},
               "runs": {"pytorch_quasi": [{"error": "exit 1: out of memory"}]},
               "best": {"read_random": {"images_per_second": 253.0,
                                        "stored_mib_per_second": 2.97, "cache_drops": 3}},
               "ratios": [{"what": "pytorch_quasi / read_random", "ratio": None}]},
              "| `pytorch_quasi` | - | - | - | failed: exit 1: out of memory |"),
    "remote": ({"shard_mib": 32, "shards": 4, "rounds": 3, "ratios": {"warm_vs_local": 0.97},
                "results": {"obstore": {"version": "0.6.0", "whole_mb_per_second": 236.0,
                                        "metadata_ms": 2.0}},
                "split": {"shards": 4, "samples": 10000, "side": 32},
                "read": {"local_images_per_second": 410_000.0, "warm_images_per_second": 398e3,
                         "cold_images_per_second": 21_000.0, "cold_mb_per_second": 66.0,
                         "store_mb_per_second": 106.0}},
               "| s3://, warm cache | 398,000 | - | 0.97x |"),
    "gpu_check": ({"device": "NVIDIA H100", "torch": "2.14.1", "settings": {
        "device": "cuda", "model": "resnet50", "image_size": 176, "batch_size": 256},
        "rows": [{"pipeline": "pytorch", "alone": 2100.0, "train": 2000.0, "of_bound": 0.8}],
        "checks": [{"check": "dali decodes on the GPU", "ok": True, "detail": "nvjpeg"}]},
                  "| pytorch | 2,100 | 2,000 | 80.00% | < 95% |"),
}


def render(tmp_path: Path, names=FAKES, notes: str = "", run_all_json: dict | None = None) -> str:
    """The document of FAKES[names] (each measured on MACHINE), `notes` as bench/NOTES.md."""
    for name in names:
        (tmp_path / f"{name}.json").write_text(json.dumps(
            {"measured": "2026-12-06T01:02:03", "machine": MACHINE, **FAKES[name][0]}))
    if run_all_json:
        (tmp_path / report.RUN_ALL_NAME).write_text(json.dumps({"benchmarks": run_all_json}))
    (tmp_path / "NOTES.md").write_text(notes)
    return report.render(tmp_path, tmp_path / "B.md", tmp_path / "NOTES.md").read_text()


def test_benchmarks_md_is_the_render_of_the_committed_results(tmp_path):
    """BENCHMARKS.md is a function of bench/results/ and bench/NOTES.md, and every committed
    result file was written by its script: it records when and where, and none is a hand-made
    `recovered` one. A benchmark without one has a result in FAKES."""
    committed = {r.stem for r in report.RESULTS_DIR.glob("*.json")
                 if r.name != report.RUN_ALL_NAME}
    for name in committed:
        data = json.loads((report.RESULTS_DIR / f"{name}.json").read_text())
        assert data.get("measured") and data.get("machine") and "recovered" not in data, name
    assert committed <= set(registry.BY_NAME) <= committed | set(FAKES)
    out = report.render(report.RESULTS_DIR, tmp_path / "BENCHMARKS.md", report.NOTES)
    assert out.read_text() == report.OUTPUT.read_text(), (
        "BENCHMARKS.md differs from a render of bench/results/ and bench/NOTES.md: run "
        "`python bench/run_all.py --render-only` and commit the result")


def test_the_document_joins_the_tables_with_machines_goals_and_not_measured(tmp_path):
    text = render(tmp_path)
    for name, (_, shown) in FAKES.items():  # each table, from a result in its script's shape
        assert shown in text, (name, shown)
    titles = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert titles == ["Machines", "Goals", "Contenders", *(b.title for b in registry.BENCHMARKS)]
    measured = [b.name for b in registry.BENCHMARKS if b.name in FAKES]
    assert ("| A | AMD EPYC | 2 | AVX-512 + bf16 | avx2 | 23.5 | none | 2.14.1 | 3.11.7 | Linux | "
            f"{', '.join(measured)} |") in text and "| B |" not in text
    assert ("Measured 2026-12-06 01:02 on machine A, commit abc123; load average (1, 5, 15 min) "
            "0.10 0.20 0.30 at the start, 1.10 1.20 1.30 at the end.") in text
    for row in ("| prepare | prepare-dataset / FFCV DatasetWriter | >= 1.5x | 2.00x | met |",
                "| pipelines | `pytorch` / `plain_spdl` | >= 3x | - | not measured |",
                "| predict | load a run, seconds | < 2 s | 1.38 s | met |",
                "| demo | - | - | - | not measured |", "| `plain_spdl` | SPDL |",
                "**Not measured** (no bench/results/demo.json written by bench/bench_demo.py)."):
        assert row in text, row
    for bench in registry.BENCHMARKS:
        assert f"```\npython bench/{bench.script}" in text


def test_the_last_runs_failures_and_the_hand_kept_notes_are_said(tmp_path):
    text = render(tmp_path, ["prepare", "sources"], run_all_json={
        "prepare": {"status": "failed", "error": "exit 1: boom", "started": "2026-12-06T01:00"},
        "sources": {"status": "failed", "error": "exit 2", "started": "2026-12-07T00:00"},
        "kernel": {"status": "absent"}}, notes=(
        "preamble, not rendered\n## prepare (about the results of 2026-12-06 01:02)\nAgreed.\n"
        "## kernel (about the results of 2026-01-01 00:00)\nOld.\n## sources\nAny time.\n"))
    for said in ("The last run **failed** (exit 1: boom); it still wrote the results below.",
                 "The last run **failed** (exit 2).", "Not run by the last `make bench`: no such "
                 "script.", "*Notes on these results (bench/NOTES.md):*\n\nAgreed.",
                 "*Notes on the results of 2026-01-01 00:00, no longer shown",
                 "*Notes (bench/NOTES.md):*\n\nAny time.",
                 "**Not measured** (it needs a CUDA GPU; no bench/results/gpu_check.json written"):
        assert said in text, said
    assert "preamble" not in text
    with pytest.raises(ValueError, match="names no benchmark.*NAME one of: prepare, sources"):
        render(tmp_path, notes="## no_such_benchmark\ntext\n")


def test_write_results_records_the_machine_block(tmp_path):
    data = json.loads(common.write_results(tmp_path / "r.json", {"command": "x"}).read_text())
    assert {*report.MACHINE_COLUMNS, "commit", "load_before", "load_after"} <= set(data["machine"])
    assert data["machine"]["load_before"] == common.LOAD_AT_START and data["measured"]


def test_the_plots_are_drawn_beside_the_results(tmp_path):
    assert bench_pipelines.plot(FAKES["pipelines"][0], tmp_path / "p.png").read_bytes()[:4] \
        == b"\x89PNG"
    curve = {"target": 0.9, "turbotrain": {"curve": [[1.0, 0.5], [2.0, 0.91]]}}
    assert tta.plot(curve, tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    assert tta.plot({"target": 0.9}, tmp_path / "none.png") is None


# -- run_all and the registry ---------------------------------------------------------------------
@pytest.mark.usefixtures("child_processes")
def test_run_all_records_absent_failed_and_ok_scripts(tmp_path, monkeypatch):
    (tmp_path / "bench_ok.py").write_text("print('fine')\n")
    (tmp_path / "bench_bad.py").write_text("import sys\nprint('something broke')\nsys.exit(3)\n")
    (tmp_path / "bench_hangs.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setattr(run_all, "ROOT", tmp_path)
    suite = [*(run_all.Benchmark(name, name) for name in ("ok", "bad", "missing")),
             run_all.Benchmark("gpu", "GPU", needs_cuda=True, script="bench_ok.py")]
    statuses = {b.name: run_all.run_one(b, gpu=None, timeout=30) for b in suite}
    statuses["hangs"] = run_all.run_one(run_all.Benchmark("hangs", "Hangs"), None, timeout=1)
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
    assert run_all.main(["--render-only", *argv]) == 0 and len(ran) == 2  # nothing ran
    with pytest.raises(SystemExit):
        run_all.main(["--only", "no_such_benchmark", *argv])


def test_every_contender_has_one_name_whose_code_it_says():
    shown = (set(bench_pipelines.CONTENDERS) | set(bench_kernel.BUSY) | set(bench_kernel.MODES)
             | set(bench_engines.CONTENDERS))
    assert shown <= set(registry.CONTENDERS), shown - set(registry.CONTENDERS)
    for name, contender in registry.CONTENDERS.items():
        if contender.whose == registry.TURBOTRAIN:  # our pipelines, as --pipeline takes them
            assert name.split("_")[0] in {"pytorch", "resident", "dali", "ffcv", "native"}, name
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


# -- bench_demo ----------------------------------------------------------------------------------
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
