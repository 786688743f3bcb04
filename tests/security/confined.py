"""Running a command the way an attacked user would, in a confined child, and seeing what it did.

Every security test checks the same things of a refused command: the exit code, exactly one
error line and no traceback, that it ended (a timeout is a hang), that its memory stayed under a
cap (RLIMIT_AS stops a runaway allocation; wait4's peak RSS shows what it touched), and which
files changed under a folder. Shared by every test module here: tests/security/train_child.py
adds what is specific to running `train`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str
    peak_rss: int  # bytes, from wait4's rusage of this child (and its reaped children)
    seconds: float

    def error_line(self, prefix: str) -> str:
        """The one stderr line of a refused command (exit code 2, starting with prefix)."""
        assert "Traceback" not in self.stderr, self.stderr[-3000:]
        assert self.returncode == 2, (self.returncode, self.stderr[-3000:])
        lines = self.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(prefix), self.stderr[-3000:]
        return lines[0]


# wait4's ru_maxrss of a child counts the pages of the process it was forked from (Linux keeps
# the old mm's high-water mark across exec): forked straight from pytest, a 32 MB `inspect`
# reported 338 MB once the suite had imported torch. So a small launcher process forks the
# command (RLIMIT_AS set in its preexec_fn), reaps it with wait4 and reports status and peak RSS.
_LAUNCHER = """
import json, os, resource, subprocess, sys
cap, report = int(sys.argv[1]), sys.argv[2]
def confine():
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
proc = subprocess.Popen(sys.argv[3:], preexec_fn=confine)
_, status, usage = os.wait4(proc.pid, 0)
with open(report, "w") as f:
    json.dump({"returncode": os.waitstatus_to_exitcode(status),
               "peak_rss": usage.ru_maxrss * 1024}, f)
"""


def run_confined(args: list, *, address_space: int, timeout: float, cwd: Path,
                 env: dict | None = None) -> Ran:
    """Runs args under RLIMIT_AS = address_space; kills it (its whole process group, workers
    included) and fails the test after timeout seconds. Output goes to temporary files,
    outside any tree a test snapshots."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        out, err, report = (Path(scratch, name) for name in ("out", "err", "report.json"))
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            launcher = subprocess.Popen(
                [sys.executable, "-c", _LAUNCHER, str(address_space), str(report),
                 *map(str, args)], cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                stderr=stderr, start_new_session=True)
            try:
                launcher.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait()
                raise AssertionError(f"{' '.join(map(str, args[1:]))} still ran after {timeout} "
                                     f"s (it hangs):\n{err.read_text(errors='replace')[-3000:]}")
        assert launcher.returncode == 0, err.read_text(errors="replace")[-3000:]
        result = json.loads(report.read_text())
        return Ran(result["returncode"], out.read_text(errors="replace"),
                   err.read_text(errors="replace"), result["peak_rss"],
                   time.monotonic() - started)


def turbotrain(*args) -> list:
    return [sys.executable, "-m", "turbotrain", *args]


def run_json_script(script: Path, *args, address_space: int, timeout: float,
                    peak_rss: int) -> dict:
    """`python SCRIPT ARGS` (a fuzz script that prints one JSON object) confined, from REPO:
    asserts it exited 0 with no traceback and peaked under peak_rss; returns the object."""
    ran = run_confined([sys.executable, script, *args], address_space=address_space,
                       timeout=timeout, cwd=REPO)
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr[-3000:]
    assert ran.peak_rss < peak_rss, f"peak RSS {ran.peak_rss >> 20} MB"
    return json.loads(ran.stdout)


def tree_state(root: Path, skip: Path | None = None) -> dict[str, tuple]:
    """(size, mtime, mode) of everything under root, symlinks not followed; skip's subtree out."""
    state = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            if skip is not None and (path == skip or skip in path.parents):
                continue
            info = os.lstat(path)
            state[str(path)] = (info.st_size, info.st_mtime_ns, info.st_mode)
    return state


def changed(before: dict, after: dict) -> list[str]:
    """Paths added, removed or modified between two tree_state snapshots."""
    return sorted(path for path in before.keys() | after.keys()
                  if before.get(path) != after.get(path))


def outside(paths, folder: Path) -> set[str]:
    """The paths that are not `folder` or under it."""
    root = str(folder)
    return {p for p in paths if p != root and not p.startswith(root + os.sep)}
