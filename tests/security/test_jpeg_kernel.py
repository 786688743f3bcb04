"""The compiled decode kernel against hostile JPEGs and boxes: seeded mutations of valid files
(fuzz_jpeg_kernel.py) decoded in a confined child with a memory cap and a timeout, once with the
kernel as built and once with an AddressSanitizer + UBSan build of the same sources, which fails
the run on any read or write outside a buffer, use after free or undefined behaviour.

Found while writing it: per-sample error messages read after their memory was freed (ASan:
heap-use-after-free in module.c's outcome()); garbage text in an error, and inline and pooled
decodes disagreeing on which samples failed, were its symptoms."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.native_build import build_extension

from .confined import REPO, run_confined, run_json_script

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("child_processes")]

FUZZ_SCRIPT = Path(__file__).with_name("fuzz_jpeg_kernel.py")
KINDS = ["duplicate", "flip", "lie", "marker", "random", "run", "scans", "truncate"]
# The child imports torch (turbotrain.pipeline), which cannot even map libtorch_cpu under
# 2 GiB of address space: 4 GiB, and 1 GB of RSS (it peaks at ~0.7 GB), so a decode bomb or a
# runaway buffer shows.
ADDRESS_SPACE = 4 << 30
PEAK_RSS = 1 << 30
COUNT = 300


def check(report: dict) -> None:
    assert report["failures"] == [], report["failures"][:5]
    assert report["runs"] == COUNT and report["kinds"] == KINDS
    assert COUNT // 4 < report["refused"] < COUNT  # the mutations bite, not all of them
    assert report["decoded"] > 0 and 0 < report["resize_refused"] < COUNT


def test_fuzz_the_kernel_with_mutated_jpegs(tmp_path):
    """Every mutated JPEG decodes or is refused with one line naming it, in every mode, and the
    inline and pooled runs agree; random boxes and sizes never write outside their slot."""
    report = run_json_script(FUZZ_SCRIPT, tmp_path / "work", "--seed", 20261201, "--count",
                             COUNT, address_space=ADDRESS_SPACE, timeout=240, peak_rss=PEAK_RSS)
    check(report)


def asan_build(folder: Path) -> Path:
    """The kernel's sources compiled with -fsanitize=address,undefined (any UB aborts)."""
    return build_extension(folder, "-O1", "-g", "-fno-omit-frame-pointer",
                           "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined")


def test_fuzz_under_address_sanitizer(tmp_path):
    """The same corpus against the sanitizer build. ASan's runtime is preloaded (python itself
    is not instrumented) and needs an unlimited address space for its shadow memory, so only
    the timeout and the RSS cap confine it here."""
    libasan = subprocess.run(["cc", "-print-file-name=libasan.so"], capture_output=True,
                             text=True).stdout.strip()
    assert os.path.isfile(libasan), "gcc's libasan (Debian libasan8, with gcc) is missing"
    build = asan_build(tmp_path)
    env = {**os.environ, "LD_PRELOAD": libasan, "PYTHONPATH": str(REPO),
           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
           "UBSAN_OPTIONS": "print_stacktrace=1"}
    ran = run_confined([sys.executable, FUZZ_SCRIPT, tmp_path / "work", "--seed", 20261202,
                        "--count", COUNT, "--native", build],
                       address_space=resource.RLIM_INFINITY, timeout=280, cwd=REPO, env=env)
    assert "AddressSanitizer" not in ran.stderr and "runtime error" not in ran.stderr, \
        ran.stderr[-4000:]
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.peak_rss < 3 * PEAK_RSS, f"peak RSS {ran.peak_rss >> 20} MB"
    check(json.loads(ran.stdout))
