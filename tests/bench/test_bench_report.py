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

# A result in the shape its script writes, and a line its table must show of it: for each
# benchmark without a committed result (the GPU's), and two whose tables the tests below render
# with made-up failures (the committed ones are in the committed render).
FAKES = {
    "prepare": ({"images": 300, "turbotrain_images_per_second": 1234.0,
                 "plain_ffcv_images_per_second": 617.0, "speedup": 2.0,
                 "goals": [common.ratio_goal("prepare-dataset / FFCV DatasetWriter", 2.0, 1.5)]},
                "| 300 | 1,234 | 617 | 2.00x | >= 1.5x |"),
    "pipelines": ({"workers": 2, "rounds": 3, "photos": PHOTOS,
                   "cifar": {"images": 5000, "size": "32x32 raw", "batch_size": 512},
                   "results": {"pytorch": {"images_per_second": 3111.0, "what": "ours",
                                           "images_per_cpu_second": 1555.0}, "plain_spdl": FAILED},
                   "goals": [{**common.ratio_goal("`pytorch` / `plain_spdl`", None, 3.0),
                              "ratio_images_per_second": None,
                              "ratio_images_per_cpu_second": None}], "comparisons": []},
                  "| `plain_spdl` | - | - | failed: exit 1: boom |"),
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
                "| demo | - | - | - | not measured |", "| `plain_spdl` | SPDL |",
                "**Not measured** (no bench/results/demo.json written by bench/bench_demo.py)."):
        assert row in text, row
    for bench in registry.BENCHMARKS:
        assert f"```\npython bench/{bench.script}" in text


def test_the_last_runs_failures_and_the_hand_kept_notes_are_said(tmp_path):
    text = render(tmp_path, ["prepare", "pipelines"], run_all_json={
        "prepare": {"status": "failed", "error": "exit 1: boom", "started": "2026-12-06T01:00"},
        "pipelines": {"status": "failed", "error": "exit 2", "started": "2026-12-07T00:00"},
        "kernel": {"status": "absent"}}, notes=(
        "preamble, not rendered\n## prepare (about the results of 2026-12-06 01:02)\nAgreed.\n"
        "## kernel (about the results of 2026-01-01 00:00)\nOld.\n## pipelines\nAny time.\n"))
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
