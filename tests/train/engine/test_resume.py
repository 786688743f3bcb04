"""Exact resume: a run killed with SIGKILL (or stopped with SIGTERM) and resumed logs the same
per-step losses, bit for bit, as a run that was never interrupted: on the CPU (1 thread) and,
marked `cuda`, on a GPU (eager: `--deterministic` there once failed in adaptive_max_pool2d's
backward, which has no deterministic CUDA kernel; issue 14)."""
from __future__ import annotations

import json
import signal

import pytest
import torch

from turbotrain.train.records.checkpoint import checkpoint_path

from ..conftest import logged_steps, read_jsonl, signal_when, step_losses, train_subprocess

# One pytest worker runs this whole module (make test: --dist loadgroup), so its module-scoped
# fixture runs once, not once per worker: uninterrupted trains the reference runs.
pytestmark = [pytest.mark.xdist_group("resume"), pytest.mark.usefixtures("child_processes")]

# test-slow takes 50 ms a batch, so there is time to kill the run between checkpoints.
ARGS = ("--pipeline", "test-slow", "--epochs", 3, "--batch-size", 8, "--log-every", 1,
        "--checkpoint-every", 5, "--threads", 1, "--workers", 0, "--deterministic",
        "--lr", "0.1")
TOTAL_STEPS = 36  # 96 images / 8 x 3 epochs
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
# --no-compile on CUDA: eager runs the aten kernels whose determinism is in question, and three
# compiles would triple this test's time inside the GPU check's budget.
DEVICE_ARGS = {"cpu": ("--device", "cpu"), "cuda": ("--device", "cuda", "--no-compile")}


def _run_to_end(*args, timeout=240):
    proc = train_subprocess(*args)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out


def _checkpoint_step(run_dir) -> int:
    try:
        return torch.load(checkpoint_path(run_dir), weights_only=False)["counters"]["step"]
    except (FileNotFoundError, EOFError, RuntimeError):
        return -1


@pytest.fixture(scope="module", params=DEVICES)
def uninterrupted(request, tiny_dataset, tmp_path_factory):
    """(the run folder, the run's flags) of the run that is never interrupted."""
    args = (*ARGS, *DEVICE_ARGS[request.param])
    run_dir = tmp_path_factory.mktemp("resume") / "full"
    _run_to_end("--data", tiny_dataset, "--out", run_dir, *args)
    losses = step_losses(run_dir)
    assert sorted(losses) == list(range(1, TOTAL_STEPS + 1))
    return run_dir, args


def _epoch_records(run_dir):
    return [{k: r[k] for k in ("epoch", "step", "val_loss", "val_accuracy", "train_loss")}
            for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "epoch"]


