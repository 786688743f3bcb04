"""A seeded fuzz of every SOURCE kind's headers (fuzz_sources.py), in one confined child: only
success or our own one-line errors are acceptable, within a memory cap and a time limit."""
from __future__ import annotations

from pathlib import Path

import pytest

from .confined import run_json_script

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast

FUZZ_SCRIPT = Path(__file__).with_name("fuzz_sources.py")
ROUNDS = 150  # per kind, 17 kinds: ~2,500 cases in ~20 s on the 2-core box
ADDRESS_SPACE = 2 << 30   # as test_prepare_safety.py: prepare's imports need over 1 GiB
PEAK_RSS = 512 << 20      # the unmutated reads peak at ~120 MB, ~300 MB with pyarrow and datasets


@pytest.mark.timeout(180)
def test_source_headers_fuzz(tmp_path):
    result = run_json_script(FUZZ_SCRIPT, tmp_path / "work", ROUNDS, 0,
                             address_space=ADDRESS_SPACE, timeout=150, peak_rss=PEAK_RSS)
    assert result["cases"] == ROUNDS * 17
    assert result["problems"] == []
