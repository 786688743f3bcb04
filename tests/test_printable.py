"""printable(): names from a dataset, safe to print or to write as one field of a line."""
import os

import pytest

from turbotrain.printable import printable


@pytest.mark.parametrize("name", ["cat", "chat noir é", "猫", "🐈", r"C:\data\x.png", ""])
def test_ordinary_names_are_unchanged(name):
    assert printable(name) == name


@pytest.mark.parametrize("name, shown", [
    ("a\tb", r"a\tb"), ("a\nb", r"a\nb"), ("a\rb", r"a\rb"),
    ("\x1b[2Jx", r"\x1b[2Jx"), ("\x1b]0;t\x07", r"\x1b]0;t\x07"), ("a\x7f\x9b", r"a\x7f\x9b"),
    ("gpj\u202eexe.jpg", r"gpj\u202eexe.jpg"), (os.fsdecode(b"caf\xe9"), r"caf\xe9"),
    ("C:\\x\tb", r"C:\\x\tb"),  # backslashes doubled once escapes appear: still unambiguous
])
def test_controls_bidi_and_undecodable_bytes_are_escaped(name, shown):
    assert printable(name) == shown
    assert "\n" not in printable(name) and "\t" not in printable(name)


def test_non_strings_are_converted():
    assert printable(3) == "3"
