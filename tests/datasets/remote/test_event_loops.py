"""The event loop our remote reads run on (object_store._run): one per thread, closed when
the thread ends."""
from __future__ import annotations

import asyncio
import gc
import threading

from turbotrain.datasets.remote import object_store


async def _running_loop():
    return asyncio.get_running_loop()


def test_a_thread_s_loop_is_reused_then_closed_when_the_thread_ends():
    """Closed at the thread's end, not by the cycle collector: a loop collected in a cycle may
    have lost its self-pipe socket first and prints 'Exception ignored ... Invalid file
    descriptor: -1' on stderr (seen in the remote fuzz test)."""
    loops = []

    def reads():
        loops.append(object_store._run(_running_loop()))
        loops.append(object_store._run(_running_loop()))

    gc.disable()  # so that only the thread's end can close it
    try:
        thread = threading.Thread(target=reads)
        thread.start()
        thread.join()
        assert loops[0] is loops[1]
        assert loops[0].is_closed()
    finally:
        gc.enable()


def test_two_threads_get_two_loops():
    loops = {}

    def reads(name):
        loops[name] = object_store._run(_running_loop())

    threads = [threading.Thread(target=reads, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loops["a"] is not loops["b"]
