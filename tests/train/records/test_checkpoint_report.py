"""Atomic checkpoints, RNG capture, metrics truncation on resume, and curves.png."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from turbotrain.train.errors import TrainError
from turbotrain.train.records import checkpoint as ckpt
from turbotrain.train.records.report import MetricsLog, plot_curves, read_metrics


def test_atomic_save_replaces_and_leaves_no_temp_file(tmp_path):
    path = ckpt.checkpoint_path(tmp_path)
    ckpt.save_atomic({"x": 1}, path)
    ckpt.save_atomic({"x": 2}, path)
    assert torch.load(path, weights_only=True)["x"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path):
    path = ckpt.checkpoint_path(tmp_path)
    ckpt.save_atomic({"x": 1}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        ckpt.save_atomic({"x": Unpicklable()}, path)
    assert torch.load(path, weights_only=True)["x"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_damaged_or_missing_checkpoint_is_a_one_line_error(tmp_path):
    with pytest.raises(TrainError, match="no checkpoint"):
        ckpt.load_checkpoint(tmp_path)
    ckpt.checkpoint_path(tmp_path).write_bytes(b"not a checkpoint")
    with pytest.raises(TrainError, match="is damaged or not a turbotrain checkpoint"):
        ckpt.load_checkpoint(tmp_path)


def test_rng_round_trip():
    ckpt.seed_everything(1)
    state = ckpt.capture_rng()
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    ckpt.restore_rng(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_metrics_truncate_after_checkpoint(tmp_path):
    log = MetricsLog(tmp_path)
    for step in range(1, 7):
        log.write({"kind": "step", "step": step, "loss": 1.0 / step, "epoch": 0})
        if step == 3:
            log.write({"kind": "epoch", "epoch": 0, "step": 3, "val_loss": 0.5})
    log.write({"kind": "epoch", "epoch": 1, "step": 6, "val_loss": float("nan")})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"kind": "step", "st')  # torn by kill -9
    log.truncate_after(step=4, epochs_done=1)
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records if r["kind"] == "step"] == [1, 2, 3, 4]
    assert [r["epoch"] for r in records if r["kind"] == "epoch"] == [0]


def test_nan_is_written_as_null_and_curves_are_drawn(tmp_path):
    log = MetricsLog(tmp_path)
    for step in range(1, 5):
        log.write({"kind": "step", "step": step, "loss": float("nan") if step == 2 else 1.0,
                   "epoch": 0, "epoch_float": step / 4, "time": float(step)})
    log.write({"kind": "epoch", "epoch": 0, "epoch_float": 1.0, "step": 4, "time": 4.0,
               "val_loss": 0.7, "val_accuracy": 0.6})
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[1])["loss"] is None
    path = plot_curves(tmp_path)
    assert path.is_file() and path.stat().st_size > 1000


@pytest.mark.parametrize("with_val", [True, False])
def test_curves_without_a_val_split_draw_no_empty_accuracy_panels(tmp_path, monkeypatch,
                                                                 with_val):
    """A run without val has no accuracy to draw: curves.png is the loss row only, titled so,
    instead of two empty accuracy panels under it."""
    from turbotrain.train.records import report
    log = MetricsLog(tmp_path)
    for step in range(1, 5):
        log.write({"kind": "step", "step": step, "loss": 1.0 / step, "epoch": 0,
                   "epoch_float": step / 4, "time": float(step)})
    val = {"val_loss": 0.7, "val_accuracy": 0.6} if with_val else {}
    log.write({"kind": "epoch", "epoch": 0, "epoch_float": 1.0, "step": 4, "time": 4.0, **val})
    drawn = {}
    save = report.save_figure

    def keep(fig, path, **kwargs):
        drawn["labels"] = [ax.get_ylabel() for ax in fig.axes]
        drawn["title"] = fig._suptitle.get_text() if fig._suptitle else ""
        return save(fig, path, **kwargs)
    monkeypatch.setattr(report, "save_figure", keep)
    assert plot_curves(tmp_path).is_file()
    if with_val:
        assert drawn["labels"] == ["loss", "loss", "accuracy", "accuracy"]
        assert drawn["title"] == ""
    else:
        assert drawn["labels"] == ["loss", "loss"]
        assert drawn["title"] == "train loss only: the run had no val split to measure " \
                                 "accuracy on"


@pytest.mark.parametrize("logged, marker", [(1, "o"), (40, "None")])
def test_a_short_run_s_train_loss_is_drawn_as_points(tmp_path, monkeypatch, logged, marker):
    """A 3-step run logs one step: a line through one point is invisible, so curves.png was an
    empty frame under a "train loss" legend; a few points are marked, many are a plain line."""
    from turbotrain.train.records import report
    log = MetricsLog(tmp_path)
    for step in range(1, logged + 1):
        log.write({"kind": "step", "step": step, "loss": 1.0 / step, "epoch": 0,
                   "epoch_float": step / logged, "time": float(step)})
    drawn = {}
    save = report.save_figure

    def keep(fig, path, **kwargs):
        drawn["markers"] = [line.get_marker() for ax in fig.axes for line in ax.get_lines()]
        return save(fig, path, **kwargs)
    monkeypatch.setattr(report, "save_figure", keep)
    assert plot_curves(tmp_path).is_file()
    assert drawn["markers"] == [marker, marker]


def test_curves_draw_where_a_target_or_budget_stopped_the_run(tmp_path, monkeypatch):
    """A `stop` record (--target-accuracy, --time-budget) is a labelled vertical line on every
    panel, at its wall time on the left and its epoch on the right."""
    from turbotrain.train.records import report
    log = MetricsLog(tmp_path)
    for step in range(1, 9):
        log.write({"kind": "step", "step": step, "loss": 1.0 / step, "epoch": step // 5,
                   "epoch_float": step / 4, "time": float(step)})
    log.write({"kind": "epoch", "epoch": 0, "epoch_float": 1.0, "step": 4, "time": 4.0,
               "val_loss": 0.7, "val_accuracy": 0.6})
    log.write({"kind": "stop", "reason": "target_accuracy", "step": 6, "epoch_float": 1.5,
               "time": 6.5})
    drawn = {}
    save = report.save_figure

    def keep(fig, path, **kwargs):
        drawn["stops"] = [[(line.get_xdata()[0], line.get_label()) for line in ax.get_lines()
                           if line.get_label().startswith("stopped")] for ax in fig.axes]
        return save(fig, path, **kwargs)
    monkeypatch.setattr(report, "save_figure", keep)
    assert plot_curves(tmp_path).is_file()
    by_time, by_epoch = [(6.5, "stopped: target accuracy")], [(1.5, "stopped: target accuracy")]
    assert drawn["stops"] == [by_time, by_epoch, by_time, by_epoch]  # loss row, accuracy row


def test_smoothed_loss_floor_is_the_entropy_of_the_smoothed_targets():
    from turbotrain.train.records.report import smoothed_loss_floor
    assert smoothed_loss_floor(0.1, 10) == pytest.approx(0.5003, abs=1e-4)
    assert smoothed_loss_floor(0.0, 10) == 0.0
    # The cross-entropy of the smoothed targets against themselves, as torch computes it.
    targets = torch.full((1, 7), 0.2 / 7)
    targets[0, 3] += 0.8
    assert smoothed_loss_floor(0.2, 7) == pytest.approx(
        float(torch.nn.functional.cross_entropy(targets.log(), targets)), rel=1e-5)


@pytest.mark.parametrize("smoothing", [0.1, 0.0])
def test_curves_say_the_train_loss_is_smoothed_and_draw_train_accuracy(tmp_path, monkeypatch,
                                                                       smoothing):
    """Issue 46: curves.png showed a label-smoothed train loss above the val loss with no
    note, and no train accuracy. The title says so and the floor is drawn; train accuracy
    (per log window) is on the accuracy panels beside the val accuracy."""
    from turbotrain.train.records import report
    log = MetricsLog(tmp_path)
    for step in range(1, 9):
        log.write({"kind": "step", "step": step, "loss": 1.0 / step, "epoch": step // 5,
                   "epoch_float": step / 4, "time": float(step), "train_accuracy": step / 10})
    log.write({"kind": "epoch", "epoch": 0, "epoch_float": 1.0, "step": 4, "time": 4.0,
               "val_loss": 0.3, "val_accuracy": 0.9, "train_accuracy": 0.25})
    drawn = {}
    save = report.save_figure

    def keep(fig, path, **kwargs):
        drawn["title"] = fig._suptitle.get_text() if fig._suptitle else ""
        drawn["labels"] = [[line.get_label() for line in ax.get_lines()] for ax in fig.axes]
        return save(fig, path, **kwargs)
    monkeypatch.setattr(report, "save_figure", keep)
    assert plot_curves(tmp_path, label_smoothing=smoothing, num_classes=10).is_file()
    accuracy = ["train accuracy (augmented batches)", "val accuracy"]
    if smoothing:
        assert drawn["title"].startswith("train loss on label-smoothed targets (0.1): it "
                                         "cannot go below 0.50")
        loss = ["train loss", "train loss floor (0.50, label smoothing)", "val loss"]
    else:
        assert drawn["title"] == ""
        loss = ["train loss", "val loss"]
    assert drawn["labels"] == [loss, loss, accuracy, accuracy]


class _Terminal:
    def __init__(self):
        self.text = ""

    def write(self, text):
        self.text += text

    def flush(self):
        pass

    def isatty(self):
        return True


def test_progress_is_a_bar_on_a_terminal_and_lines_otherwise():
    import io

    from turbotrain.train.records.progress import Progress
    update = dict(epoch=0, epochs=2, step=5, loss=0.5, images_per_second=1000.0,
                  data_wait_fraction=0.25, eta_seconds=65)
    terminal = _Terminal()
    bar = Progress(total_steps=10, stream=terminal)
    bar.update(**update)
    bar.close()
    assert bar.bar is None and "5/10" in terminal.text and "data-wait 25%" in terminal.text
    pipe = io.StringIO()
    lines = Progress(total_steps=10, stream=pipe)
    lines.update(**update)
    lines.update(**{**update, "step": 6, "images_per_second": None})
    assert pipe.getvalue().splitlines() == [
        "epoch 1/2  step 5/10  loss 0.5000  1,000 img/s  data-wait 25%  ETA 1:05",
        "epoch 1/2  step 6/10  loss 0.5000  warming up  ETA 1:05"]
