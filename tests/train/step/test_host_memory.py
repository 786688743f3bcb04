"""keep_freed_memory: glibc serves big blocks from the heap instead of a fresh mmap each time."""
import subprocess
import sys

import pytest

from ..conftest import REPO

pytestmark = pytest.mark.usefixtures("child_processes")  # not in make test-fast

# A fresh interpreter each time: glibc's mmap threshold adapts upwards as a process frees mmapped
# blocks, so only a new process shows the default behaviour reliably.
PROBE = """
import ctypes, sys
sys.path.insert(0, {root!r})
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
if {apply}:
    from turbotrain.train.step.host_memory import keep_freed_memory
    assert keep_freed_memory()[0]
before = libc.mallinfo2().hblkhd
block = libc.malloc(24 * 2**20)  # an activation-sized block, under the 32 MiB cap
mmapped = libc.mallinfo2().hblkhd - before
libc.free(block)
print(mmapped)
"""


def mmapped_bytes_of_a_24_mib_block(apply: bool) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE.format(root=str(REPO), apply=apply)],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_big_blocks_come_from_the_heap_once_applied():
    assert mmapped_bytes_of_a_24_mib_block(apply=False) >= 24 * 2**20  # glibc's default: mmap
    assert mmapped_bytes_of_a_24_mib_block(apply=True) == 0


def test_says_what_it_did():
    from turbotrain.train.step.host_memory import keep_freed_memory
    applied, reason = keep_freed_memory()
    assert reason and "\n" not in reason
    if sys.platform.startswith("linux"):
        assert applied


LIBRARY_PROBE = """
import sys
sys.path.insert(0, {root!r})
from turbotrain.train.step import host_memory
import turbotrain.train.engine.builder  # what train() runs
print(host_memory.decision()[0])
"""


def test_a_library_user_keeps_glibc_defaults():
    """Only the train command changes the process's allocator; the run's printed decision says
    when it did not."""
    out = subprocess.run([sys.executable, "-c", LIBRARY_PROBE.format(root=str(REPO))],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    from turbotrain.train.step.host_memory import _NOT_ASKED
    assert "train command" in _NOT_ASKED[1].replace("`", "")


def test_the_train_command_applies_it(monkeypatch):
    from turbotrain.train import cli
    from turbotrain.train.engine import trainer
    from turbotrain.train.step import host_memory
    calls = []
    monkeypatch.setattr(host_memory, "_outcome", None)
    monkeypatch.setattr(trainer, "train",
                        lambda config, sources=None: calls.append(host_memory.decision()))
    parser = cli.argparse.ArgumentParser()
    cli.add_train_arguments(parser)
    assert cli.run_train(parser.parse_args(["--data", "somewhere"])) == 0
    assert calls == [host_memory.keep_freed_memory()]  # applied before train() started
