"""`train --out`: a new run takes a missing or empty folder and never deletes a file; an
automatic name that is taken gets -2, -3, ...; --resume never writes through a symlink that
leads out of the run folder. Under torchrun, rank 0 alone decides."""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

from turbotrain.files import folder_lock
from turbotrain.train.config.config import TrainConfig
from turbotrain.train.engine import run_folder
from turbotrain.train.errors import TrainError
from turbotrain.train.step.distributed import DistEnv

from .confined import changed, outside, tree_state
from .train_child import FAST, run_train


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under root with its content (None for a folder)."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
            for p in sorted(root.rglob("*"))}


# Each case's child has its own timeout; this one also covers a fixture's run.
pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("child_processes")]

# ---------------------------------------------------------------------------- CLI

def test_a_folder_that_holds_anything_is_refused_and_kept_byte_for_byte(tiny_dataset, tmp_path):
    work = tmp_path / "work"
    out = work / "results"
    (out / "tensorboard").mkdir(parents=True)
    (out / "notes.txt").write_text("my notes\n")
    (out / "tensorboard" / "x").write_bytes(b"\0events")
    (out / "summary.json").write_text('{"val_accuracy": 0.93}')
    kept = _tree(out)
    before = tree_state(work) | tree_state(tiny_dataset)
    ran = run_train("--data", tiny_dataset, "--out", out, "--epochs", 1, *FAST, cwd=work)
    assert ran.error_line("train: error: ") == (
        f"train: error: --out {out} is not empty (holds notes.txt, summary.json, tensorboard/); "
        "pass --resume to continue the run in it, or choose another --out")
    assert _tree(out) == kept
    assert not changed(before, tree_state(work) | tree_state(tiny_dataset))


def test_an_automatic_name_already_taken_gets_a_number(tiny_dataset, tmp_path):
    # Every name the run could pick in the next minute is taken (and holds a file), so the run
    # must add -2 to whichever it picks, leaving the taken one as it was.
    work = tmp_path / "work"
    now = time.time()
    for second in range(-1, 60):
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now + second))
        taken = work / "runs" / f"{tiny_dataset.name}-compact28-{stamp}"
        taken.mkdir(parents=True)
        (taken / "summary.json").write_text("{}")
    before = tree_state(work) | tree_state(tiny_dataset)
    ran = run_train("--data", tiny_dataset, "--model", "compact28", "--epochs", 1, "--max-steps", 1,
                    "--batch-size", 16, *FAST, cwd=work, timeout=120)
    assert ran.returncode == 0, ran.stderr[-3000:]
    run_dir = Path(ran.stdout.rsplit("results in ", 1)[1].strip())
    assert run_dir.name.endswith("-2") and run_dir.parent == Path("runs"), run_dir
    assert (work / run_dir.parent / run_dir.name[:-2]).is_dir()
    assert (work / run_dir / "summary.json").is_file()
    # Creating the run folder updates the mtime of runs/ itself, and nothing else changes.
    assert outside(changed(before, tree_state(work) | tree_state(tiny_dataset)), work / run_dir) \
        == {str(work / "runs")}


def test_resume_refuses_a_symlink_that_leads_out_of_the_run_folder(tiny_dataset, tmp_path):
    work = tmp_path / "work"
    run_dir = work / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(f"data: {tiny_dataset}\nepochs: 1\n")
    (run_dir / "checkpoint.pt").write_bytes(b"any")
    victim = work / "bashrc"
    victim.write_text("export PATH\n")
    (run_dir / "metrics.jsonl").symlink_to(victim)
    before = tree_state(work) | tree_state(tiny_dataset)
    ran = run_train("--out", run_dir, "--resume", *FAST, cwd=work)
    assert ran.error_line("train: error: ") == (
        f"train: error: --resume: {run_dir / 'metrics.jsonl'} is a symlink to {victim}, outside "
        "the run folder; refusing to write through it")
    assert not changed(before, tree_state(work) | tree_state(tiny_dataset))
    assert victim.read_text() == "export PATH\n"


# ---------------------------------------------------------------------------- in process

def _config(tmp_path, **changes) -> TrainConfig:
    return TrainConfig(data=str(tmp_path / "ds"), model="compact28", **changes)


def _choose(config: TrainConfig) -> Path:
    """The folder a new run takes (its lock released at once)."""
    run_dir, lock = run_folder._choose_run_dir(config, False, Path("unused"))
    folder_lock.release(lock, run_dir / ".lock")
    return run_dir


def test_a_missing_or_empty_folder_is_used(tmp_path):
    assert _choose(_config(tmp_path, out=str(tmp_path / "a" / "b"))) \
        == tmp_path / "a" / "b"
    assert (tmp_path / "a" / "b").is_dir()
    (tmp_path / "empty").mkdir()
    assert _choose(_config(tmp_path, out=str(tmp_path / "empty"))) \
        == tmp_path / "empty"


def test_the_refusal_lists_a_few_names_printably(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("a.txt", "b", "c\x1b[2J", "d"):
        (out / name).write_text("")
    with pytest.raises(TrainError) as exc:
        _choose(_config(tmp_path, out=str(out)))
    assert f"--out {out} is not empty (holds a.txt, b, c\\x1b[2J, ...);" in str(exc.value)
    assert sorted(os.listdir(out)) == ["a.txt", "b", "c\x1b[2J", "d"]


def test_a_file_is_not_a_run_folder(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(TrainError, match="exists and is not a folder"):
        _choose(_config(tmp_path, out=str(tmp_path / "f")))
    assert (tmp_path / "f").read_text() == "x"


def test_numbered_names_never_collide(tmp_path):
    base = tmp_path / "runs" / "ds-m-20250101-000000"
    made = [run_folder._create_numbered(base) for _ in range(3)]
    assert [p.name for p in made] == [base.name, f"{base.name}-2", f"{base.name}-3"]


def test_only_rank_0_decides_and_every_rank_gets_its_answer(tmp_path, monkeypatch):
    sent = []

    def broadcast(value, env):
        sent.append((env.rank, value))
        return ("error", "rank 0's line") if env.rank else value

    def chosen(config, auto, default):
        return tmp_path, folder_lock.hold(tmp_path / ".lock")

    monkeypatch.setattr(run_folder, "broadcast_object", broadcast)
    monkeypatch.setattr(run_folder, "_choose_run_dir",
                        lambda *args: pytest.fail("a rank other than 0 decided"))
    with pytest.raises(TrainError, match="^rank 0's line$"), contextlib.ExitStack() as cleanup:
        run_folder.prepare_run_dir(_config(tmp_path), DistEnv(rank=1, world_size=2), cleanup,
                                   auto=False, default=tmp_path)
    monkeypatch.setattr(run_folder, "_choose_run_dir", chosen)
    with contextlib.ExitStack() as cleanup:
        assert run_folder.prepare_run_dir(_config(tmp_path), DistEnv(rank=0, world_size=2),
                                          cleanup, auto=False, default=tmp_path) == tmp_path
        assert (tmp_path / ".lock").is_file()  # held by rank 0 until the run ends
    assert not (tmp_path / ".lock").exists()
    assert sent[-1] == (0, ("folder", str(tmp_path)))
