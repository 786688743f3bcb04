"""`torch.compile` for a run whose input size changes by epoch (progressive resizing).

A schedule has a handful of sizes (pipeline/resolution.py rounds them to a step), so each is
compiled once, as a static-shape graph: ``dynamic=False`` keeps dynamo from turning the size
into a symbol at the first recompile (its "automatic dynamic shapes", whose graphs give up
shape-specialised kernels and CUDA-graph friendliness for every later size), and the
recompile limit is raised to hold every size, so none falls back to eager. A run at one size
compiles as before (dynamo's defaults).
"""
from __future__ import annotations

import torch
from torch import nn

# Graphs dynamo keeps per frame by default (torch._dynamo.config.recompile_limit, 8 in 2.x).
# The sizes plus a couple for what recompiles besides the size (a grad-mode or dtype guard).
SPARE_RECOMPILES = 2


def compile_for_sizes(model: nn.Module, *, mode: str | None, sizes: set[int] | None = None,
                  backend=None) -> nn.Module:
    """`model` compiled; with `sizes` (the run's training sizes, more than one), one static
    graph per size. `backend`: torch.compile's (None: inductor), for tests."""
    # A backend of a test's takes no inductor mode.
    extra = {"mode": mode} if backend is None else {"backend": backend}
    if not sizes or len(sizes) < 2:
        return torch.compile(model, **extra)
    import torch._dynamo.config as dynamo_config
    needed = len(sizes) + SPARE_RECOMPILES
    if dynamo_config.recompile_limit < needed:
        dynamo_config.recompile_limit = needed
    return torch.compile(model, dynamic=False, **extra)
