"""The run folder: chosen and locked by rank 0 before anything is written in it.

One train at a time writes a run folder: rank 0 holds `RUN/.lock` (files/folder_lock.py) from
before config.yaml until the run ends, and a second train there is refused in one line naming
the holder. Whether the folder is new, empty or a run to continue is decided after taking the
lock, so two runs started at once cannot both pass. Under the lock, the temporaries of a
checkpoint whose writer was killed are removed, and `--resume auto` on a run killed before its
first checkpoint clears what that run wrote (plan/rules.py STARTED_NAMES) and starts again.

Nothing else is ever deleted: a new run takes a missing or empty folder (the automatic name gets
-2, -3, ... when taken), --resume continues the run in --out.
"""
from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from turbotrain import os_failure
from turbotrain.files import folder_lock
from turbotrain.files.untrusted import is_inside
from turbotrain.printable import printable

from ..config.config import TrainConfig
from ..errors import TrainError
from ..plan import rules
from ..records import checkpoint as ckpt
from ..step.distributed import DistEnv, broadcast_object

# The TensorBoard folder and the event files train writes in it (records/tensorboard_events.py).
_EVENTS_PREFIX = "events.out.tfevents."


def prepare_run_dir(config: TrainConfig, env: DistEnv, cleanup: contextlib.ExitStack, *,
                    auto: bool, default: Path) -> Path:
    """The run folder, created and locked (by rank 0; `cleanup` releases it). Rank 0 alone
    decides and every rank gets its answer, the folder or the one-line refusal, so all use the
    same folder or fail alike. auto: --resume auto decided config.resume (from a listing made
    before the lock, checked again under it); default: the folder when there is no --out."""
    outcome: tuple[str, str] = ("error", "")
    if env.is_main:
        try:
            run_dir, lock = _choose_run_dir(config, auto, default)
            cleanup.callback(folder_lock.release, lock, run_dir / rules.RUN_LOCK_NAME)
            outcome = ("folder", str(run_dir))
        except TrainError as exc:
            outcome = ("error", str(exc))
    kind, value = broadcast_object(outcome, env)
    if kind == "error":
        raise TrainError(value)
    return Path(value)


def _choose_run_dir(config: TrainConfig, auto: bool, default: Path) -> tuple[Path, int]:
    """(run folder, its lock's descriptor)."""
    if not config.out:
        run_dir = _create_numbered(default)
    else:
        run_dir = Path(config.out)
        if config.resume and not os.path.lexists(ckpt.checkpoint_path(run_dir)):
            # (no lock needed to say so: nothing removes a checkpoint)
            raise TrainError(f"--resume: no checkpoint in {run_dir} to continue from")
        if not config.resume:
            _make_folder(run_dir)
        # First without the lock, so that a refused run does not even touch the folder (its
        # mtime stays); what holds then holds later: nothing removes files from it but
        # another --resume auto, whose lock this run then finds.
        _check(run_dir, config, auto, clear=False)
    lock = _lock(run_dir)
    try:
        if config.out:
            _check(run_dir, config, auto, clear=True)
        ckpt.remove_temporaries(run_dir)
    except BaseException:
        folder_lock.release(lock, run_dir / rules.RUN_LOCK_NAME)
        raise
    return run_dir, lock


def _make_folder(run_dir: Path) -> None:
    """--out, made if missing; a folder already there (empty or not) is checked under the lock."""
    try:
        run_dir.mkdir(parents=True)
    except FileExistsError:
        if not run_dir.is_dir():
            raise TrainError(f"--out {run_dir} exists and is not a folder; choose another "
                             "--out") from None
    except OSError as exc:
        raise TrainError(f"--out {run_dir}: cannot create it ({exc.strerror})") from None


