"""Suite-wide: tests marked `cuda` need a GPU. Without one they are skipped with the reason (CI
has none); `bench/gpu_check.py --all` (`make gpu-check`) runs them with `pytest -m cuda`.
Modules holding a test marked `slow` run first, then the modules marked `xdist_group`: under
`make test`'s 2 workers (`--dist loadgroup`) a 5-minute test collected last (Fashion-MNIST's 2
epochs) ran alone at the end and made the suite 5 minutes longer, and a grouped module is one unit
of work, its whole file on one worker (test_resume's training runs: minutes in fp32), which
collected among the last of tests/train/ kept one worker busy while the other had nothing left.
A module's tests stay together, so that its module-scoped fixture is set up once (sorting slow
tests alone first split test_ddp and ran its 46 s two-rank fixture twice)."""
from __future__ import annotations

import os
import signal

import pytest

from .fast_lane import (_fast_lane_guard, child_processes, pytest_addoption,  # noqa: F401
                        pytest_configure, select)

# A suite started in the background of a non-interactive shell (`bash -c '... &'`, nohup)
# inherits SIGINT ignored, and so would every child it starts: the tests that press Ctrl-C on a
# child then saw it finish its work instead (exit 0, not 130). Python's own handler here makes
# the children start with SIGINT at its default, as under a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

NO_GPU = ("needs a CUDA GPU (torch.cuda.is_available() is False); on a GPU machine run "
          "`make gpu-check` or `pytest -m cuda`")


def pytest_sessionstart(session):
    """The box's ISA first: the training tests run in bf16 only on avx512_bf16/AMX, in fp32 on
    an AVX2-only box, where the suite took ~2.5x as long (21 min against 8.5 on AMX, issue 44);
    and which installs may not be missing here (tests/expect.py). Written by the terminal
    reporter itself: a report header is hidden under `make test`'s -q."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(session.config, "workerinput"):  # an xdist worker: silent
        return
    for line in header_lines():
        reporter.write_line(line)


def header_lines() -> list[str]:
    from tests import expect
    from turbotrain.host import cpu_info, isa_name
    cpu = cpu_info()
    isa = isa_name(cpu.flags) if cpu.read else "unknown (no /proc/cpuinfo)"
    forced = os.environ.get("ONEDNN_MAX_CPU_ISA")
    expected = ",".join(sorted(expect.expected())) or "none (a missing install skips its tests)"
    return [f"ISA: {isa}, {cpu.model}" + (f" (ONEDNN_MAX_CPU_ISA={forced})" if forced else ""),
            f"{expect.ENV}: {expected}"]


def pytest_collection_modifyitems(config, items):
    select(config, items)  # --fast: only the tests that neither train nor start processes
    items.sort(key=schedule_rank(items))  # stable: a module's tests stay in their order
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=NO_GPU)
    for item in marked:
        item.add_marker(skip)


def schedule_rank(items):
    """0 for a module holding a `slow` test, 1 for a module run as one `xdist_group` unit, 2 for
    the rest: the long units start first, so the short ones even out the workers at the end."""
    def files(marker: str) -> set[str]:
        return {item.nodeid.split("::")[0] for item in items
                if item.get_closest_marker(marker) is not None}
    slow, grouped = files("slow"), files("xdist_group")
    return lambda item: (0 if (path := item.nodeid.split("::")[0]) in slow else
                         1 if path in grouped else 2)


_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session, exitstatus):
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """The test process read URLs through obstore (test_remote): it ends as a turbotrain
    command does, before finalizing, where obstore's runtime can abort it after the summary
    (turbotrain/process_end.py) and turn a green run red."""
    from turbotrain import process_end
    if _EXIT_STATUS and process_end.obstore_ran_here():
        process_end.exit_before_finalizing(_EXIT_STATUS[-1])
