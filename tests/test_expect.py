"""tests/expect.py: a missing install fails where TURBOTRAIN_EXPECT names it and skips elsewhere;
a name it does not know is refused (a typo must not turn failures back into skips)."""
from __future__ import annotations

import pytest

from tests import expect


def test_the_names_are_read_from_the_variable_and_a_typo_is_refused():
    assert expect.expected({}) == frozenset()
    assert expect.expected({expect.ENV: " ray, timm ,"}) == {"ray", "timm"}
    with pytest.raises(ValueError, match="unknown rayy; the names: ray, timm"):
        expect.expected({expect.ENV: "rayy"})


def test_a_missing_install_fails_where_expected_and_skips_elsewhere(monkeypatch):
    monkeypatch.setitem(expect.INSTALLS, "dali", (lambda: False, "pip install x"))
    monkeypatch.setenv(expect.ENV, "ray,dali")
    with pytest.raises(pytest.fail.Exception, match="dali is not installed; install: pip "
                                                    "install x .TURBOTRAIN_EXPECT says"):
        expect.need("dali")
    monkeypatch.setenv(expect.ENV, "ray")
    with pytest.raises(pytest.skip.Exception, match="not in TURBOTRAIN_EXPECT"):
        expect.need("dali")


def test_an_install_that_is_here_passes_and_imports(monkeypatch):
    monkeypatch.setenv(expect.ENV, ",".join(expect.INSTALLS))
    monkeypatch.setitem(expect.INSTALLS, "ray", (lambda: True, "pip install ray"))
    expect.need("ray")  # returns: nothing to fail or skip
    assert expect.module("json", install="ray").dumps(1) == "1"
