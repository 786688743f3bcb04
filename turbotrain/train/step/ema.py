"""An exponential moving average of the model's weights, evaluated at the end of the run."""
from __future__ import annotations

import copy

import torch
from torch import nn


class ModelEMA:
    """Keeps `ema = d * ema + (1 - d) * weights` after each optimizer step; buffers (BatchNorm's
    running statistics) are copied as they are.

    The decay ramps up as min(decay, (1 + n) / (10 + n)) over the first updates n: a fixed 0.999
    would still be 37% the random init after 1,000 steps, useless on a run of a few hundred.
    """

    def __init__(self, model: nn.Module, decay: float):
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        self.decay = decay
        self.updates = 0

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        ema_params = [p for p in self.module.parameters()]
        params = [p.detach() for p in model.parameters()]
        torch._foreach_lerp_(ema_params, params, 1.0 - d)
        for ema_buffer, buffer in zip(self.module.buffers(), model.buffers()):
            ema_buffer.copy_(buffer)

    def state_dict(self) -> dict:
        return {"module": self.module.state_dict(), "updates": self.updates, "decay": self.decay}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["module"])
        self.updates = int(state["updates"])
        self.decay = float(state["decay"])