def _lock(run_dir: Path) -> int:
    path = run_dir / rules.RUN_LOCK_NAME
    try:
        return folder_lock.hold(path)
    except folder_lock.FolderBusy as busy:
        raise TrainError(f"run folder {run_dir} is in use by another train ({busy.holder}); "
                         "wait for it or choose another --out") from None
    except OSError as exc:
        if exc.errno in os_failure.WRITE_REFUSED:
            raise  # a full or read-only disk: os_failure names the file and what to do
        raise TrainError(f"--out {run_dir}: cannot use {printable(path)} as its lock file "
                         f"({exc.strerror or exc}); remove it, or choose another --out") from None


def _check(run_dir: Path, config: TrainConfig, auto: bool, *, clear: bool) -> None:
    """What --out holds (under the lock: now that no other train can change it): a checkpoint
    to continue, or nothing (a new run); with --resume auto also a run killed before its first
    checkpoint, whose files are removed (clear) so the new run does not append to them."""
    names = rules.run_names(_names(run_dir))
    if config.resume:
        _refuse_links_out_of(run_dir, names)
        return
    if auto and rules.CHECKPOINT_NAME in names:
        raise TrainError(f"--resume auto: {run_dir} got a checkpoint while this run was starting "
                         "(another train finished there); run the same command again to "
                         "continue it")
    if auto and rules.killed_before_checkpoint(names):
        if clear:
            _remove_started(run_dir, names)
        return
    if names:
        raise TrainError(f"--out {run_dir} is not empty (holds {_some_names(run_dir, names)})"
                         "; pass --resume to continue the run in it, or choose another --out")


def _names(run_dir: Path) -> list[str]:
    try:
        return sorted(os.listdir(run_dir))
    except OSError as exc:
        raise TrainError(f"--out {run_dir}: cannot list it ({exc.strerror})") from None


def _remove_started(run_dir: Path, names: list[str]) -> None:
    """Removes config.yaml, metrics.jsonl and TensorBoard's event files of the killed run
    (rules.STARTED_NAMES): a link under those names is removed itself, never followed."""
    try:
        for name in names:
            path = run_dir / name
            if name == "tensorboard" and stat.S_ISDIR(os.lstat(path).st_mode):
                for entry in os.scandir(path):
                    if entry.name.startswith(_EVENTS_PREFIX) and \
                            entry.is_file(follow_symlinks=False):
                        os.unlink(entry.path)
                with contextlib.suppress(OSError):  # something else in it: left as it is
                    path.rmdir()
            else:
                path.unlink()
    except OSError as exc:
        raise TrainError(f"--resume auto: cannot remove what the killed run left in {run_dir} "
                         f"({exc.strerror}: {printable(exc.filename or '')}); remove "
                         f"{', '.join(names)} yourself, or choose another --out") from None


def _create_numbered(base: Path, attempts: int = 1000) -> Path:
    """base, or base-2, base-3, ...: the first that did not exist. mkdir is atomic, so of two
    runs started in the same second (the name has a 1 s resolution), each gets its own."""
    for n in range(1, attempts + 1):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            continue
        except OSError as exc:
            raise TrainError(f"cannot create the run folder {path} ({exc.strerror}); choose "
                             "one with --out") from None
        return path
    raise TrainError(f"{base} and {attempts - 1} numbered variants already exist; choose a "
                     "run folder with --out")


def _some_names(folder: Path, names: list[str], shown: int = 3) -> str:
    listed = [printable(name) + ("/" if (folder / name).is_dir() else "")
              for name in names[:shown]]
    return ", ".join(listed + (["..."] if len(names) > shown else []))


def _refuse_links_out_of(run_dir: Path, names: list[str]) -> None:
    """--resume writes into a folder it did not necessarily create: a symlink there (say
    metrics.jsonl -> ~/.bashrc) would make it write outside the folder, so none may lead out."""
    for name in names:
        path = run_dir / name
        if path.is_symlink() and not is_inside(path, run_dir):
            raise TrainError(f"--resume: {run_dir / printable(name)} is a symlink to "
                             f"{printable(os.path.realpath(path))}, outside the run folder; "
                             "refusing to write through it")
