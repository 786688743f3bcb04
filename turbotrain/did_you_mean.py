"""`closest`: the names a mistyped one most likely meant, for a "did you mean" hint.

difflib's ratio alone suggests too much: `aa` scores 0.67 against `data` (its 2 letters are in
it), as a real typo like `ouy` for `out` does. A typo keeps most of the name it was meant to
be, so a suggestion must also match at least 60 % of the longer of the two names: `ouy`/`out`
match 2 of 3 letters, `aa`/`data` 2 of 4.
"""
from __future__ import annotations

import difflib

CUTOFF = 0.6  # difflib's ratio, and the share of the longer name that must match


def closest(name: str, names, n: int = 3) -> list[str]:
    """Up to `n` of `names` close enough to `name` to be what was meant, closest first."""
    found = []
    for candidate in difflib.get_close_matches(name, list(names), n=n, cutoff=CUTOFF):
        blocks = difflib.SequenceMatcher(None, name, candidate).get_matching_blocks()
        if sum(block.size for block in blocks) >= CUTOFF * max(len(name), len(candidate)):
            found.append(candidate)
    return found
