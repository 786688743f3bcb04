"""tests/conftest.py's order for `make test`'s workers: the modules with a `slow` test, then the
modules run as one `xdist_group` unit, then the rest, each module's tests together and in order;
and the box's ISA printed first, even under -q."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import schedule_rank


class Item:
    def __init__(self, nodeid: str, *markers: str):
        self.nodeid, self.markers = nodeid, set(markers)

    def get_closest_marker(self, name: str):
        return pytest.mark.slow if name in self.markers else None


def test_long_units_start_first_and_a_module_stays_together():
    items = [Item("tests/a.py::one"), Item("tests/b.py::grouped", "xdist_group"),
             Item("tests/c.py::quick"), Item("tests/c.py::slow", "slow"),
             Item("tests/b.py::also_grouped", "xdist_group"), Item("tests/d.py::last")]
    items.sort(key=schedule_rank(items))
    assert [item.nodeid for item in items] == [
        "tests/c.py::quick", "tests/c.py::slow", "tests/b.py::grouped", "tests/b.py::also_grouped",
        "tests/a.py::one", "tests/d.py::last"]


@pytest.mark.usefixtures("child_processes")  # not in make test-fast
def test_make_tests_quiet_run_prints_the_box_s_isa_first():
    # `make test` runs pytest -q -n 2, which hides report headers: the ISA line must show anyway
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n",
                           "2", "tests/test_schedule.py::test_long_units_start_first_and_a_module"
                           "_stays_together"], cwd=repo, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout[-500:]
    first = done.stdout.splitlines()[0]
    assert first.startswith("ISA: ") and "TURBOTRAIN_EXPECT: " in done.stdout, done.stdout[:300]
