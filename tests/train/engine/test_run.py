"""End to end on a tiny dataset: what a run leaves, smoke runs over every pipeline, EMA,
YAML config, and the one-line errors."""
from __future__ import annotations

import json
import sys

import pytest
import torch

from turbotrain.pipeline import pipeline_names

from tests import expect

from ..conftest import FAST, read_jsonl

SUMMARY_KEYS = {"val_accuracy", "val_loss", "epochs", "steps", "images_per_second",
                "data_wait_fraction", "wall_seconds", "pipeline", "precision", "compiled",
                "channels_last", "device", "world_size", "global_batch_size",
                "peak_memory_bytes"}


def test_run_leaves_config_metrics_summary_curves_checkpoint(train_cli, tiny_dataset, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", out, "--epochs", 2,
                                  "--batch-size", 16, "--lr", "0.1", *FAST)
    assert code == 0, err
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "curves.png", "checkpoint.pt"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["steps"] == 12 and summary["epochs"] == 2
    assert summary["global_batch_size"] == 16 and summary["world_size"] == 1
    # The default device: the GPU on a CUDA machine (cuda:0), else the CPU.
    assert summary["pipeline"] == "test-memory"
    assert summary["device"] == ("cuda:0" if torch.cuda.is_available() else "cpu")
    assert summary["val_accuracy"] > 0.5  # the squares are easy
    assert 0 <= summary["data_wait_fraction"] < 1 and summary["images_per_second"] > 0
    records = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in records if r["kind"] == "step"] == list(range(1, 13))
    assert [r["epoch"] for r in records if r["kind"] == "epoch"] == [0, 1]
    # Train accuracy (issue 46), counted on the device and read at the log points.
    for record in records:
        if record["kind"] in ("step", "epoch"):
            assert 0 <= record["train_accuracy"] <= 1, record
    # Each epoch's evaluation is on the timeline (saved in the checkpoint), with its seconds.
    timeline = torch.load(out / "checkpoint.pt", weights_only=True)["timeline"]
    assert [step for step, _ in timeline["evals"]] == [6, 12]
    assert all(seconds > 0 for _, seconds in timeline["evals"])
    # The reasons are printed at start.
    assert "precision:" in stdout and "threads:" in stdout and "model: compact28" in stdout
    # The saved config reruns as is: it has every auto resolved.
    saved = (out / "config.yaml").read_text()
    assert "model: compact28" in saved and "image-size: 16" in saved and "auto" not in saved


SMOKE_RUNS = [(name, "auto") for name in pipeline_names()] + [("pytorch", "processes")]


@pytest.mark.parametrize("name,worker_mode", SMOKE_RUNS)
def test_smoke_each_pipeline(name, worker_mode, train_cli, tiny_dataset, tmp_path):
    # Every registered pipeline runs on the CPU: an unavailable one (a missing install) makes
    # train exit 2 with its reason, and the test fails on it.
    out = tmp_path / "run"
    code, _, err = train_cli("--data", tiny_dataset, "--out", out, "--epochs", 1,
                             "--batch-size", 8, "--max-steps", 4, "--threads", 1,
                             "--workers", 1, "--pipeline", name, "--worker-mode", worker_mode)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pipeline"] == name and summary["steps"] == 4
    assert summary["val_loss"] is not None


def test_ema_is_evaluated_at_the_end(train_cli, tiny_dataset, tmp_path):
    code, _, err = train_cli("--data", tiny_dataset, "--out", tmp_path / "run", "--epochs", 1,
                             "--batch-size", 16, "--ema", "--ema-decay", "0.9", *FAST)
    assert code == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert 0 <= summary["ema_val_accuracy"] <= 1 and summary["ema_val_loss"] > 0


