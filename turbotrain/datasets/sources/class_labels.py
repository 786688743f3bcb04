"""A source's classes and labels.

Labels given as text (a CSV column, a WebDataset `.cls`/`.txt`/`.json`, an HF string
column) turned into (classes, int64 labels), with one rule for every source kind: when every
label is a whole number they are kept as they are and the classes are "0".."max"; otherwise
each distinct text is a class name, and the classes are sorted.

`prepare-dataset --classes all|present`: which of a source's declared classes the prepared
dataset keeps, and the lines prepare prints about classes with no images.

- `all` (default): every class the source declares, with the source's label ids (CIFAR-10's
  cat stays 3). Classes with no image are warned about, in one line.
- `present`: only the classes with at least one image in some split (train or val), renumbered
  0..K-1 in the source's order, the same ids in every split. A class with val images but no
  train images is kept (and warned about): val's labels must mean what train's mean, and
  dropping it would hide from the val accuracy that the model never saw it. The names left out
  are recorded in dataset.json (`source.dropped_classes`). Which samples go to which split
  does not change (the val carve and the shuffled train order come first, on the source's ids).

Presence is counted from the source's listing, before any image is decoded: a class whose
every image `--on-error skip` then skips is still counted as present.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable

import numpy as np

from turbotrain.datasets.beton.class_presence import ClassPresence, listed
from turbotrain.datasets.beton.layout import MAX_CLASSES

from .source import Source, SourceError

CLASS_CHOICES = ("all", "present")  # prepare-dataset --classes

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


def presence(source: Source) -> ClassPresence:
    return ClassPresence.of(source.classes,
                            {split: s.labels for split, s in source.splits.items()})


def chosen_classes(source: Source, choice: str) -> Source:
    """The source with the classes `choice` keeps (module docstring); `all`: itself."""
    if choice == "all":
        return source
    kept = presence(source).present
    if not kept or len(kept) == len(source.classes):
        # Nothing to renumber; a source with no sample at all fails later, as it does today.
        return dataclasses.replace(source, dropped_classes=())
    new_id = np.full(len(source.classes), -1, dtype=np.int64)
    new_id[kept] = np.arange(len(kept))
    splits = {name: dataclasses.replace(split, labels=new_id[split.labels])
              for name, split in source.splits.items()}
    kept_set = set(kept)
    dropped = tuple(name for k, name in enumerate(source.classes) if k not in kept_set)
    return dataclasses.replace(source, classes=[source.classes[k] for k in kept],
                               splits=splits, dropped_classes=dropped)


def class_lines(source: Source) -> list[str]:
    """`warning: ...` and `note: ...` lines about the source's classes (after chosen_classes):
    none for a source whose every class has images in train."""
    p = presence(source)
    where, lines, present = source.path, [], p.present
    if len(present) == 1:
        empty = f"; {len(p.empty)} of {len(p.classes)} declared classes have none" \
            if p.empty else ""
        lines.append(f"warning: {where}: only one class has images ({p.names(present)}"
                     f"{empty}); a classifier needs images of at least 2 classes")
    elif p.empty:
        lines.append(f"warning: {where}: {len(p.empty)} of {len(p.classes)} "
                     f"{_classes(len(p.empty))} no images ({p.names(p.empty)}); the model "
                     f"would get {len(p.classes)} outputs, {len(p.empty)} never trained: "
                     f"--classes present keeps only the {len(present)} with images")
    dropped = list(source.dropped_classes)
    if dropped:
        lines.append(f"note: --classes present left out {len(dropped)} "
                     f"{'class' if len(dropped) == 1 else 'classes'} with no images ({listed(dropped)}); the "
                     f"{len(p.classes)} kept are numbered 0..{len(p.classes) - 1} in the "
                     f"source's order")
    if p.without_train:
        lines.append(f"warning: {where}: {len(p.without_train)} {_classes(len(p.without_train))}"
                     f" val images but no train images ({p.names(p.without_train)}); the model "
                     f"cannot learn them")
    return lines


def _classes(count: int) -> str:
    return "class has" if count == 1 else "classes have"
