"""Gradient accumulation: K micro-batches of B make the same update as one batch of K*B.

The model here has no BatchNorm: BN normalises each micro-batch with its own statistics, so
with BN K=4 x B=8 legitimately differs from B=32 (that is BN, not accumulation)."""
from __future__ import annotations

import torch
from torch import nn

from turbotrain.train.checkpoint import checkpoint_path
from turbotrain.train.distributed import sync_context
from turbotrain.train.models import model_names, register_model

from .conftest import FAST, step_losses

if "test-nobn" not in model_names():
    @register_model("test-nobn", sgd_lr=0.1, weight_decay=5e-4)
    def _no_batchnorm_net(num_classes: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                             nn.Flatten(), nn.Linear(8 * 16, num_classes))


def _one_step(train_cli, data, out, batch, accum):
    code, _, err = train_cli("--data", data, "--out", out, "--model", "test-nobn",
                             "--batch-size", batch, "--accum-steps", accum, "--max-steps", 1,
                             "--lr", "0.5", "--precision", "fp32", "--seed", 3, *FAST)
    assert code == 0, err
    weights = torch.load(checkpoint_path(out), weights_only=False)["model"]
    return weights, step_losses(out)[1]


def test_accumulation_matches_the_big_batch(train_cli, tiny_dataset, tmp_path):
    big, big_loss = _one_step(train_cli, tiny_dataset, tmp_path / "k1", batch=32, accum=1)
    accumulated, acc_loss = _one_step(train_cli, tiny_dataset, tmp_path / "k4", batch=8,
                                      accum=4)
    small, _ = _one_step(train_cli, tiny_dataset, tmp_path / "b8", batch=8, accum=1)
    assert abs(big_loss - acc_loss) < 1e-5
    moved = False
    for name, value in big.items():
        torch.testing.assert_close(accumulated[name], value, rtol=1e-5, atol=1e-6)
        moved |= not torch.allclose(small[name], value, rtol=1e-5, atol=1e-6)
    assert moved, "a single micro-batch of 8 should make a different update (test is vacuous)"


class _CountsNoSync(nn.Module):
    def __init__(self):
        super().__init__()
        self.skipped = 0

    def no_sync(self):
        import contextlib
        self.skipped += 1
        return contextlib.nullcontext()


def test_ddp_all_reduce_is_skipped_on_micro_steps_that_do_not_step():
    model = _CountsNoSync()
    for micro in range(8):
        with sync_context(model, will_step=(micro + 1) % 4 == 0):
            pass
    assert model.skipped == 6  # 3 of every 4 micro-batches
