"""One line for a DataLoader worker process that died (the `pytorch` pipeline's processes mode).

torch reports a dead worker two ways, both as a bare RuntimeError the user cannot act on: its
SIGCHLD handler raises "DataLoader worker (pid N) is killed by signal: Killed." wherever the main
thread happens to be (an optimizer step, a checkpoint write), and its queue read raises "exited
unexpectedly" (or the shared-memory hand-over a ConnectionResetError) a few seconds later. Both
become a `PipelineError` naming the worker, its pid and how it ended, which `train` prints as one
line: SIGKILL nearly always is the kernel's OOM killer, so the line says so.
"""
from __future__ import annotations

import os
import signal
import threading
import time
import weakref
from typing import Callable, Iterable

from turbotrain.datasets.beton import map_guard

from .base import PipelineError

# Why a worker gets each signal, where there is a usual cause the user can act on.
_CAUSES = {
    signal.SIGKILL: "the usual cause is running out of memory: the kernel's OOM killer ends "
                    "the largest process (see `dmesg`); use fewer --workers, a smaller "
                    "--batch-size, or --worker-mode threads",
    signal.SIGSEGV: "a crash in native code (a decoder or an extension): rerun with "
                    "--worker-mode threads to see where",
    signal.SIGBUS: "a memory-mapped file was truncated or is on a failing disk",
}

# The live worker sets to look through when a child ends: each a callable returning the
# DataLoader's worker processes (multiprocessing.Process) in worker-id order.
# How long a broken hand-over waits for a worker's end to become visible (it takes
# microseconds; the bound only keeps an unrelated error from waiting long).
DEATH_VISIBLE_S = 2.0

_SOURCES: "weakref.WeakSet" = weakref.WeakSet()
_installed = False


def describe(worker_id: int, pid: int, *, signum: int | None = None,
             code: int | None = None) -> str:
    """The one line for worker `worker_id` (pid `pid`) ended by `signum` or exit `code`."""
    if signum is not None:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        cause = _CAUSES.get(signum, "something outside the run sent it")
        return (f"pipeline worker {worker_id} (pid {pid}) was killed by {name} "
                f"(signal {signum}; {cause})")
    return (f"pipeline worker {worker_id} (pid {pid}) exited with code {code} while the run "
            "still needed it (see the messages above; rerun with --worker-mode threads to see "
            "the error in this process)")


def _ended(pid: int, exitcode: int | None) -> tuple[int | None, int | None] | None:
    """(signal, exit code) of child `pid` if it has ended, else None; never reaps it (WNOWAIT),
    so torch and multiprocessing still see it."""
    if exitcode is not None:  # already reaped by multiprocessing
        return (-exitcode, None) if exitcode < 0 else (None, exitcode)
    try:
        status = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if status is None:
        return None
    if status.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return status.si_status, None
    return None, status.si_status


def dead_worker(processes: Iterable) -> str | None:
    """The line for the first ended process of `processes` (worker-id order), else None."""
    for worker_id, process in enumerate(processes):
        pid = getattr(process, "pid", None)
        if pid is None:
            continue
        ended = _ended(pid, getattr(process, "_popen", None) and process._popen.returncode)
        if ended is not None:
            signum, code = ended
            # A worker that read past the end of a dataset file that shrank (the map guard's
            # quiet exit, or SIGBUS where it is not built): the file is the news, not the worker.
            if code == map_guard.QUIET_EXIT or signum == signal.SIGBUS:
                shrunk = map_guard.shrunk_problem()
                if shrunk is not None:
                    return shrunk
            return describe(worker_id, pid, signum=signum, code=code)
    return None


def _any_dead() -> str | None:
    for source in list(_SOURCES):
        message = dead_worker(source.worker_processes())
        if message is not None:
            return message
    return None


def watch(source) -> None:
    """Registers `source` (has `worker_processes()`) and, once per process, wraps the SIGCHLD
    handler torch installed when the first worker started so a worker's death raises our
    `PipelineError` instead of torch's RuntimeError. Only the main thread may set a handler
    (torch's rule too); elsewhere the queue-read path (`as_pipeline_error`) still applies."""
    global _installed
    _SOURCES.add(source)
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGCHLD)
    if not callable(previous):
        return  # torch set no handler (not the main thread when its iterator started)

    def handler(signum, frame) -> None:
        try:
            previous(signum, frame)
        except PipelineError:
            raise
        except RuntimeError as exc:
            raise PipelineError(_any_dead() or str(exc)) from None

    signal.signal(signal.SIGCHLD, handler)
    _installed = True


def as_pipeline_error(exc: BaseException, processes: Callable[[], Iterable]) -> PipelineError | None:
    """The `PipelineError` for `exc` raised by torch's queue read because a worker died, or None
    when no worker has ended (then `exc` is not ours to translate)."""
    if isinstance(exc, PipelineError):
        return exc
    # A killed worker's sockets close a moment before the kernel lets its parent see it ended,
    # so a ConnectionResetError can come first: look again for a short, bounded while.
    deadline = time.monotonic() + DEATH_VISIBLE_S
    while True:
        message = dead_worker(processes())
        if message is not None:
            return PipelineError(message)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)
