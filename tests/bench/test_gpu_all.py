"""bench/gpu_all.py's verdicts on a made-up GPU result: what `make gpu-check` prints at the end,
checked here because the GPU run itself happens elsewhere (its CPU smoke form runs in
tests/pipeline/test_parity.py)."""
from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import gpu_all  # noqa: E402

CUDA_REASONS = {"precision": "bf16: NVIDIA H200: compute capability 9.0 >= 8.0",
                "compile": "True: CUDA (NVIDIA H200): ...", "threads": "15 + 1: CUDA: ...",
                "batch_size": "512: small images on CUDA: ..."}


def run(name, rate, bound=None, verdict="compute-bound", **extra):
    row = {"run": name, "images_per_second": rate, "model": "airbench", "image_size": 64,
           "batch_size": 512, "precision": "bf16", "verdict": verdict,
           "decisions": CUDA_REASONS, **extra}
    if bound is not None:
        row.update(bound_images_per_second=bound, of_bound=rate / bound)
    return row


def gpu_result(**changes) -> dict:
    result = {
        "settings": {"device": "cuda", "model": "resnet50"},
        "tests": {"returncode": 0, "counts": {"passed": 30, "skipped": 3}},
        "train_runs": [run("default-resident", 49_000, 50_000),
                       run("default-dali", 40_000, 50_000, verdict="input-bound"),
                       run("default-synthetic-0", 50_000)],
        "scaling": {"cores": 16, "one_thread": 400.0, "all_cores": 5_300.0,
                    "efficiency": 5_300 / 6_400},
        "small_data": {"val_accuracy": 0.97, "model": "airbench", "image_size": 64},
        "compile_modes": {"train": {"default": 50_000.0, "reduce-overhead": 60_000.0},
                          "resnet50_step": {"default": 3_000.0,
                                            "max-autotune-no-cudagraphs": "RuntimeError: x"}},
        "seconds": 431.0}
    result.update(changes)
    return result


TABLE = [{"pipeline": "synthetic (on GPU)", "of_bound": 1.0},
         {"pipeline": "pytorch", "of_bound": 0.96}, {"pipeline": "dali", "of_bound": 0.90},
         {"pipeline": "plain_torchvision_nvjpeg", "of_bound": 0.93}]


def verdicts(result, table=TABLE) -> dict[str, tuple[str, str]]:
    return {g["goal"]: (g["measured"], g["verdict"]) for g in gpu_all.goals(result, table)}


def test_one_verdict_per_goal_from_a_gpu_result():
    v = verdicts(gpu_result())
    assert v["the CUDA tests pass (pytest -m cuda)"][1] == "met"
    measured, verdict = v["train defaults on resident >= 95% of the synthetic bound"]
    assert verdict == "met" and "49,000 / 50,000 images/s = 98.0% (airbench, 64 px" in measured
    assert v["train defaults on dali >= 95% of the synthetic bound"][1] == "MISSED"  # 80 %
    assert v["the doctor does not call a default run host-bound"][1] == "met"
    assert v["each start decision (precision, compile, threads, batch) names its GPU reason"] \
        == ("all do", "met")
    measured, verdict = v["pytorch alone on all cores >= 80% of one thread x cores"]
    assert verdict == "met" and "on 16 cores" in measured and "83%" in measured
    assert v["pytorch feeding the resnet50 step >= 95% of its bound"][1] == "met"
    assert v["dali feeding the resnet50 step >= 95% of its bound"][1] == "MISSED"
    measured, verdict = v["plain_torchvision_nvjpeg >= 90% of the bound: register it, else drop it"]
    assert verdict == "met" and "register it" in measured
    assert any(m.startswith("97.0%") and verdict == "met" for m, verdict in v.values())
    assert v["the whole check within 8 minutes"] == ("431 s", "met")
    # Not run (the budget): said so, never counted as met.
    large = "train defaults for >= 100,000 images (resnet50, 224 px) on resident >= 95% of " \
            "the synthetic bound"
    assert v[large] == ("not run", "not measured")
    assert v[large.replace("on resident", "on pytorch")] == ("not run", "not measured")
    lines = gpu_all.goal_lines(gpu_all.goals(gpu_result(), TABLE))
    assert all(line.startswith("goal: ") and " measured " in line for line in lines)


def test_failures_and_gaps_are_not_met():
    host = gpu_result(train_runs=[run("default-resident", 30_000, 50_000,
                                      verdict="host-bound",
                                      decisions={**CUDA_REASONS, "threads": "1 + 1: cores"})],
                      tests={"returncode": 1, "counts": {"passed": 28, "failed": 2}},
                      seconds=500.0, scaling=None, small_data={"error": "exit 1: boom"})
    v = verdicts(host, table=[])
    assert v["the CUDA tests pass (pytest -m cuda)"][1] == "MISSED"
    assert v["the doctor does not call a default run host-bound"][1] == "MISSED"
    assert v["each start decision (precision, compile, threads, batch) names its GPU reason"] \
        == ("not: threads", "MISSED")
    assert v["train defaults on dali >= 95% of the synthetic bound"] == ("not run",
                                                                         "not measured")
    assert v["pytorch alone on all cores >= 80% of one thread x cores"][1] == "not measured"
    assert v["the whole check within 8 minutes"][1] == "MISSED"
    assert any(m == "exit 1: boom" and verdict == "not measured" for m, verdict in v.values())


def test_compile_modes_side_by_side():
    lines = gpu_all.mode_lines(gpu_result())
    assert lines[0] == ("info: compile modes, train (images/s): default 50,000; "
                        "reduce-overhead 60,000 (+20%)")
    assert "max-autotune-no-cudagraphs failed: RuntimeError: x" in lines[1]
