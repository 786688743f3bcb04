"""Labels given as text (a CSV column, a WebDataset `.cls`/`.txt`/`.json`, an HF string
column) turned into (classes, int64 labels), with one rule for every source kind: when every
label is a whole number they are kept as they are and the classes are "0".."max"; otherwise
each distinct text is a class name, and the classes are sorted."""
from __future__ import annotations

import re
from typing import Callable

import numpy as np

from turbotrain.datasets.beton.layout import MAX_CLASSES

from .source import SourceError

_DIGITS = re.compile(r"\d+")


def classes_and_labels(names: list[str], where: Callable[[int], str],
                       source: str) -> tuple[list[str], np.ndarray]:
    """(classes, labels) of the label texts `names`; `where(k)` names the k-th one's place
    and `source` the whole source, in the one-line errors."""
    if all(_DIGITS.fullmatch(name) for name in names):
        # Checked as text first: int() of a 5,000-digit string raises, and a huge label would
        # size the output layer.
        for k, name in enumerate(names):
            if len(name) > 9 or int(name) >= MAX_CLASSES:
                raise SourceError(f"{where(k)}: label {name[:20]} is over the "
                                  f"{MAX_CLASSES:,} classes a dataset may have")
        labels = np.array([int(name) for name in names], dtype=np.int64)
        top = int(labels.max()) if len(labels) else -1
        return [str(k) for k in range(top + 1)], labels
    classes = sorted(set(names))
    if len(classes) > MAX_CLASSES:
        raise SourceError(f"{source} names {len(classes):,} classes, over the {MAX_CLASSES:,} a "
                          f"dataset may have")
    index = {name: k for k, name in enumerate(classes)}
    return classes, np.array([index[name] for name in names], dtype=np.int64)
