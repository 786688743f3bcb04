"""Fixtures shared by the security tests that run `train` (test_checkpoint, test_run_folder)."""
from __future__ import annotations

import pytest

from tests.train.tiny_data import write_tiny_dataset


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    """tests/train's tiny prepared dataset, one per module; tests assert they leave it as it was."""
    return write_tiny_dataset(tmp_path_factory.mktemp("data") / "ds")
