"""Atomic checkpoints, RNG state capture, and a SIGTERM/SIGINT handler that asks for one.

A checkpoint is written to a temporary file in the run folder, fsynced, then renamed over
`checkpoint.pt`: a crash (even `kill -9`) mid-write leaves the previous checkpoint intact, never
a torn one. The folder is fsynced too, so the rename itself survives a power cut.

A checkpoint is not trusted (docs/SECURITY.md): a pickle can call any function while it loads,
so `--resume` reads it with `torch.load(weights_only=True)`, which builds tensors, containers and
numbers only. Nothing else is needed: the numpy RNG state is saved as a tensor, and checkpoints
written before that (a numpy array) load through an allow-list of the numpy array names,
given for that one load only (never process-wide).
The file must be a regular file (a named pipe would block the read forever) and a zip whose
entries are stored, not compressed (torch.save writes them so; a deflated entry could inflate a
small file to any size). What loads is then checked against the keys and types the trainer
reads; anything wrong is one line naming the file, never a traceback.
"""
from __future__ import annotations

import os
import pickle
import random
import re
import signal
import threading
import zipfile
from pathlib import Path

import numpy as np
import torch

from turbotrain.files.safe_create import replacing
from turbotrain.files.untrusted import UnsafeInput, open_regular

from ..errors import TrainError
# The name --resume auto looks for, and the temporary names a checkpoint is written under.
from ..plan.rules import CHECKPOINT_NAME, is_checkpoint_temporary

FORMAT_VERSION = 1  # bump when the checkpoint's keys change meaning

# What the trainer reads from a checkpoint, and the type each must have. "ema" is None for a run
# without --ema; "world_size" is missing from checkpoints written before it was recorded, and
# "timing" (the step-timing ledger, ledger.py) from those written before it existed: their
# "counters" hold its sums. Checkpoints written before the LR became a function of the step
# (schedule.lr_at) also hold a "scheduler" entry, which is not read: they resume as they are.
_TOP_LEVEL = {"format_version": int, "model": dict, "optimizer": dict, "scaler": dict,
              "ema": (dict, type(None)), "rng": dict, "pipeline": dict, "counters": dict,
              "timing": dict, "loss_window": torch.Tensor, "config": dict, "world_size": int,
              "timeline": dict, "classes": list}
# Entries a checkpoint written before them does not hold.
_OPTIONAL = {"ema", "world_size", "timing", "timeline", "classes"}

# Errors that restoring a damaged or foreign checkpoint's values raises (load_state_dict,
# Counters(**...), np.random.set_state, ...); callers turn them into `damaged(...)`.
RESTORE_ERRORS = (KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError,
                  OverflowError)

_MT19937_WORDS = 624  # numpy's legacy RNG: MT19937, 624 32-bit words of state


def checkpoint_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / CHECKPOINT_NAME


def save_atomic(state: dict, path: str | os.PathLike) -> None:
    path = Path(path)
    # A new file under a fresh name (nothing planted is followed or reused), renamed over path.
    with replacing(path, "wb", durable=True) as f:
        torch.save({"format_version": FORMAT_VERSION, **state}, f)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove_temporaries(run_dir: str | os.PathLike) -> list[str]:
    """Removes the temporary files of checkpoints whose writer was killed (kill -9, a node
    lost) in run_dir: a checkpoint's size each, left forever otherwise. Only files under the
    names save_atomic gives them, and only regular files: a link of that name is left alone.
    The caller holds the run folder's lock, so no checkpoint of another run is being written.
    Returns the names removed."""
    removed = []
    for entry in os.scandir(run_dir):
        if is_checkpoint_temporary(entry.name) and entry.is_file(follow_symlinks=False):
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                continue
            removed.append(entry.name)
    return removed


def damaged(path: str | os.PathLike, reason: str | BaseException) -> TrainError:
    """The one-line error for a checkpoint that loaded but cannot be used."""
    if isinstance(reason, BaseException):
        text = str(reason).strip().splitlines()
        reason = f"{type(reason).__name__}: {text[0] if text else ''}".rstrip(": ")
    if len(reason) > 200:
        reason = reason[:197] + "..."
    return TrainError(f"--resume: {path} is damaged or not a turbotrain checkpoint ({reason})")


