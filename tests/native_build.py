"""Builds variants of the compiled decode kernel from its sources for the tests: the scalar
resampler (-DTT_SCALAR, what non-x86 machines run) and the AddressSanitizer build."""
from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

SOURCES = sorted((Path(__file__).resolve().parents[1] / "turbotrain" / "pipeline" /
                  "csrc").glob("*.c"))


def build_extension(folder: Path, *flags: str) -> Path:
    """csrc/*.c compiled with `flags` into folder/_native<EXT_SUFFIX>; fails the test when the
    compiler does."""
    target = folder / f"_native{sysconfig.get_config_var('EXT_SUFFIX')}"
    command = [shutil.which("cc") or "gcc", "-shared", "-fPIC", "-pthread", *flags,
               f"-I{sysconfig.get_paths()['include']}", *map(str, SOURCES), "-ljpeg", "-lm",
               "-o", str(target)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return target


# What a child runs to use a given build: it replaces turbotrain.pipeline._native before
# turbotrain.pipeline.kernel imports it.
LOAD_BUILD = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("turbotrain.pipeline._native", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.modules["turbotrain.pipeline._native"] = module
"""
