"""`train --tensorboard` writes event files TensorBoard itself reads back, scalar for scalar,
through our own descriptor (turbotrain/train/records/tensorboard_events.py)."""
from __future__ import annotations

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from turbotrain.train.records import report
from turbotrain.train.records.tensorboard_events import EventFile


def _scalars(folder, tag):
    events = EventAccumulator(str(folder))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_tensorboard_reads_every_scalar_back(tmp_path):
    log = report.MetricsLog(tmp_path, tensorboard=True)
    for step in (1, 2, 3):
        log.write({"kind": "step", "epoch": 0, "step": step, "loss": 1.0 / step, "lr": 0.1})
    log.write({"kind": "epoch", "epoch": 0, "step": 3, "val_accuracy": 0.75})
    log.close()
    folder = tmp_path / "tensorboard"
    assert [(s, round(v, 6)) for s, v in _scalars(folder, "train/loss")] == [
        (1, 1.0), (2, 0.5), (3, round(1 / 3, 6))]
    assert _scalars(folder, "val/val_accuracy") == [(3, 0.75)]
    assert [(s, round(v, 6)) for s, v in _scalars(folder, "train/lr")] == [
        (1, 0.1), (2, 0.1), (3, 0.1)]
    assert [p.name for p in folder.iterdir()][0].startswith("events.out.tfevents.")


def test_each_scalar_is_on_disk_before_the_next_step(tmp_path):
    """Flushed as written: a run killed mid-way (no close) keeps what it logged."""
    events = EventFile(tmp_path)
    events.add_scalar("train/loss", 2.5, 7)
    assert _scalars(tmp_path / "tensorboard", "train/loss") == [(7, 2.5)]
    events.close()


def test_without_tensorboard_the_run_says_so_and_writes_metrics_only(tmp_path, monkeypatch,
                                                                     capsys):
    import sys
    monkeypatch.setitem(sys.modules, "tensorboard.summary.writer.record_writer", None)
    log = report.MetricsLog(tmp_path, tensorboard=True)
    assert log.writer is None
    assert "tensorboard is not installed (pip install 'turbotrain[tensorboard]'); writing " \
           "metrics.jsonl only" in capsys.readouterr().out
    log.write({"kind": "step", "epoch": 0, "step": 1, "loss": 1.0})
    assert (tmp_path / "metrics.jsonl").is_file() and not (tmp_path / "tensorboard").exists()


@pytest.mark.parametrize("planted", ["a link to a folder", "a file"])
def test_a_tensorboard_name_that_is_not_a_folder_is_refused(tmp_path, planted, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    if planted == "a file":
        (run / "tensorboard").write_text("x")
    else:
        (run / "tensorboard").symlink_to(elsewhere)
    log = report.MetricsLog(run, tensorboard=True)
    assert log.writer is None
    assert "tensorboard is not a folder (a symlink?); remove it; writing metrics.jsonl only" \
        in capsys.readouterr().out
    assert list(elsewhere.iterdir()) == []
