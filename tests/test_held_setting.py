"""HeldSetting: a process-wide setting is ours while any user holds it, the process's after."""
from __future__ import annotations

import threading

from turbotrain.held_setting import HeldSetting


def make():
    state = {"value": "theirs"}
    setting = HeldSetting(lambda: state["value"], lambda v: state.update(value=v), lambda: "ours")
    return state, setting


def test_the_last_holder_gives_the_value_back():
    state, setting = make()
    release = setting.hold()
    assert state["value"] == "ours"
    with setting:
        assert state["value"] == "ours"
    assert state["value"] == "ours"  # still held by `release`'s owner
    release()
    assert state["value"] == "theirs"
    state["value"] = "changed meanwhile"
    release()  # a second close() does nothing
    assert state["value"] == "changed meanwhile"
    with setting:
        assert state["value"] == "ours"
    assert state["value"] == "changed meanwhile"


def test_threads_overlapping_in_any_order():
    state, setting = make()
    inside = threading.Barrier(8)
    seen = []

    def work():
        with setting:
            inside.wait(timeout=10)  # all eight hold it at once
            seen.append(state["value"])
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert seen == ["ours"] * 8 and state["value"] == "theirs"
