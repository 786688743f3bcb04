"""`train` under torchrun on CPU (Gloo, 1 torch thread per rank) on a Fashion-MNIST subset.

* 2 processes vs 1 with the same global batch: shards are disjoint and cover the split each
  epoch, only rank 0 writes, and the final accuracy is within a small margin.
* A 2-process run killed with SIGKILL and resumed logs the same losses, bit for bit; resuming
  it with another number of processes is refused.
* A rank killed mid-run (rank 0 or 1), or one that hangs, ends the job with a one-line error
  on the survivor in bounded time, not a hang.
* In-process: the metric reductions on two Gloo ranks, --sync-bn, the flags, the error text.

Run as `python -m tests.train.step.test_ddp ARGS` (what torchrun starts below), this module is the
`train` command with each rank recording the training samples it was fed, and its pid.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from turbotrain.pipeline.order import SampleOrder
from turbotrain.train.config.config import TrainConfig
from turbotrain.train.errors import TrainError
from turbotrain.train.records.checkpoint import checkpoint_path
from turbotrain.train.step.distributed import (DistEnv, convert_sync_batchnorm,
                                               explain_collective_failure, is_collective_failure)

from ...fashion_subset import prepare_fashion_subset
from ..conftest import REPO, logged_steps, read_jsonl, step_losses, wait_until

# One pytest worker runs this whole module (make test: --dist loadgroup), so its module-scoped
# fixture runs once, not once per worker: two_rank_run trains two ranks (~50 s).
pytestmark = [pytest.mark.xdist_group("ddp"), pytest.mark.usefixtures("child_processes")]

TRAIN_IMAGES = 4096  # a multiple of the global batch (64): the shards cover the split exactly
VAL_IMAGES = 1024
GLOBAL_BATCH = 64
EPOCHS = 2
STEPS = EPOCHS * TRAIN_IMAGES // GLOBAL_BATCH  # 128
# Everything but the batch size is shared by the 1- and 2-process runs. --deterministic and
# --log-every 1 make the 2-process run the exact reference for the resume test. --device cpu:
# these are the Gloo tests, on any machine (on a one-GPU machine two ranks would otherwise
# share cuda:0, which NCCL refuses); test_one_process_on_nccl is the GPU's.
COMMON = ("--pipeline", "pytorch", "--epochs", EPOCHS, "--threads", 1, "--workers", 0,
          "--log-every", 1, "--checkpoint-every", 20, "--deterministic", "--seed", 0,
          "--device", "cpu")
TWO_RANKS = ("--batch-size", GLOBAL_BATCH // 2, *COMMON)
# Measured on the 2-core box, seeds 0-2: 1 process 78.0-78.5%, 2 processes 78.3-79.1%, a gap
# of at most 1.0 point (BatchNorm statistics over each rank's 32 images instead of 64).
ACCURACY_MARGIN = 0.025

PID_DIR_VARIABLE = "TURBOTRAIN_TEST_PID_DIR"


# ---------------------------------------------------------------------------- helpers

@pytest.fixture(scope="module")
def fashion_subset(tmp_path_factory):
    """The first 4096 train and 1024 test images of Fashion-MNIST, through `prepare`."""
    return prepare_fashion_subset(tmp_path_factory.mktemp("fashion"), TRAIN_IMAGES, VAL_IMAGES)


def start_torchrun(*args, pid_dir: Path, log: Path) -> subprocess.Popen:
    """`torchrun --standalone --nproc-per-node 2 -m tests.train.step.test_ddp ARGS`, in its own
    process group (so a test can kill the whole job), output to `log`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", PID_DIR_VARIABLE: str(pid_dir)}
    pid_dir.mkdir(parents=True, exist_ok=True)
    # --standalone: a private rendezvous on a free port, so tests can run side by side.
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", "-m", "tests.train.step.test_ddp", *map(str, args)]
    with open(log, "w") as out:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def run_torchrun(*args, tmp_path: Path, timeout: float = 150) -> str:
    log = tmp_path / f"torchrun-{time.monotonic_ns()}.log"
    pid_dir = tmp_path / "pids"
    proc = start_torchrun(*args, pid_dir=pid_dir, log=log)
    try:
        proc.wait(timeout=timeout)
    finally:
        kill_job(proc, pid_dir)
    output = log.read_text()
    assert proc.returncode == 0, output[-4000:]
    return output


