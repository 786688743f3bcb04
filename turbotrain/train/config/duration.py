"""`--time-budget`'s text: a duration in seconds, minutes or hours (no torch here: the flags
parse it, and `train --help` stays cheap)."""
from __future__ import annotations

import math
import re

# --time-budget without --epochs: the budget decides the run's length, up to this many epochs.
BUDGET_MAX_EPOCHS = 1000

_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$")


class DurationError(ValueError):
    pass


def parse_duration(raw, flag: str = "--time-budget") -> float:
    """Seconds from `90`, `90s`, `1.5m`, `10min` or `2h` (a YAML number: seconds)."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        seconds = float(raw)
    else:
        match = _DURATION.match(str(raw).lower())
        if not match or match.group(2) not in _UNITS:
            raise DurationError(f"{flag}: expected a duration like 90s, 10m or 1h, got "
                                f"{str(raw)[:80]!r}")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not (math.isfinite(seconds) and seconds > 0):
        raise DurationError(f"{flag}: must be a positive duration, not {str(raw)[:80]!r}")
    return seconds
