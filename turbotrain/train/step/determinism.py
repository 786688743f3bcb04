"""`--deterministic`'s one setting that must come before any CUDA work: cuBLAS's workspace.

cuBLAS reads CUBLAS_WORKSPACE_CONFIG when it creates a handle, at the first matmul on a device
(and stream); a handle created before the variable is set keeps its default workspace, whose
split-K reductions are not reproducible, and torch.use_deterministic_algorithms then refuses
cuBLAS calls. `train` runs CUDA steps long before the model is built (the batch search), so
the command sets the variable at its start (cli.py) and build_run again before planning (for
`train()` called from a program). No torch import here: `train --help` stays light.
"""
from __future__ import annotations

import os

# 4096 KiB x 8 buffers: the setting PyTorch's reproducibility notes give (":16:8" is the
# smaller one; both make cuBLAS deterministic, this one keeps its speed).
CUBLAS_WORKSPACE = ":4096:8"


def fix_cublas_workspace(deterministic: bool) -> None:
    """Sets CUBLAS_WORKSPACE_CONFIG for a deterministic run (a value already set is kept)."""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
