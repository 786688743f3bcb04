"""One writer per folder: a second `train` on a run folder in use, or a second `prepare-dataset`
into an OUT in use, is refused in one line naming the holder's pid (turbotrain/datasets/
folder_lock.py); a killed checkpoint's temporary is removed by the next run there; and
`--resume auto` on a run killed before its first checkpoint starts it again from scratch.

Real processes throughout: the lock is held by this test process (folder_lock.hold, the same
function train and prepare-dataset use) or by a real train child.
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from turbotrain.datasets.prepare.output_folder import OutputFolderError, install
from turbotrain.datasets.synthetic import write_shapes_imagefolder
from turbotrain.files import folder_lock
from turbotrain.train.config.config import TrainConfig
from turbotrain.train.engine import run_folder
from turbotrain.train.errors import TrainError

from .confined import REPO
from .train_child import FAST, run_train

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("child_processes")]

ARGS = ["--model", "compact28", "--batch-size", 16, "--epochs", 50]
SLOW = ["test-slow" if arg == "test-memory" else arg for arg in FAST]  # 50 ms a batch


@pytest.fixture(scope="module")
def trained(tiny_dataset, tmp_path_factory) -> Path:
    """A run folder after 2 steps: config.yaml, metrics.jsonl, checkpoint.pt, ..."""
    run = tmp_path_factory.mktemp("trained") / "run"
    ran = run_train("--data", tiny_dataset, "--out", run, "--max-steps", 2, *ARGS, *FAST,
                    cwd=run.parent)
    assert ran.returncode == 0, ran.stderr[-3000:]
    return run


def _copy(run: Path, to: Path) -> Path:
    shutil.copytree(run, to, symlinks=True)
    return to


def _steps(run: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "step"]


def _duplicates(steps: list[int]) -> int:
    return sum(n - 1 for n in collections.Counter(steps).values())


def _in_use(run: Path, pid: int) -> str:
    return (f"train: error: run folder {run} is in use by another train (pid {pid}); wait for "
            "it or choose another --out")


def test_two_resumes_at_once_the_second_is_refused_naming_the_first(trained, tmp_path):
    """`--resume auto` twice on one folder (a requeued job started twice): both ran and
    interleaved metrics.jsonl. The second now stops at once, naming the first's pid."""
    run = _copy(trained, tmp_path / "run")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(
        [sys.executable, "-m", "tests.train.run_with_test_pipelines", "--out", run,
         "--resume", "auto", "--max-steps", "100000", *map(str, SLOW)], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    try:
        deadline = time.monotonic() + 90
        while len(_steps(run)) <= 2:  # the first is past its start: it trains
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
            time.sleep(0.1)
        second = run_train("--out", run, "--resume", "auto", "--max-steps", 100000, *SLOW,
                           cwd=tmp_path, timeout=60)
        assert second.error_line("train: error: ") == _in_use(run, first.pid)
        assert first.poll() is None  # untouched by the refusal
    finally:
        first.send_signal(signal.SIGTERM)  # it checkpoints and stops
        _, err = first.communicate(timeout=60)
    assert "Traceback" not in err, err[-3000:]
    steps = _steps(run)
    assert _duplicates(steps) == 0 and steps == sorted(steps), steps


def test_a_new_run_into_a_folder_in_use_is_refused(tiny_dataset, tmp_path):
    """Two new runs into one empty folder could both find it empty; the check is made under
    the lock now, so the second is refused (here the lock is this test's)."""
    run = tmp_path / "run"
    run.mkdir()
    with folder_lock.held(run / ".lock"):
        ran = run_train("--data", tiny_dataset, "--out", run, "--max-steps", 1, *ARGS, *FAST,
                        cwd=tmp_path)
        assert ran.error_line("train: error: ") == _in_use(run, os.getpid())
        assert os.listdir(run) == [".lock"]
    # Released, the lock file goes, and a lock file left by a killed run is no obstacle.
    assert os.listdir(run) == []
    (run / ".lock").write_text("4242 elsewhere\n")
    ran = run_train("--data", tiny_dataset, "--out", run, "--max-steps", 1, *ARGS, *FAST,
                    cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert _steps(run) == [1] and not (run / ".lock").exists()


def test_a_killed_checkpoints_temporary_is_removed_by_the_next_run(trained, tmp_path):
    run = _copy(trained, tmp_path / "run")
    torn = run / ".checkpoint.pt.0123456789abcdef.tmp"  # what kill -9 mid-save leaves
    torn.write_bytes((run / "checkpoint.pt").read_bytes()[:100_000])
    victim = run / "notes.txt"
    victim.write_text("keep\n")
    link = run / ".checkpoint.pt.fedcba9876543210.tmp"
    link.symlink_to(victim)  # our pattern, but a link: not ours, left alone
    other = run / ".checkpoint.pt.notours.tmp"
    other.write_text("not our name\n")
    ran = run_train("--out", run, "--resume", "auto", "--max-steps", 3, *FAST, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert not torn.exists()
    assert link.is_symlink() and victim.read_text() == "keep\n"
    assert other.read_text() == "not our name\n"


def test_resume_auto_after_a_kill_before_the_first_checkpoint_starts_from_scratch(
        trained, tiny_dataset, tmp_path):
    """A job killed before its first checkpoint leaves config.yaml and metrics.jsonl (and
    TensorBoard's file); the same requeue command used to be refused there."""
    run = _copy(trained, tmp_path / "run")
    for name in os.listdir(run):
        if name not in ("config.yaml", "metrics.jsonl"):
            os.unlink(run / name)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"kind": "step", "epoch": 0, "st')  # torn by the kill
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out.tfevents.1.host.0123").write_bytes(b"\0old")
    # The job's command, as it first ran (a new run takes its settings from the flags).
    ran = run_train("--data", tiny_dataset, "--out", run, "--resume", "auto", "--max-steps", 3,
                    *ARGS, *FAST, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (f"resume: False: auto: no checkpoint in {run} (killed before the first one): "
            "starting from scratch") in ran.stdout
    assert _steps(run) == [1, 2, 3]  # the killed run's lines are gone, not appended to
    assert not (run / "tensorboard").exists()
    assert (run / "checkpoint.pt").is_file()


# ---------------------------------------------------------------------------- prepare-dataset

@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return write_shapes_imagefolder(tmp_path_factory.mktemp("photos"), train_per_class=2,
                                    val_per_class=0, size=(24, 24))


def _prepare(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "turbotrain", "prepare-dataset",
                           *map(str, args), "--workers", "1"], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def _one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_a_second_prepare_into_one_out_is_refused_naming_the_first(photos, tmp_path):
    out = tmp_path / "new" / "ds"
    out.parent.mkdir()
    with folder_lock.held(tmp_path / "new" / ".ds.lock"):
        line = _one_line(_prepare(photos, out))
    assert line == (f"prepare-dataset: error: OUT {out} is in use by another prepare-dataset "
                    f"(pid {os.getpid()}); wait for it or choose another OUT")
    assert sorted(os.listdir(tmp_path / "new")) == []
    assert _prepare(photos, out).returncode == 0
    assert sorted(os.listdir(tmp_path / "new")) == ["ds"]  # no lock file left beside it


def test_a_refused_prepare_leaves_no_folder_for_its_lock(tmp_path):
    """The lock file goes beside OUT, so OUT's missing parents are made first; a prepare
    refused then removes them again."""
    _one_line(_prepare(tmp_path / "no-such-source", tmp_path / "a" / "b" / "ds"))
    assert os.listdir(tmp_path) == []


def test_parts_lock_only_their_own_part(photos, tmp_path):
    """Parts of one conversion are written into one OUT at once by design; the same part
    twice is refused."""
    out = tmp_path / "parts"
    with folder_lock.held(tmp_path / ".parts.part-00000-of-00002.lock"):
        assert _prepare(photos, out, "--shard-size", "8MiB", "--part", "1/2").returncode == 0
        line = _one_line(_prepare(photos, out, "--shard-size", "8MiB", "--part", "0/2"))
    assert line == (f"prepare-dataset: error: part 0/2 of OUT {out} is in use by another "
                    f"prepare-dataset (pid {os.getpid()}); wait for it or choose another OUT")
    assert os.listdir(out / "parts") == ["part-00001-of-00002.json"]


def test_an_out_that_appeared_meanwhile_is_not_replaced_without_overwrite(tmp_path):
    """The last check before the rename: OUT made by someone else while this prepare ran."""
    partial, out = tmp_path / ".ds.partial-1", tmp_path / "ds"
    partial.mkdir()
    (partial / "dataset.json").write_text("{}")
    out.mkdir()
    (out / "dataset.json").write_text('{"theirs": 1}')
    with pytest.raises(OutputFolderError, match="already exists .*pass --overwrite"):
        install(partial, out, False)
    assert (out / "dataset.json").read_text() == '{"theirs": 1}'


@pytest.mark.parametrize("kind", ["symlink", "hard link"])
def test_a_link_planted_as_the_lock_file_is_refused_not_written(tmp_path, kind):
    """The holder writes its pid into the lock file: through a link that would be someone
    else's file."""
    run, victim = tmp_path / "run", tmp_path / "bashrc"
    run.mkdir()
    victim.write_text("export PATH\n")
    (run / ".lock").symlink_to(victim) if kind == "symlink" else os.link(victim, run / ".lock")
    config = TrainConfig(data=str(tmp_path / "ds"), model="compact28", out=str(run))
    with pytest.raises(TrainError, match=f"^--out {run}: cannot use {run / '.lock'} as its lock "
                       "file .*; remove it, or choose another --out$"):
        run_folder._choose_run_dir(config, False, tmp_path)
    assert victim.read_text() == "export PATH\n"
