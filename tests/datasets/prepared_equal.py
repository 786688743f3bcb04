"""Two prepared datasets hold the same samples: classes, labels and decoded pixels."""
from __future__ import annotations

import numpy as np

from turbotrain.datasets import open_dataset


def assert_same_dataset(a, b, splits=("train",)) -> None:
    for split in splits:
        x, y = open_dataset(a, split=split), open_dataset(b, split=split)
        assert x.classes == y.classes
        assert len(x) == len(y) and np.array_equal(x.labels, y.labels)
        for i in range(len(x)):
            assert np.array_equal(x.image(i), y.image(i)), (split, i)
