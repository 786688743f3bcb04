"""torch.compile under progressive resizing: one static graph per training size, never a
dynamic-shape one, and no size left to eager by the recompile limit."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from turbotrain.train.step.compile_sizes import compile_for_sizes

pytestmark = pytest.mark.timeout(300)


def _net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4, 2))


def _symbolic(gm) -> bool:
    """Whether a captured graph takes a symbolic size (an input SymInt, or a SymInt dim)."""
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("example_value")
        if isinstance(value, torch.SymInt):
            return True
        if isinstance(value, torch.Tensor) and any(isinstance(d, torch.SymInt)
                                                   for d in value.shape):
            return True
    return False


def _run_sizes(model, sizes, device="cpu"):
    for size in sizes:
        model(torch.rand(2, 3, size, size, device=device)).sum().backward()


def test_each_size_is_one_static_graph():
    torch._dynamo.reset()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(_symbolic(gm))
        return gm.forward

    sizes = [16, 24, 32, 40, 48, 56, 64, 72, 80, 88]  # more sizes than dynamo's default limit
    model = compile_for_sizes(_net(), mode=None, sizes=set(sizes), backend=record)
    _run_sizes(model, sizes + sizes)  # a size seen again reuses its graph
    assert graphs == [False] * len(sizes)


def test_one_size_keeps_dynamos_defaults():
    """Without a schedule dynamo's automatic dynamic shapes stay on: a second size (which a
    fixed-size run never sees) makes a symbolic graph, which is what progressive runs avoid."""
    torch._dynamo.reset()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(_symbolic(gm))
        return gm.forward

    model = compile_for_sizes(_net(), mode=None, sizes={32}, backend=record)
    _run_sizes(model, [32, 48])
    assert graphs == [False, True]


@pytest.mark.cuda
def test_inductor_compiles_each_size_once_on_cuda():
    torch._dynamo.reset()
    from torch._dynamo.utils import counters
    counters.clear()
    model = compile_for_sizes(_net().cuda(), mode=None, sizes={96, 112, 128})
    _run_sizes(model, [96, 112, 128, 96, 128], device="cuda")
    torch.cuda.synchronize()
    assert counters["stats"]["unique_graphs"] == 3