def test_yaml_sets_flags_and_flags_win(train_cli, tiny_dataset, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(f"data: {tiny_dataset}\nbatch-size: 8\nepochs: 1\nmax_steps: 3\n"
                      "optimizer: adamw\nprecision: fp32\n")
    code, _, err = train_cli("--config", config, "--out", tmp_path / "run", "--max-steps", 2,
                             *FAST)
    assert code == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["batch_size"] == 8
    assert summary["optimizer"] == "adamw" and summary["precision"] == "fp32"


def test_no_val_split_trains_without_evaluation(train_cli, tmp_path):
    from ..tiny_data import write_tiny_dataset
    data = write_tiny_dataset(tmp_path / "ds", val=None)
    code, stdout, err = train_cli("--data", data, "--out", tmp_path / "run", "--epochs", 1,
                                  "--batch-size", 16, *FAST)
    assert code == 0, err
    assert "evaluation: none" in stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["val_accuracy"] is None


def test_airbench_whitening_init_and_accumulation_run(train_cli, tmp_path):
    from ..tiny_data import write_tiny_dataset
    data = write_tiny_dataset(tmp_path / "ds", size=32, train=64, val=16)
    code, stdout, err = train_cli("--data", data, "--out", tmp_path / "run", "--epochs", 1,
                                  "--batch-size", 8, "--accum-steps", 2, *FAST)
    assert code == 0, err
    assert "model: airbench" in stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["global_batch_size"] == 16


# ---------------------------------------------------------------------------- user errors

def _one_line_error(code, err):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train: error: "), err
    return lines[0]


def test_missing_dataset(train_cli, tmp_path):
    line = _one_line_error(*train_cli("--data", tmp_path / "nope", *FAST)[::2])
    assert "nope" in line


def test_corrupt_dataset(train_cli, tmp_path):
    from ..tiny_data import write_tiny_dataset
    data = write_tiny_dataset(tmp_path / "ds")
    beton = data / "train.beton"
    beton.write_bytes(beton.read_bytes()[:1000])
    line = _one_line_error(*train_cli("--data", data, "--out", tmp_path / "r", *FAST)[::2])
    assert "train.beton" in line


def test_unknown_model_lists_choices(train_cli, tiny_dataset, tmp_path):
    line = _one_line_error(*train_cli("--data", tiny_dataset, "--model", "resnet7",
                                      "--out", tmp_path / "r", *FAST)[::2])
    assert "resnet7" in line and "resnet9" in line and "resnet50" in line and "timm:" in line


def test_unknown_pipeline_is_refused_by_argparse(train_cli, tiny_dataset):
    with pytest.raises(SystemExit) as exc:
        train_cli("--data", tiny_dataset, "--pipeline", "nope")
    assert exc.value.code == 2


def test_timm_model_without_timm(train_cli, tiny_dataset, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # `import timm` raises ImportError
    line = _one_line_error(*train_cli("--data", tiny_dataset, "--model", "timm:resnet18",
                                      "--out", tmp_path / "r", *FAST)[::2])
    assert "pip install timm" in line


def test_batch_larger_than_split(train_cli, tiny_dataset, tmp_path):
    line = _one_line_error(*train_cli("--data", tiny_dataset, "--batch-size", 1000,
                                      "--out", tmp_path / "r", *FAST)[::2])
    assert "larger than the train split" in line


def test_resume_without_checkpoint(train_cli, tiny_dataset, tmp_path):
    line = _one_line_error(*train_cli("--data", tiny_dataset, "--out", tmp_path / "empty",
                                      "--resume", *FAST)[::2])
    assert "--resume" in line


def test_existing_run_needs_resume(train_cli, tiny_dataset, tmp_path):
    args = ("--data", tiny_dataset, "--out", tmp_path / "r", "--epochs", 1, "--batch-size", 32,
            *FAST)
    assert train_cli(*args)[0] == 0
    line = _one_line_error(*train_cli(*args)[::2])
    assert "--resume" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_asked_for_but_absent(train_cli, tiny_dataset, tmp_path):
    line = _one_line_error(*train_cli("--data", tiny_dataset, "--device", "cuda",
                                      "--out", tmp_path / "r", *FAST)[::2])
    assert "CUDA" in line


def test_bad_flag_value_in_yaml(train_cli, tiny_dataset, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("batch-size: many\n")
    line = _one_line_error(*train_cli("--config", config, *FAST)[::2])
    assert "--batch-size" in line


def test_diverging_loss_stops_with_a_clear_message(train_cli, tiny_dataset, tmp_path):
    code, _, err = train_cli("--data", tiny_dataset, "--out", tmp_path / "r", "--epochs", 3,
                             "--batch-size", 16, "--lr", "1e6", "--precision", "fp32", *FAST)
    assert code == 1
    assert "non-finite" in err and "--lr" in err


def test_tensorboard_flag(train_cli, tiny_dataset, tmp_path):
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", tmp_path / "run",
                                  "--epochs", 1, "--batch-size", 32, "--tensorboard", *FAST)
    assert code == 0, err
    assert "--tensorboard" not in stdout  # no "not installed" line: make install has it
    [events] = (tmp_path / "run" / "tensorboard").iterdir()
    assert events.name.startswith("events.out.tfevents.") and events.stat().st_size > 100
    assert (tmp_path / "run" / "metrics.jsonl").is_file()


def test_a_damaged_val_split_is_an_error_not_a_silent_skip(train_cli, tmp_path):
    from ..tiny_data import write_tiny_dataset
    data = write_tiny_dataset(tmp_path / "ds")
    (data / "val.beton").write_bytes(b"\0" * 100)
    line = _one_line_error(*train_cli("--data", data, "--out", tmp_path / "r", *FAST)[::2])
    assert "val.beton" in line


@pytest.mark.cuda
@pytest.mark.timeout(300)
def test_train_with_defaults_on_the_gpu(train_cli, tmp_path):
    """`train --data DS` and nothing else (issue 14: it crashed in the batch finder): batch
    auto, bf16/fp16, torch.compile and the pipeline auto picks; each decision printed at
    start gives its GPU reason."""
    from ..tiny_data import write_tiny_dataset
    data = write_tiny_dataset(tmp_path / "ds", size=32, train=512, val=64)
    out = tmp_path / "run"
    code, stdout, err = train_cli("--data", data, "--out", out, "--epochs", 2)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["device"].startswith("cuda") and summary["compiled"] is True
    assert summary["precision"] in ("bf16", "fp16") and summary["steps"] > 0
    decisions = summary["decisions"]
    for key in ("device", "precision", "compile", "compile_mode", "threads", "batch_size"):
        why = decisions[key]
        assert any(w in why for w in ("CUDA", "GPU", "compute capability")), (key, why)
        assert f"  {key}: {why}" in stdout


def test_a_bare_beton_trains_and_names_its_classes_by_label(train_cli, tiny_dataset, tmp_path):
    """A .beton from FFCV's own writer has no class names: the run (and its weights' card)
    call them "0", "1", ... (the gpu-check smoke run found the builder assuming names)."""
    from turbotrain.train.weights.weights import read_weights
    bare = tmp_path / "bare.beton"  # not a split of a prepared folder: no hint
    bare.write_bytes((tiny_dataset / "train.beton").read_bytes())
    code, stdout, err = train_cli("--data", bare, "--out", tmp_path / "r", "--epochs", 1,
                                  "--max-steps", 2, *FAST)
    assert code == 0, err
    assert "did you mean" not in err + stdout and "evaluation: none" in stdout
    _, card = read_weights(tmp_path / "r" / "final.safetensors")
    assert card.classes == tuple(str(k) for k in range(card.num_classes))


def test_a_split_of_a_prepared_folder_asks_did_you_mean_the_folder(train_cli, tiny_dataset,
                                                                  tmp_path):
    """Issue 46: `--data DS/train.beton` trained without the val split beside it, silently.
    It still trains (a split on purpose is allowed), with a one-line warning at the start."""
    code, stdout, err = train_cli("--data", tiny_dataset / "train.beton", "--out",
                                  tmp_path / "r", "--epochs", 1, "--max-steps", 2, *FAST)
    assert code == 0, err
    warning, = [line for line in err.splitlines() if "did you mean" in line]
    assert warning.startswith("train: warning: ") and warning.endswith(
        f"did you mean `--data {tiny_dataset}`?")
    assert f"did you mean `--data {tiny_dataset}`?" in stdout  # the evaluation line says it


# ---------------------------------------------------------------------------- issue 36

def test_other_trainers_names_of_our_flags_run(train_cli, tiny_dataset, tmp_path):
    """-b, --grad-accum-steps, --num-workers (timm's, torchvision's) are our --batch-size,
    --accum-steps, --workers; --warmup-epochs is converted to steps, and the run's config.yaml
    keeps the steps (one warm-up setting to rerun)."""
    out = tmp_path / "run"
    fast = [a for a in FAST if a not in ("--workers", "0")]
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", out, "--epochs", 2,
                                  "-b", 16, "--grad-accum-steps", 2, "--num-workers", 0,
                                  "--warmup-epochs", 1, *fast)
    assert code == 0, err
    # 96 images / 16 = 6 micro-batches per epoch / 2 = 3 optimizer steps per epoch.
    assert "  warmup: 3 steps: --warmup-epochs 1 x 3 steps per epoch" in stdout
    saved = (out / "config.yaml").read_text()
    assert "batch-size: 16" in saved and "accum-steps: 2" in saved and "workers: 0" in saved
    assert "warmup-steps: 3" in saved and "warmup-epochs" not in saved
    assert json.loads((out / "summary.json").read_text())["steps"] == 6


def test_a_timm_model_with_a_weights_tag_trains(train_cli, tiny_dataset, tmp_path):
    expect.need("timm")
    out = tmp_path / "run"
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", out, "--epochs", 1,
                                  "--max-steps", 1, "--batch-size", 8, "--model",
                                  "timm:resnet18.a1_in1k", *FAST)
    assert code == 0, err
    assert "model: timm:resnet18.a1_in1k" in (out / "config.yaml").read_text()


