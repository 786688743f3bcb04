"""Atomic checkpoints, RNG state capture, and a SIGTERM/SIGINT handler that asks for one.

A checkpoint is written to a temporary file in the run folder, fsynced, then renamed over
`checkpoint.pt`: a crash (even `kill -9`) mid-write leaves the previous checkpoint intact, never
a torn one. The folder is fsynced too, so the rename itself survives a power cut.
"""
from __future__ import annotations

import os
import pickle
import random
import signal
import threading
from pathlib import Path

import numpy as np
import torch

from .errors import TrainError

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1  # bump when the checkpoint's keys change meaning


def checkpoint_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / CHECKPOINT_NAME


def save_atomic(state: dict, path: str | os.PathLike) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save({"format_version": FORMAT_VERSION, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(run_dir: str | os.PathLike) -> dict:
    path = checkpoint_path(run_dir)
    if not path.is_file():
        raise TrainError(f"--resume: no checkpoint in {run_dir} (expected {CHECKPOINT_NAME})")
    try:
        # weights_only=False: the state holds Python RNG state and plain dicts we wrote ourselves.
        state = torch.load(path, map_location="cpu", weights_only=False)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as exc:
        raise TrainError(f"--resume: cannot read {path}: {type(exc).__name__}: {exc}") from None
    if state.get("format_version") != FORMAT_VERSION:
        raise TrainError(f"--resume: {path} has checkpoint format "
                         f"{state.get('format_version')}, this trainer reads {FORMAT_VERSION}")
    return state


# ---------------------------------------------------------------------------- RNG

def capture_rng() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # This rank's own GPU only: get_rng_state_all() visits every GPU of the node, creating
        # a CUDA context (~0.5 GB) on each from each rank: 64 of them on an 8-GPU node.
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if isinstance(cuda, list):  # written before per-rank capture: one state per GPU
            cuda = cuda[min(torch.cuda.current_device(), len(cuda) - 1)]
        torch.cuda.set_rng_state(cuda)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ---------------------------------------------------------------------------- signals

class StopRequest:
    """Turns the first SIGTERM/SIGINT into a flag the loop polls after each optimizer step (it
    then checkpoints and exits); a second one interrupts at once, for a user who insists."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame):
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    @property
    def requested(self) -> bool:
        return self.signum is not None
