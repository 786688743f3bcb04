"""Suite-wide: tests marked `cuda` need a GPU. Without one they are skipped with the reason (CI
has none); `bench/gpu_check.py --all` (`make gpu-check`) runs them with `pytest -m cuda`."""
from __future__ import annotations

import pytest

NO_GPU = ("needs a CUDA GPU (torch.cuda.is_available() is False); on a GPU machine run "
          "`make gpu-check` or `pytest -m cuda`")


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=NO_GPU)
    for item in marked:
        item.add_marker(skip)