def test_fp16_on_a_cpu_trains_with_a_one_line_warning(train_cli, tiny_dataset, tmp_path):
    """fp16 autocast on a CPU is emulated (an fp16 step measured 41 s against 7 s in fp32):
    asked for, it is kept, and said once on stderr and in the precision decision."""
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", tmp_path / "r", "--epochs", 1,
                                  "--max-steps", 1, "--batch-size", 8, "--precision", "fp16",
                                  "--device", "cpu", *FAST)
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert warnings == ["train: warning: --precision fp16 is 3-6x slower than fp32 here: this "
                        "CPU runs fp16 emulated; use --precision auto or fp32"], err
    assert "  precision: fp16: asked for (--precision fp16 is 3-6x slower" in stdout


def test_five_classes_or_fewer_report_no_top5(train_cli, tiny_dataset, tmp_path):
    """With 4 classes the five best guesses hold every class: a top-5 of 100% says nothing,
    so the epoch lines, metrics.jsonl and summary.json leave it out."""
    out = tmp_path / "run"
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", out, "--epochs", 1,
                                  "--batch-size", 16, *FAST)
    assert code == 0, err
    epoch_lines = [line for line in stdout.splitlines() if "val_accuracy" in line]
    assert epoch_lines and not any("top5" in line for line in epoch_lines), epoch_lines
    assert json.loads((out / "summary.json").read_text())["val_top5"] is None
    assert [r["val_top5"] for r in read_jsonl(out / "metrics.jsonl")
            if r["kind"] == "epoch"] == [None]