def kill_job(proc: subprocess.Popen, pid_dir: Path) -> None:
    """SIGKILL to every rank still running, then to torchrun. torchrun starts each rank in a
    session of its own, so a rank outlives torchrun's death (and a SIGSTOPped one stays forever)
    unless killed by its pid."""
    for path in pid_dir.glob("rank*.pid"):
        pid = int(path.read_text())
        if rank_alive(pid, pid_dir):
            os.kill(pid, signal.SIGKILL)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def rank_alive(pid: int, pid_dir: Path) -> bool:
    """Whether `pid` is still a running rank of this test's job (not a zombie, and not another
    process that reused the number: its command line names this test's folder)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X") and str(pid_dir.parent) in command


def rank_pid(pid_dir: Path, rank: int) -> int:
    return int((pid_dir / f"rank{rank}.pid").read_text())


# ---------------------------------------------------------------------------- 1 vs 2 processes

@pytest.fixture(scope="module")
def two_rank_run(fashion_subset, tmp_path_factory):
    """An uninterrupted 2-process run: (run folder, torchrun's output)."""
    tmp = tmp_path_factory.mktemp("ddp")
    out = tmp / "run"
    output = run_torchrun("--data", fashion_subset, "--out", out, *TWO_RANKS, tmp_path=tmp)
    return out, output


@pytest.mark.timeout(180)
def test_two_processes_shard_disjointly_and_match_one_process(two_rank_run, fashion_subset,
                                                               train_cli, tmp_path):
    out, output = two_rank_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_batch_size"] == GLOBAL_BATCH
    assert summary["steps"] == STEPS and summary["images"] == EPOCHS * TRAIN_IMAGES
    assert summary["images_per_second"] > 0 and 0 <= summary["data_wait_fraction"] < 1

    # Disjoint shards that cover the split, each epoch, and the batches the rank yielded hold
    # the labels of the samples it was given.
    seen = [np.load(out / f"samples-rank{rank}.npz") for rank in (0, 1)]
    for rank, record in enumerate(seen):
        assert record["labels_match"].all(), f"rank {rank} yielded other samples' labels"
    for epoch in range(EPOCHS):
        shards = [record["index"][record["epoch"] == epoch] for record in seen]
        assert len(shards[0]) == len(shards[1]) == TRAIN_IMAGES // 2
        assert not set(shards[0].tolist()) & set(shards[1].tolist())
        assert sorted(np.concatenate(shards).tolist()) == list(range(TRAIN_IMAGES))
        for rank, shard in enumerate(shards):  # the shared order of every pipeline
            order = SampleOrder(TRAIN_IMAGES, batch_size=GLOBAL_BATCH // 2, seed=0, rank=rank,
                                world_size=2)
            assert shard.tolist() == order.samples(epoch).tolist()

    # Rank 0 alone prints and logs: one "done" line, each step logged once.
    assert output.count("done: ") == 1
    assert sorted(step_losses(out)) == list(range(1, STEPS + 1))
    assert len([r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "step"]) == STEPS

    single = tmp_path / "single"
    code, _, err = train_cli("--data", fashion_subset, "--out", single, "--batch-size",
                             GLOBAL_BATCH, *COMMON)
    assert code == 0, err
    one = json.loads((single / "summary.json").read_text())
    assert one["world_size"] == 1 and one["global_batch_size"] == GLOBAL_BATCH
    assert one["val_accuracy"] > 0.7  # it learned: 10 classes
    assert abs(summary["val_accuracy"] - one["val_accuracy"]) <= ACCURACY_MARGIN, (
        summary["val_accuracy"], one["val_accuracy"])


# ---------------------------------------------------------------------------- resume

@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_process_run_killed_and_resumed_repeats_the_losses(two_rank_run, fashion_subset,
                                                               tmp_path):
    reference, _ = two_rank_run
    out = tmp_path / "run"
    log = tmp_path / "killed.log"
    pids = tmp_path / "pids"
    proc = start_torchrun("--data", fashion_subset, "--out", out, *TWO_RANKS, pid_dir=pids,
                          log=log)
    try:
        # Past the step-20 checkpoint (rank 0 logs step 21 only after writing it), mid-epoch.
        wait_until(lambda: logged_steps(out) >= 24, proc, timeout=90, log=log)
    finally:
        kill_job(proc, pids)  # both ranks and torchrun with SIGKILL: a lost node
    assert not any(rank_alive(rank_pid(pids, rank), pids) for rank in (0, 1))
    killed_at = logged_steps(out)
    time.sleep(1.0)
    assert logged_steps(out) == killed_at < STEPS  # nothing is training any more
    assert not (out / "summary.json").exists()
    saved = torch.load(checkpoint_path(out), weights_only=False)["counters"]
    assert 20 <= saved["step"] < STEPS and saved["micro_in_epoch"] > 0

    run_torchrun("--out", out, "--resume", tmp_path=tmp_path)
    # Both ranks continued from the same checkpoint at the same batch: any difference in the
    # weights, the optimizer state or a rank's data position would change these losses.
    assert step_losses(out) == step_losses(reference)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["world_size"] == 2


def test_resuming_with_another_number_of_processes_is_refused(two_rank_run, train_cli,
                                                             tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(two_rank_run[0], copy)
    code, _, err = train_cli("--out", copy, "--resume", "--epochs", EPOCHS + 1)
    assert code == 2
    assert "was trained by 2 process(es) and this launch has 1" in err, err


# ---------------------------------------------------------------------------- failures

LONG_RUN = ("--batch-size", 32, "--pipeline", "pytorch", "--epochs", 50, "--threads", 1,
            "--workers", 0, "--log-every", 5, "--checkpoint-every", 0, "--device", "cpu")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("killed", [0, 1])
def test_a_killed_rank_ends_the_job_with_an_error_on_the_survivor(killed, fashion_subset,
                                                                   tmp_path):
    out, log, pids = tmp_path / "run", tmp_path / "job.log", tmp_path / "pids"
    proc = start_torchrun("--data", fashion_subset, "--out", out, *LONG_RUN, pid_dir=pids,
                          log=log)
    try:
        wait_until(lambda: logged_steps(out) >= 10, proc, timeout=90, log=log)
        os.kill(rank_pid(pids, killed), signal.SIGKILL)
        killed_at = time.monotonic()
        proc.wait(timeout=60)
        seconds = time.monotonic() - killed_at
    finally:
        kill_job(proc, pids)
    output = log.read_text()
    survivor = 1 - killed
    assert proc.returncode != 0
    assert (f"train: error: rank {survivor} of 2: lost the connection to another rank"
            in output), output[-4000:]
    assert f"--out {out} --resume" in output
    assert seconds < 45, seconds  # torchrun's own grace period is 30 s


@pytest.mark.timeout(120)
def test_a_hung_rank_makes_the_other_time_out_with_an_error(fashion_subset, tmp_path):
    out, log, pids = tmp_path / "run", tmp_path / "job.log", tmp_path / "pids"
    timeout = 4
    proc = start_torchrun("--data", fashion_subset, "--out", out, *LONG_RUN, "--dist-timeout",
                          timeout, pid_dir=pids, log=log)
    expected = "train: error: rank 0 of 2: no answer from another rank within --dist-timeout"
    try:
        wait_until(lambda: logged_steps(out) >= 10, proc, timeout=90, log=log)
        os.kill(rank_pid(pids, 1), signal.SIGSTOP)  # alive but silent: no socket closes
        stopped_at = time.monotonic()
        wait_until(lambda: expected in log.read_text(), proc, timeout=60, log=log)
        seconds = time.monotonic() - stopped_at
    finally:
        kill_job(proc, pids)
    assert timeout - 1 < seconds < timeout + 20, seconds


# ---------------------------------------------------------------------------- in-process

def _reduce_on_two_ranks(rank: int, init_file: str, results: str) -> None:
    import torch.distributed as dist

    from turbotrain.train.step.distributed import max_over_ranks, mean_loss_and_any_stop
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=2)
    env = DistEnv(rank=rank, world_size=2, local_rank=rank, local_world_size=2)
    loss, stop = mean_loss_and_any_stop(torch.tensor(1.0 + 2 * rank), rank == 1, env)
    wait = max_over_ranks(0.5 + rank, env, torch.device("cpu"))
    Path(results, f"rank{rank}.json").write_text(json.dumps([loss, stop, wait]))
    dist.destroy_process_group()


@pytest.mark.timeout(60)
def test_logged_metrics_are_reduced_across_ranks(tmp_path):
    """Loss: the mean of the ranks' (1 and 3); stop: any rank's; data wait: the slowest's."""
    torch.multiprocessing.spawn(_reduce_on_two_ranks, args=(str(tmp_path / "init"),
                                                            str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == [2.0, True, 1.5]


class _OneRankGroup(DistEnv):
    """One process that still takes the distributed path: a process group, DDP (no_sync on
    micro-steps), the log-point reductions, the checkpoint barrier, the eval all-reduce. A
    one-GPU machine cannot run two NCCL ranks (they would share cuda:0), so this is how the
    NCCL path is tested there."""

    @property
    def enabled(self) -> bool:
        return True


@pytest.mark.timeout(300)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_one_process_group_trains_under_ddp(device, train_cli, tiny_dataset, tmp_path,
                                            monkeypatch):
    """Gloo on the CPU; NCCL on a GPU (the backend follows the device)."""
    import socket

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from turbotrain.train.engine import trainer
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0",
                        "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(trainer, "dist_env_from_environ", lambda: _OneRankGroup())
    wrapped = []

    class CountingDDP(DistributedDataParallel):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            wrapped.append(dist.get_backend())

    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", CountingDDP)
    out = tmp_path / "run"
    code, _, err = train_cli("--data", tiny_dataset, "--out", out, "--device", device,
                             "--epochs", 1, "--batch-size", 8, "--accum-steps", 2,
                             "--no-compile", "--pipeline", "test-memory", "--threads", 1,
                             "--workers", 0, "--log-every", 2)
    assert code == 0, err
    assert wrapped == ["nccl" if device == "cuda" else "gloo"]
    assert not dist.is_initialized()  # torn down at the end
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["val_loss"] is not None


def test_sync_bn_converts_on_cuda_and_refuses_cpu():
    def model():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    one = DistEnv()
    two = DistEnv(rank=0, world_size=2, local_world_size=2)
    kept, why = convert_sync_batchnorm(model(), one, torch.device("cpu"))
    assert isinstance(kept[1], torch.nn.BatchNorm2d) and why.startswith("off")
    with pytest.raises(TrainError, match="--sync-bn needs CUDA"):
        convert_sync_batchnorm(model(), two, torch.device("cpu"))
    converted, _ = convert_sync_batchnorm(model(), two, torch.device("cuda", 0))
    assert isinstance(converted[1], torch.nn.SyncBatchNorm)  # converting touches no GPU


def test_distributed_flags_parse_and_validate(train_cli, tiny_dataset):
    assert TrainConfig().dist_timeout == 300 and TrainConfig().sync_bn is False
    code, _, err = train_cli("--data", tiny_dataset, "--dist-timeout", 0)
    assert code == 2 and "--dist-timeout must be at least 1" in err
    import argparse

    from turbotrain.train.config.config_files import config_from_namespace
    from turbotrain.train.config.config_flags import add_config_arguments
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args = parser.parse_args(["--data", "DATA", "--sync-bn", "--dist-timeout", "60"])
    config = config_from_namespace(args)
    assert config.sync_bn is True and config.dist_timeout == 60


def test_collective_failures_are_told_apart_and_explained():
    import torch.distributed as dist
    reset = RuntimeError("[/w/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
                         "[127.0.0.1]:32916: Connection reset by peer. This is typically "
                         "caused by a remote worker hanging")
    timed_out = RuntimeError("[/w/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
                             "Timed out waiting 5000ms for recv operation to complete")
    closed = RuntimeError("Application timeout caused pair closure")  # bare: no source path
    assert is_collective_failure(reset) and is_collective_failure(timed_out)
    assert is_collective_failure(closed)
    assert is_collective_failure(RuntimeError("Connection closed by peer [127.0.0.1]:5"))
    assert is_collective_failure(dist.DistBackendError("NCCL watchdog"))
    assert not is_collective_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_collective_failure(TrainError("--data is required"))
    env = DistEnv(rank=1, world_size=4)
    line = explain_collective_failure(reset, env, 300, "runs/x")
    assert line.startswith("rank 1 of 4: lost the connection to another rank")
    assert "[Read error [127.0.0.1]:32916: Connection reset by peer]" in line
    assert "--out runs/x --resume" in line and "\n" not in line
    assert "within --dist-timeout 300 s" in explain_collective_failure(timed_out, env, 300)
    assert "within --dist-timeout 300 s" in explain_collective_failure(closed, env, 300)


# ---------------------------------------------------------------------------- the harness

def _record_training_samples(out: Path, rank: int) -> None:
    """Wraps every ordered pipeline's iteration to note, for each training batch it yields,
    the epoch, the sample indices its SampleOrder gave it, and whether the batch's labels are
    those samples' labels; written to OUT/samples-rank{R}.npz when the process exits."""
    import atexit

    from turbotrain.pipeline.ordered import OrderedPipeline
    epochs, indices, matches = [], [], []
    original = OrderedPipeline.__iter__

    def recording_iter(self):
        epoch = self.epoch
        planned = self.order.batches(epoch)[self.batch_index:]
        for k, (images, labels) in enumerate(original(self)):  # runs `original` to its end
            chunk = planned[k]
            if self.options.train:
                epochs.append(np.full(len(chunk), epoch))
                indices.append(chunk)
                expected = np.asarray(self.dataset.labels)[chunk]
                matches.append(np.array_equal(labels.cpu().numpy(), expected))
            yield images, labels

    def write():
        if indices and out.is_dir():
            np.savez(out / f"samples-rank{rank}.npz", epoch=np.concatenate(epochs),
                     index=np.concatenate(indices), labels_match=np.array(matches))

    OrderedPipeline.__iter__ = recording_iter
    atexit.register(write)


def _main(argv: list[str]) -> int:
    from turbotrain.cli import main as turbotrain_main
    rank = int(os.environ.get("RANK", 0))
    pid_dir = os.environ.get(PID_DIR_VARIABLE)
    if pid_dir:
        Path(pid_dir, f"rank{rank}.pid").write_text(str(os.getpid()))
    out = Path(argv[argv.index("--out") + 1])
    _record_training_samples(out, rank)
    return turbotrain_main(["train", *argv])


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
