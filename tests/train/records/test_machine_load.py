"""The busy-machine verdict (records/machine_load.py) on described windows: steps that slow
down with no data wait while other work loads the machine are not the model's fault."""
from __future__ import annotations

from turbotrain.train.records.doctor import diagnose
from turbotrain.train.records.machine_load import (LoadWatch, LoadWindow, busy_machine,
                                                   read_cpu_times, shared_throughout)

from .test_doctor import facts

QUIET = LoadWindow(seconds=22.0, steps=20, data_wait=0.01, load=2.1, steal=0.0)  # 1.1 s a step
# Issue 46's report: outside load took the steps to 5-14 s, the loader still waiting for none.
BUSY = [LoadWindow(seconds=20 * s, steps=20, data_wait=0.01, load=7.5, steal=0.0)
        for s in (5.0, 9.0, 14.0)]


def test_steps_that_slow_under_outside_load_are_a_busy_machine():
    busy = busy_machine([QUIET, QUIET, *BUSY], own_threads=2)
    assert busy is not None
    assert busy.quiet_step == 1.1 and busy.slow_step == 9.0 and busy.load == 7.5
    assert busy.slow_share > 0.9


def test_slow_steps_without_outside_load_or_steal_are_the_run_s_own():
    """A larger image size late in the run (progressive resizing) slows the steps too."""
    own = [LoadWindow(w.seconds, w.steps, w.data_wait, load=2.0, steal=0.0) for w in BUSY]
    assert busy_machine([QUIET, QUIET, *own], own_threads=2) is None
    stolen = [LoadWindow(w.seconds, w.steps, w.data_wait, load=None, steal=0.3) for w in BUSY]
    assert busy_machine([QUIET, QUIET, *stolen], own_threads=2).steal == 0.3


def test_even_steps_or_slow_windows_waiting_for_data_are_not_busy():
    assert busy_machine([QUIET] * 6, own_threads=2) is None
    waiting = [LoadWindow(w.seconds, w.steps, 0.6, w.load, w.steal) for w in BUSY]
    assert busy_machine([QUIET, QUIET, *waiting], own_threads=2) is None
    assert busy_machine([QUIET, BUSY[0]], own_threads=2) is None  # too few windows


def test_the_verdict_says_busy_instead_of_advising_a_smaller_model():
    windows = (QUIET, QUIET, *BUSY)
    d = diagnose(facts(data_wait=0.1, compute=9.8, torch_threads=2, workers=0, cores=2,
                       load_windows=windows))
    assert d.verdict == "machine-busy"
    assert "steps took 9,000 ms" in d.headline and "against 1,100 ms while it was quiet" \
        in d.headline and "load average up to 7.5 on 2 cores" in d.headline
    advice = " ".join(d.next_steps)
    assert "smaller `--image-size`" not in advice and "lighter `--model`" not in advice
    assert "quiet pace (1,100 ms a step)" in advice
    # The same run on a quiet machine: compute-bound, with the model advice.
    quiet = diagnose(facts(data_wait=0.1, compute=9.8, torch_threads=2, workers=0, cores=2,
                           load_windows=(QUIET,) * 5))
    assert quiet.verdict == "compute-bound" and "lighter `--model`" in " ".join(quiet.next_steps)
    # Waiting for data is still input-bound, whatever the load.
    assert diagnose(facts(data_wait=6.0, compute=3.5, load_windows=windows)).verdict == \
        "input-bound"


def test_proc_stat_steal_and_the_watch(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 1 2 3\n")
    assert read_cpu_times(stat) == (1000, 40)
    stat.write_text("intr 1 2\n")
    assert read_cpu_times(stat) is None
    assert read_cpu_times(tmp_path / "missing") is None
    ticks = iter([(1000, 40), (2000, 240), (2500, 240)])
    watch = LoadWatch(cpu_times=lambda: next(ticks), load=lambda: 3.5)
    watch.sample(seconds=2.0, steps=4, data_wait=0.5)
    watch.sample(seconds=0.0, steps=0, data_wait=0.0)  # an empty window: nothing kept
    assert watch.windows == [LoadWindow(2.0, 4, 0.25, 3.5, 0.2)]


def test_a_machine_shared_all_run_says_so_instead_of_going_smaller():
    """No quiet window (the load never left): no jump to see, but no step time is the
    model's own either."""
    loaded = tuple(LoadWindow(seconds=100.0, steps=20, data_wait=0.01, load=12.0, steal=0.0)
                   for _ in range(5))
    assert shared_throughout(list(loaded), own_threads=2, cores=2) == 12.0
    assert shared_throughout([QUIET] * 5, own_threads=2, cores=2) is None
    d = diagnose(facts(data_wait=0.1, compute=9.8, torch_threads=2, workers=0, cores=2,
                       load_windows=loaded))
    assert d.verdict == "compute-bound"
    assert "the machine was shared all run (load average 12.0 on 2 cores" in d.headline
    assert d.next_steps[0].startswith("measure on a quiet machine before changing the model")
    assert not any("smaller `--image-size`" in s or "nothing obvious" in s for s in d.next_steps)
