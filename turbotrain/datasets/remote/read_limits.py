"""How long a remote read may take and how much it may bring: the limits on every byte that
`object_store.Store` receives.

A server is input like any other: it may send more than it was asked for, send nothing, or
send a byte every two seconds forever. So every read, `dataset.json`, a shard header or a whole
shard, has

* a byte bound: what was asked for (the range, or the size dataset.json records); one more
  byte received is an error, never buffered;
* a deadline: a read of N bytes must be done `TURBOTRAIN_REMOTE_TIMEOUT` seconds (30) plus
  N / `TURBOTRAIN_REMOTE_MIN_RATE` (100 kB/s) after it started, and every byte on the way is
  held to the same line: by t seconds, (t - 30) x 100 kB must have come. Retries and resumed
  downloads share their read's deadline, so no amount of slow progress extends it.

100 kB/s is 0.8 Mbit/s, far below any link that trains (S3 gives one connection ~50-100 MB/s,
and the cache downloads at most three shards at once); 30 s covers connecting, a cold first
byte and obstore's own retries of a failed request. A 64 MiB shard may take 30 + 671 s.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

from turbotrain.datasets.errors import DatasetError
from turbotrain.sizes import SizeError, parse_size

MIN_RATE_ENV = "TURBOTRAIN_REMOTE_MIN_RATE"
TIMEOUT_ENV = "TURBOTRAIN_REMOTE_TIMEOUT"
DEFAULT_MIN_RATE = 100_000  # bytes per second
DEFAULT_TIMEOUT_S = 30.0


class TooSlow(DatasetError):
    """A read missed its deadline; one line naming the URL and the variables that set it."""


@dataclass(frozen=True)
class ReadLimits:
    min_rate: float = DEFAULT_MIN_RATE  # bytes per second, averaged from the read's start
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def from_env(cls) -> ReadLimits:
        """$TURBOTRAIN_REMOTE_MIN_RATE (a size per second: 100kB, 1MB, 50000) and
        $TURBOTRAIN_REMOTE_TIMEOUT (seconds), else the defaults."""
        rate, timeout = os.environ.get(MIN_RATE_ENV), os.environ.get(TIMEOUT_ENV)
        try:
            min_rate = parse_size(rate, f"${MIN_RATE_ENV}") if rate else DEFAULT_MIN_RATE
        except SizeError as e:
            raise DatasetError(f"{e} (bytes per second)") from None
        try:
            timeout_s = float(timeout) if timeout else DEFAULT_TIMEOUT_S
        except ValueError:
            timeout_s = -1.0
        if not (math.isfinite(timeout_s) and 0 < timeout_s <= 1e6):
            raise DatasetError(f"${TIMEOUT_ENV} {timeout!r:.40}: expected a number of seconds "
                               f"above 0 (default {DEFAULT_TIMEOUT_S:g})")
        return cls(float(min_rate), timeout_s)


class Deadline:
    """When each byte of one read of `nbytes` must have arrived (time.monotonic seconds, the
    clock asyncio's loop.time() uses)."""

    def __init__(self, nbytes: int, limits: ReadLimits | None = None):
        self.nbytes = nbytes
        self.limits = limits or ReadLimits.from_env()
        self.start = time.monotonic()

    def due(self, received: int) -> float:
        """By when the first `received` bytes must be in."""
        return self.start + self.limits.timeout_s + min(received, self.nbytes) / \
            self.limits.min_rate

    def left(self) -> float:
        """Seconds until the whole read is due."""
        return self.due(self.nbytes) - time.monotonic()

    def missed(self, shown_url: str, received: int, why: str = "") -> TooSlow:
        elapsed = time.monotonic() - self.start
        rate, why = self.limits.min_rate, f" ({why})" if why else ""
        return TooSlow(
            f"{shown_url}: gave up after {elapsed:.0f} s with {received:,} of {self.nbytes:,} "
            f"bytes{why}; a read must average {_rate(rate)} after its first "
            f"{self.limits.timeout_s:g} s: check the network, or set ${MIN_RATE_ENV} (now "
            f"{_rate(rate)}) or ${TIMEOUT_ENV} (now {self.limits.timeout_s:g} s)")


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e6:g} MB/s" if bytes_per_s >= 1e6 else f"{bytes_per_s / 1e3:g} kB/s"