def load_checkpoint(run_dir: str | os.PathLike) -> dict:
    """The state saved in RUNDIR/checkpoint.pt, checked; TrainError (one line) otherwise."""
    path = checkpoint_path(run_dir)
    try:
        f = open_regular(path)
    except FileNotFoundError:
        raise TrainError(f"--resume: no checkpoint in {run_dir} "
                         f"(expected {CHECKPOINT_NAME})") from None
    except UnsafeInput as exc:
        raise TrainError(f"--resume: {path} {exc}; refusing to read it") from None
    except OSError as exc:
        raise TrainError(f"--resume: cannot read {path}: {exc.strerror}") from None
    with f:
        _check_stored_zip(f, path)
        f.seek(0)
        try:
            with torch.serialization.safe_globals(_old_numpy_rng_globals()):
                state = torch.load(f, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            wanted = _forbidden_global(str(exc))
            if wanted is not None:
                raise TrainError(f"--resume: {path} asks to run code ({wanted}) when loaded; "
                                 "refusing it (checkpoints are loaded with weights_only=True)"
                                 ) from None
            raise damaged(path, _torch_reason(exc)) from None
        except (RuntimeError, EOFError, OSError, ValueError, TypeError, KeyError, IndexError,
                AttributeError, OverflowError, MemoryError) as exc:
            raise damaged(path, _torch_reason(exc)) from None
    check_state(state, path)
    return state


def check_state(state, path: str | os.PathLike) -> None:
    """The keys the trainer reads are there, with the right types; `damaged` otherwise."""
    if not isinstance(state, dict):
        raise damaged(path, f"it holds a {type(state).__name__}, not a dict")
    version = state.get("format_version")
    if type(version) is int and version != FORMAT_VERSION:
        raise TrainError(f"--resume: {path} has checkpoint format {version}, this trainer "
                         f"reads {FORMAT_VERSION}")
    for key, kind in _TOP_LEVEL.items():
        if key not in state:
            if key in _OPTIONAL:
                continue
            raise damaged(path, f"no {key!r} entry")
        value = state[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(
                k.__name__ for k in kind)
            raise damaged(path, f"{key!r} is a {type(value).__name__}, not a {names}")


def _check_stored_zip(f, path: Path) -> None:
    """torch.save writes a zip of stored entries; refuse anything else before torch reads it."""
    problem = stored_zip_problem(f)
    if problem is not None:
        raise damaged(path, problem)


def stored_zip_problem(f) -> str | None:
    """Why the open file `f` is not a zip of stored entries that fit in it, or None. Also used
    for `train --init-from FILE.pt` and `--pretrained`'s cached files."""
    try:
        with zipfile.ZipFile(f) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as exc:
        return f"not a torch.save zip file: {exc}"
    size = os.fstat(f.fileno()).st_size
    total = 0
    for entry in entries:
        if entry.compress_type != zipfile.ZIP_STORED or entry.file_size != entry.compress_size:
            return f"entry {entry.filename!r} is compressed; torch.save stores its entries " \
                   "uncompressed"
        total += entry.file_size
    if total > size:
        return f"its entries claim {total:,} bytes, more than the file's {size:,}"
    return None


def _old_numpy_rng_globals() -> list:
    """The numpy names that a checkpoint written before the RNG state became a tensor needs
    (`np.random.get_state()` pickled as a uint32 ndarray), and nothing else."""
    try:
        from numpy._core.multiarray import _reconstruct  # numpy 2
    except ImportError:
        from numpy.core.multiarray import _reconstruct  # numpy 1.x
    return [_reconstruct, (_reconstruct, "numpy.core.multiarray._reconstruct"),  # as pickled by 1.x
            (_reconstruct, "numpy._core.multiarray._reconstruct"),  # by 2.x
            np.ndarray, np.dtype, type(np.dtype(np.uint32))]


# torch's weights_only unpickler names the global it refused in one of these two ways.
_GLOBAL_REFUSED = re.compile(r"GLOBAL (\S+) (?:was not an allowed global|whose module)")


def _forbidden_global(message: str) -> str | None:
    """The function or class a refused pickle asked for, as the user knows it (os.system, not
    posix.system); None when the load failed for another reason."""
    found = _GLOBAL_REFUSED.search(message)
    if found is None:
        return None
    name = found.group(1)
    module, _, attribute = name.rpartition(".")
    return f"os.{attribute}" if module in ("posix", "nt") else name


def _torch_reason(exc: BaseException) -> str:
    """The informative line of a torch.load error (its wrapper adds paragraphs of advice)."""
    text = str(exc)
    found = re.search(r"WeightsUnpickler error:\s*(.+)", text)
    if found:
        return found.group(1).strip().splitlines()[0]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0].split(". ")[0] if lines else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


# ---------------------------------------------------------------------------- RNG

def capture_rng() -> dict:
    # numpy's state in np.random.get_state(legacy=False)'s layout with the 624-word key as an
    # int64 tensor: a checkpoint then holds only what weights_only=True loads (an ndarray would
    # need numpy's globals), and np.random.set_state still accepts it as it is.
    numpy_state = np.random.get_state(legacy=False)
    numpy_state["state"] = {"key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
                            "pos": int(numpy_state["state"]["pos"])}
    state = {"python": random.getstate(), "numpy": numpy_state,
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # This rank's own GPU only: get_rng_state_all() visits every GPU of the node, creating
        # a CUDA context (~0.5 GB) on each from each rank: 64 of them on an 8-GPU node.
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict) -> None:
    """Raises one of RESTORE_ERRORS for a state that is not one capture_rng wrote."""
    random.setstate(state["python"])
    np.random.set_state(_numpy_state(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if isinstance(cuda, list):  # written before per-rank capture: one state per GPU
            cuda = cuda[min(torch.cuda.current_device(), len(cuda) - 1)]
        torch.cuda.set_rng_state(cuda)


def _numpy_state(saved):
    """np.random.set_state's argument from a checkpoint: the dict capture_rng writes, or the
    (name, uint32 array, pos, has_gauss, gauss) tuple of older checkpoints."""
    if isinstance(saved, tuple):
        return saved
    if saved["bit_generator"] != "MT19937":
        raise ValueError(f"numpy RNG {saved['bit_generator']!r}, not MT19937")
    key, pos = saved["state"]["key"], saved["state"]["pos"]
    key = key.numpy() if isinstance(key, torch.Tensor) else np.asarray(key)
    if key.shape != (_MT19937_WORDS,) or key.dtype.kind not in "iu" \
            or key.min() < 0 or key.max() >= 2**32:
        raise ValueError(f"numpy RNG key of shape {key.shape} and type {key.dtype}, not "
                         f"{_MT19937_WORDS} 32-bit words")
    if not isinstance(pos, int) or not 0 <= pos <= _MT19937_WORDS:
        raise ValueError(f"numpy RNG position {pos!r}")
    return {"bit_generator": "MT19937", "state": {"key": key.astype(np.uint32), "pos": pos},
            "has_gauss": int(saved["has_gauss"]), "gauss": float(saved["gauss"])}


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
