"""Gradient accumulation: K micro-batches of B make the same update as one batch of K*B.

The model here has no BatchNorm: BN normalises each micro-batch with its own statistics, so
with BN K=4 x B=8 legitimately differs from B=32 (that is BN, not accumulation)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from turbotrain.train.models.models import model_names, register_model
from turbotrain.train.records.checkpoint import checkpoint_path
from turbotrain.train.step.distributed import sync_context

from ..conftest import FAST, step_losses

if "test-nobn" not in model_names():
    @register_model("test-nobn", sgd_lr=0.1, weight_decay=5e-4)
    def _no_batchnorm_net(num_classes: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                             nn.Flatten(), nn.Linear(8 * 16, num_classes))


def _one_step(train_cli, data, out, batch, accum, device):
    # --no-compile: one eager step is what is compared (and three compiles would be slow).
    code, _, err = train_cli("--data", data, "--out", out, "--model", "test-nobn",
                             "--batch-size", batch, "--accum-steps", accum, "--max-steps", 1,
                             "--lr", "0.5", "--precision", "fp32", "--seed", 3,
                             "--device", device, "--no-compile", *FAST)
    assert code == 0, err
    weights = torch.load(checkpoint_path(out), weights_only=False)["model"]
    return weights, step_losses(out)[1]


# Tolerances (rtol, atol) for the weights after one step, per device. The two updates sum the
# same 32 per-image gradients in a different order: fp32 rounding only (~1e-7 relative per
# add) on the CPU. On CUDA cuDNN also picks its algorithm per batch size (benchmark mode: a
# batch of 8 and one of 32 may run different conv kernels, Winograd or FFT among them, whose
# fp32 error is ~1e-5 relative); TF32 is switched off below, or its 10-bit mantissa (~5e-4
# relative) would set the error: 2.6e-6 against atol 1e-6 on an H200 (issue 14).
TOLERANCE = {"cpu": (1e-5, 1e-6), "cuda": (1e-4, 1e-5)}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_accumulation_matches_the_big_batch(train_cli, tiny_dataset, tmp_path, monkeypatch,
                                            device):
    if device == "cuda":  # plain fp32 on the GPU: no TF32 in convolutions or matmuls
        monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
        monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
        monkeypatch.setattr(torch, "set_float32_matmul_precision", lambda precision: None)
    rtol, atol = TOLERANCE[device]
    big, big_loss = _one_step(train_cli, tiny_dataset, tmp_path / "k1", 32, 1, device)
    accumulated, acc_loss = _one_step(train_cli, tiny_dataset, tmp_path / "k4", 8, 4, device)
    small, _ = _one_step(train_cli, tiny_dataset, tmp_path / "b8", 8, 1, device)
    assert abs(big_loss - acc_loss) < 10 * atol
    moved = 0.0
    for name, value in big.items():
        torch.testing.assert_close(accumulated[name], value, rtol=rtol, atol=atol)
        moved = max(moved, (small[name] - value).abs().max().item())
    # One micro-batch of 8 makes another update, far outside the tolerance (else the test
    # could not tell accumulation from a step on the first micro-batch).
    assert moved > 100 * atol, moved


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
