"""Train accuracy (issue 46): top-1 hits counted on the device by each micro-step, read at log
points only (`StepEngine.take_accuracy_counts`), never with a host sync per step."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from turbotrain.train.step.loop import StepSettings, make_engine


def _engine(device: str):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 5)).to(device)
    settings = StepSettings(device=torch.device(device), precision="fp32",
                            channels_last=False, lr=0.1, label_smoothing=0.1)
    return model, make_engine(model, settings)


def _batches(device: str):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 256, (8, 3, 4, 4), generator=generator).float().to(device),
             torch.randint(0, 5, (8,), generator=generator).to(device)) for _ in range(3)]


def test_hits_are_counted_on_the_device_and_read_once():
    model, engine = _engine("cpu")
    batches = _batches("cpu")
    with torch.no_grad():  # no optimizer step below: the model stays as it is
        want = sum(int((model(x).argmax(1) == y).sum()) for x, y in batches)
    for x, y in batches:
        engine.micro_step(x, y, will_step=False)
    hits, images = engine.take_accuracy_counts()
    assert isinstance(hits, torch.Tensor) and hits.dim() == 0  # still a tensor: not read yet
    assert int(hits) == want and images == 24
    assert engine.take_accuracy_counts() == (None, 0)  # the counts start again


@pytest.mark.cuda
def test_counting_hits_never_syncs_the_host():
    """CUDA's sync debug mode raises on any synchronizing call inside the micro-steps."""
    model, engine = _engine("cuda")
    batches = _batches("cuda")
    engine.micro_step(*batches[0], will_step=True)  # first-call set-up (cuBLAS handles) apart
    engine.optimizer_step(0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for x, y in batches[1:]:
            engine.micro_step(x, y, will_step=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    hits, images = engine.take_accuracy_counts()
    assert images == 16 and 0 <= int(hits) <= 16
