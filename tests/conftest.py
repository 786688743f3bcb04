"""Suite-wide: tests marked `cuda` need a GPU. Without one they are skipped with the reason (CI
has none); `bench/gpu_check.py --all` (`make gpu-check`) runs them with `pytest -m cuda`.
Tests marked `slow` run first: under `make test`'s 2 workers a 5-minute test collected last
(Fashion-MNIST's 2 epochs) ran alone at the end and made the suite 5 minutes longer."""
from __future__ import annotations

import pytest

NO_GPU = ("needs a CUDA GPU (torch.cuda.is_available() is False); on a GPU machine run "
          "`make gpu-check` or `pytest -m cuda`")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: slow first
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=NO_GPU)
    for item in marked:
        item.add_marker(skip)