def test_resume_after_kill_9_repeats_the_losses_exactly(uninterrupted, tiny_dataset, tmp_path):
    uninterrupted, args = uninterrupted
    run_dir = tmp_path / "killed"
    proc = train_subprocess("--data", tiny_dataset, "--out", run_dir, *args)
    # Kill after the step-5 checkpoint, with a few steps logged past it (these must go).
    signal_when(lambda: _checkpoint_step(run_dir) >= 5 and logged_steps(run_dir) >= 7, proc,
                signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert logged_steps(run_dir) < TOTAL_STEPS
    _run_to_end("--out", run_dir, "--resume")
    assert step_losses(run_dir) == step_losses(uninterrupted)
    assert _epoch_records(run_dir) == _epoch_records(uninterrupted)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == TOTAL_STEPS


def test_sigterm_checkpoints_then_resume_finishes_the_same(uninterrupted, tiny_dataset,
                                                           tmp_path):
    uninterrupted, args = uninterrupted
    run_dir = tmp_path / "stopped"
    proc = train_subprocess("--data", tiny_dataset, "--out", run_dir, *args)
    _, err = signal_when(lambda: logged_steps(run_dir) >= 3, proc, signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "--resume" in err
    stopped_at = _checkpoint_step(run_dir)
    assert 3 <= stopped_at < TOTAL_STEPS
    _run_to_end("--out", run_dir, "--resume")
    assert step_losses(run_dir) == step_losses(uninterrupted)


def test_a_resumed_run_s_timeline_covers_the_whole_run(tiny_dataset, tmp_path):
    """timeline.png after a resume drew only the resumed process's steps, and an "epoch start"
    at the resume point mid-epoch: the checkpoint now carries the timeline, the resumed run
    appends to it, and the resume is marked as such."""
    run_dir = tmp_path / "stopped"
    proc = train_subprocess("--data", tiny_dataset, "--out", run_dir, *ARGS)
    signal_when(lambda: logged_steps(run_dir) >= 3, proc, signal.SIGTERM)
    stopped_at = _checkpoint_step(run_dir)
    assert 3 <= stopped_at < TOTAL_STEPS
    _run_to_end("--out", run_dir, "--resume")
    timeline = torch.load(checkpoint_path(run_dir), weights_only=True)["timeline"]
    assert (run_dir / "timeline.png").stat().st_size > 0
    # Every step is drawn but each process's first (warm-up, kept out of the timing).
    assert timeline["first_step"][0] == 2 and sum(timeline["counts"]) == TOTAL_STEPS - 2
    assert timeline["first_step"][-1] + timeline["counts"][-1] - 1 == TOTAL_STEPS
    steps_per_epoch = TOTAL_STEPS // 3
    assert timeline["epoch_starts"] == [1, 1 + steps_per_epoch, 1 + 2 * steps_per_epoch]
    assert timeline["resumes"] == [stopped_at + 1]


def _resume_as_older(uninterrupted, tiny_dataset, run_dir, make_older) -> None:
    """Stops a run with SIGTERM after 3 logged steps, rewrites its checkpoint as an older
    trainer wrote it (`make_older(state)` changes the state in place), resumes it to the end
    and checks that it logged the uninterrupted run's losses."""
    from turbotrain.train.records.checkpoint import save_atomic
    uninterrupted, args = uninterrupted
    proc = train_subprocess("--data", tiny_dataset, "--out", run_dir, *args)
    signal_when(lambda: logged_steps(run_dir) >= 3, proc, signal.SIGTERM)
    path = checkpoint_path(run_dir)
    state = torch.load(path, weights_only=True)
    make_older(state)
    save_atomic({k: v for k, v in state.items() if k != "format_version"}, path)
    _run_to_end("--out", run_dir, "--resume")
    assert step_losses(run_dir) == step_losses(uninterrupted)


def test_a_checkpoint_with_a_scheduler_entry_resumes_the_same(uninterrupted, tiny_dataset,
                                                              tmp_path):
    """Checkpoints written while the LR came from a LambdaLR hold its state under "scheduler";
    the LR is now a function of the step counter, so they resume as they are, the entry
    unread, with the same LRs and losses."""
    def with_a_scheduler(state):
        assert "scheduler" not in state  # nothing to save any more
        step = state["counters"]["step"]
        state["scheduler"] = {  # what LambdaLR.state_dict() held, the multiplier's fields too
            "base_lrs": [g["initial_lr"] for g in state["optimizer"]["param_groups"]],
            "last_epoch": step, "_step_count": step + 1, "_is_initial": False,
            "_get_lr_called_within_step": False, "_last_lr": [0.0, 0.0],
            "lr_lambdas": [{"total": TOTAL_STEPS, "kind": "cosine", "warmup": 2}] * 2}

    run_dir = tmp_path / "old"
    _resume_as_older(uninterrupted, tiny_dataset, run_dir, with_a_scheduler)
    lrs = [{r["step"]: r["lr"] for r in read_jsonl(d / "metrics.jsonl") if r["kind"] == "step"}
           for d in (run_dir, uninterrupted[0])]
    assert lrs[0] == lrs[1]


def test_a_checkpoint_from_before_the_timing_ledger_resumes_the_same(uninterrupted, tiny_dataset,
                                                                    tmp_path):
    """Checkpoints written before the step-timing ledger (ledger.py) hold its sums as counters
    (timed_seconds, ...) and no "timing" entry; they resume as they are, with the same losses,
    and the summary's timing still counts the steps timed before the stop."""
    old = {}

    def with_timing_counters(state):
        timing = state.pop("timing")
        old.update(timed_seconds=timing["seconds"], timed_images=timing["images"],
                   timed_steps=timing["steps"], timed_data_wait=timing["data_wait"],
                   warmup_seconds=timing["warmup_seconds"])
        assert old["timed_steps"] >= 1 and old["timed_data_wait"] > 0
        state["counters"].update(old)

    run_dir = tmp_path / "old"
    _resume_as_older(uninterrupted, tiny_dataset, run_dir, with_timing_counters)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["diagnosis"]["numbers"]["timed_steps"] > old["timed_steps"]
    assert summary["data_wait_seconds"] > old["timed_data_wait"]
    assert summary["warmup_seconds"] > old["warmup_seconds"]  # the resumed process's warm-up
