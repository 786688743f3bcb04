"""The trainer's exceptions: each carries one line for the user and maps to an exit code."""
from __future__ import annotations


class TrainError(RuntimeError):
    """Bad input the user can fix (a flag, a path, a missing package); exit code 2."""

    exit_code = 2


class TrainingDiverged(RuntimeError):
    """The loss stayed non-finite; the last good checkpoint is kept; exit code 1."""

    exit_code = 1


class Interrupted(RuntimeError):
    """SIGTERM/SIGINT arrived; a checkpoint was written first; exit code 128 + signal number."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class DistributedFailure(RuntimeError):
    """A collective between ranks failed or timed out (a rank died or hung, or the network
    failed); every surviving rank says so and exits with code 1 instead of hanging."""

    exit_code = 1
