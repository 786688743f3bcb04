"""The first N train and M test images of the real Fashion-MNIST (Debian's
dataset-fashion-mnist), through `prepare`: a real dataset small enough for a test to train on."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.expect import FASHION_MNIST as FASHION
from tests.expect import need


def prepare_fashion_subset(root: Path, train_images: int, val_images: int) -> Path:
    """Writes root/subset.npz and prepares it into root/data; returns root/data."""
    need("fashion_mnist")  # fails where TURBOTRAIN_EXPECT names it (make test, CI)
    from turbotrain.cli import main as turbotrain_main
    from turbotrain.datasets.sources.detect import detect_source
    source = detect_source(FASHION)
    train, val = source.splits["train"], source.splits["val"]
    npz = root / "subset.npz"
    np.savez(npz, images=np.asarray(train.images[:train_images]),
             labels=np.asarray(train.labels[:train_images]),
             val_images=np.asarray(val.images[:val_images]),
             val_labels=np.asarray(val.labels[:val_images]), classes=np.array(source.classes))
    assert turbotrain_main(["prepare", str(npz), str(root / "data"), "--workers", "1"]) == 0
    return root / "data"
