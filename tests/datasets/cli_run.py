"""Running the `turbotrain` command in a child process, and its one-line errors."""
from __future__ import annotations

import subprocess
import sys


def cli(*args, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "turbotrain", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The single stderr line of a command that failed as a user error (exit code 2)."""
    assert result.returncode == 2, result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]
