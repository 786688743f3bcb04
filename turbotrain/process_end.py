"""How a turbotrain process ends: every command line, and the download process of a fork.

obstore (`--data s3://...`, `http(s)://`) runs its requests on a process-wide tokio runtime
(pyo3-async-runtimes) that is never shut down. Its worker threads go on while the interpreter
finalizes, and when one touches interpreter state that is being torn down the process dies:
SIGABRT (134), or a signal with nothing on stderr, after the command had finished and printed
its last line. On this 2-core box, beside one busy core, 14 of 60 processes that had read one
range aborted so, 19 of 60 after a body was cut off (`tests/test_process_end.py` repeats it); a
script or scheduler then sees a crash where the run succeeded, and a fork's download process
that crashed so lost a good download.

So a process whose obstore runtime ran ends as Python would, up to the point where it would
finalize: its non-daemon threads are joined, its atexit functions run, stdout and stderr are
flushed; then `os._exit(status)`, which leaves the runtime's threads no interpreter to race
with. A process that never used obstore ends with the usual `sys.exit`.

A reader that goes away (`turbotrain inspect OUT | head`: head exits after 10 lines) makes the
next write to stdout fail with EPIPE; a Unix tool dies of SIGPIPE there, silently, and the shell
reports 141. Python ignores SIGPIPE (a socket write must not kill the process: `--data s3://`),
so a BrokenPipeError reached the top as a traceback, or `predict` reported "Broken pipe". Here
it ends the process quietly with status 141, when stdout is what broke (`stdout_reader_gone`);
a broken socket is still an error.

Only process entry points call `run_as_process` (`python -m turbotrain`, the console scripts,
`python -m turbotrain.datasets.remote.object_store`): `cli.main` stays an ordinary function
for code and tests that call it in-process.
"""
from __future__ import annotations

import atexit
import os
import select
import signal
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

_STORE_MODULE = "turbotrain.datasets.remote.object_store"
READER_GONE_STATUS = 128 + signal.SIGPIPE  # 141: what a shell shows for `yes | head -1`


def run_as_process(function: Callable[..., object], *args) -> NoReturn:
    """Runs function(*args) as this process's whole work and exits with its status (its
    return value or SystemExit's code, read as `sys.exit` reads it)."""
    try:
        code = function(*args)
        sys.stdout.flush()  # the last lines: a reader that left shows here, not at exit
    except SystemExit as e:
        code = e.code
    except BrokenPipeError:
        if not stdout_reader_gone():
            raise
        code = READER_GONE_STATUS
    if stdout_reader_gone():  # nothing more can reach it: no "Exception ignored" at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    status = exit_status(code)
    if obstore_ran_here():
        exit_before_finalizing(status)
    sys.exit(status)


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe or socket whose reading end was closed (poll says POLLERR)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)  # POLLERR and POLLHUP are always reported
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # closed, replaced, not a real file
        return False


def exit_status(code: object) -> int:
    """The status `sys.exit(code)` ends with: None is 0, an int itself, anything else is
    printed to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def obstore_ran_here() -> bool:
    """Whether this process (not a parent it was forked from) started obstore's runtime. The
    module is looked up, not imported: a command that never read a URL never loaded it."""
    store = sys.modules.get(_STORE_MODULE)
    return store is not None and store.runtime_started_here()


def exit_before_finalizing(status: int) -> NoReturn:
    """What Py_FinalizeEx does before it tears the interpreter down, then _exit."""
    threading._shutdown()  # joins the non-daemon threads, as the interpreter's exit would
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed, or replaced by None
            pass
    os._exit(status)
