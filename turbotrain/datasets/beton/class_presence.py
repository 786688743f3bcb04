"""Which of a dataset's classes have images, split by split: what `prepare-dataset` warns about
(and `--classes present` acts on) for a source, and what `inspect` says of a prepared dataset.

A source whose class list comes from metadata (CIFAR's batches.meta, a Hugging Face ClassLabel,
integer labels 0..max in a CSV, an idx or .npz file) may declare classes it holds no image of:
a CIFAR-10 folder of only cats and dogs declares 10. A model trained on it gets 10 outputs of
which 8 are never seen, its top-5 is 100 % by construction, and it cannot be evaluated on an
ImageFolder copy of the same photos (2 classes). Here only labels are counted: no image is read.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# A warning names this many classes, then counts the rest: a line, not a 1,000-class list.
SHOWN_CLASSES = 8


@dataclass(frozen=True)
class ClassPresence:
    """Per split, how many samples each class has (int64, one entry per class)."""
    classes: list[str]
    counts: dict[str, np.ndarray]

    @classmethod
    def of(cls, classes: list[str], labels: dict[str, np.ndarray]) -> ClassPresence:
        """`labels`: each split's label array (values in 0..len(classes)-1)."""
        return cls(list(classes), {split: np.bincount(np.asarray(ids, dtype=np.int64),
                                                      minlength=len(classes))[:len(classes)]
                                   for split, ids in labels.items()})

    def _total(self) -> np.ndarray:
        return sum(self.counts.values(), np.zeros(len(self.classes), dtype=np.int64))

    @property
    def empty(self) -> list[int]:
        """The classes with no sample in any split."""
        return np.flatnonzero(self._total() == 0).tolist()

    @property
    def present(self) -> list[int]:
        """The classes with a sample in some split, in label order."""
        return np.flatnonzero(self._total() > 0).tolist()

    @property
    def without_train(self) -> list[int]:
        """Classes with val samples but no train sample (only when both splits exist): a model
        cannot learn them, and evaluating on them counts every one as a miss."""
        if "train" not in self.counts or len(self.counts) < 2:
            return []
        return np.flatnonzero((self.counts["train"] == 0) & (self._total() > 0)).tolist()

    def names(self, indices: list[int], shown_as=str) -> str:
        """The classes at `indices`, for one line (`listed`)."""
        return listed([self.classes[k] for k in indices], shown_as)


def listed(names: list[str], shown_as=str) -> str:
    """'a, b, c' or 'a, ..., h and 12 more', each name through `shown_as` (inspect's escaping
    and cut)."""
    shown = ", ".join(shown_as(name) for name in names[:SHOWN_CLASSES])
    rest = len(names) - SHOWN_CLASSES
    return f"{shown} and {rest} more" if rest > 0 else shown
