"""TensorBoard scalars (`train --tensorboard`), written through a descriptor of ours.

torch's SummaryWriter lets TensorBoard's file layer write `RUN/tensorboard/events.out...` by
name: it opens that name again, to append, at every flush. Whoever can write into the
run folder sees that name and can put a link there, and the next flush appends to the file it
points to. So the event file is created here like every other file we write
(`safe_create.new_unique_file`: O_CREAT | O_EXCL | O_NOFOLLOW, a fresh random name) and written
through that one descriptor; TensorBoard's own `RecordWriter` frames the records (its TFRecord
format with CRCs), so TensorBoard reads them as it reads its own. Each record is flushed as it
is written: a run killed mid-way keeps every scalar it logged (a record is ~50 bytes, logged
every --log-every steps: the flush costs nothing next to a step).
"""
from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

from turbotrain.files.safe_create import new_unique_file, real_folder

FOLDER = "tensorboard"


class TensorBoardUnavailable(Exception):
    """One line saying why the run writes metrics.jsonl only."""


class EventFile:
    """One new event file in RUN/tensorboard; `add_scalar`, then `close`."""

    def __init__(self, run_dir: str | os.PathLike):
        try:
            # lazy: tensorboard is optional (the tensorboard extra) and loads only with the flag
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import Summary
            from tensorboard.summary.writer.record_writer import RecordWriter
        except ImportError:
            raise TensorBoardUnavailable("tensorboard is not installed (pip install "
                                         "'turbotrain[tensorboard]')") from None
        self._event, self._summary = Event, Summary
        folder = _real_folder(Path(run_dir) / FOLDER)
        host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:64] or "host"
        self._file, self.path = new_unique_file(
            folder, f"events.out.tfevents.{int(time.time()):010d}.{host}.")
        self._records = RecordWriter(self._file)
        self._write(Event(wall_time=time.time(), file_version="brain.Event:2"))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=float(value))])
        self._write(self._event(wall_time=time.time(), step=int(step), summary=summary))

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def _write(self, event) -> None:
        self._records.write(event.SerializeToString())
        self._records.flush()


def _real_folder(folder: Path) -> Path:
    """RUN/tensorboard, made if missing; a link or anything else there is refused."""
    try:
        is_folder = real_folder(folder)
    except OSError as e:
        raise TensorBoardUnavailable(f"cannot create {folder} ({e.strerror or e})") from None
    if not is_folder:
        raise TensorBoardUnavailable(f"{folder} is not a folder (a symlink?); remove it")
    return folder
