"""The batch finder: its search (with simulated out-of-memory errors, as on a GPU), the CPU
memory estimate, and `--batch-size auto` / `--global-batch-size` in `train`."""
from __future__ import annotations

import json

import pytest
import torch

from turbotrain.train.engine import batch_finder as bf
from turbotrain.train.models.models import build_model, get_model_spec
from turbotrain.train.plan import rules
from turbotrain.train.step.loop import StepSettings

from ..conftest import FAST

CPU = torch.device("cpu")


def settings(precision: str, device: torch.device | None = None) -> StepSettings:
    """The step the searches try: SGD, channels_last, at `precision`."""
    return StepSettings(device=device or torch.device("cpu"), precision=precision,
                        channels_last=True)


def tiny_model():
    return build_model(get_model_spec("compact28"), 4)


@pytest.mark.parametrize("largest, limit, expected", [
    (37, 4096, 32),  # bisected, rounded down to a multiple of 8
    (5, 64, 5),  # small answers are kept as they are
    (300, 256, 256),  # the limit fits: one trial
    (0, 64, 0),  # not even one image
])
def test_search_finds_the_largest_batch_that_fits(largest, limit, expected):
    tried = []

    def fits(batch):
        tried.append(batch)
        return batch <= largest

    assert bf.largest_fitting(fits, limit) == expected
    assert len(tried) <= 2 + limit.bit_length()
    if largest >= limit:
        assert tried == [limit]


def test_trial_steps_recover_from_out_of_memory(monkeypatch):
    trial = bf.TrialSteps(tiny_model, settings("fp32"), image_size=16, num_classes=4)
    real_steps = trial._steps
    released = []
    monkeypatch.setattr(bf, "release_memory", lambda device: released.append(device))

    def steps(batch):  # a GPU with room for 20 images
        if batch > 20:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        real_steps(batch)

    monkeypatch.setattr(trial, "_steps", steps)
    assert bf.largest_fitting(trial.fits, 64) == 16  # 20, rounded down to a multiple of 8
    assert released and all(ok == (b <= 20) for b, ok in trial.trials)
    # Other errors are not mistaken for a full GPU.
    monkeypatch.setattr(trial, "_steps", lambda b: (_ for _ in ()).throw(RuntimeError("bad")))
    with pytest.raises(RuntimeError, match="bad"):
        trial.fits(8)


def test_trial_steps_are_the_trainers_step_and_recover_mid_step(monkeypatch):
    """The trial runs the trainer's StepEngine (loop.make_engine), under fp16 with its live
    GradScaler. An out-of-memory error inside the optimizer step, after the scaler unscaled the
    gradients, must not leave that scaler half-way: its next step would skip unscaling the
    next trial's gradients. The recovery starts a fresh one."""
    from turbotrain.train.step.loop import StepEngine
    trial = bf.TrialSteps(tiny_model, settings("fp16"), image_size=16, num_classes=4)
    assert isinstance(trial.engine, StepEngine) and trial.engine.scaler.is_enabled()
    monkeypatch.setattr(bf, "release_memory", lambda device: None)
    optimizer, scaler = trial.engine.optimizer, trial.engine.scaler
    real_step = optimizer.step

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    optimizer.step = out_of_memory
    assert not trial.fits(8)
    assert scaler._per_optimizer_states[id(optimizer)]["stage"].name == "UNSCALED"
    optimizer.step = real_step
    assert trial.engine.scaler is not scaler and trial.fits(8)
    assert all(p.grad is None for p in optimizer.param_groups[0]["params"])
    assert trial.trials == [(8, False), (8, True)]


def test_cpu_estimate_grows_with_pixels_and_respects_the_budget():
    fixed, small = bf.estimate_cpu_bytes(tiny_model, settings("fp32"), image_size=16)
    _, large = bf.estimate_cpu_bytes(tiny_model, settings("fp32"), image_size=32)
    assert fixed > 0 and 3 * small < large < 5 * small  # 4x the pixels
    budget = int(fixed + 40.5 * small)
    fit = bf.find_batch_size(tiny_model, settings("fp32"), num_classes=4, image_size=16,
                             limit=4096, budget_bytes=budget)
    assert fit.batch_size == 40 and "MiB per image" in fit.how
    # ... and that batch size works: two real training steps run at it.
    trial = bf.TrialSteps(tiny_model, settings("fp32"), image_size=16, num_classes=4)
    assert trial.fits(fit.batch_size)


class _TrialWithRoomFor40:
    """TrialSteps on a pretend GPU: batches up to 40 fit."""

    def __init__(self, build, settings, **_):
        device = settings.device
        assert device.index is not None, f"trial steps on an index-less device {device}"
        self.trials = []

    def fits(self, batch):
        self.trials.append((batch, batch <= 40))
        return batch <= 40

    def close(self):
        pass


def fake_cuda_memory_cap(monkeypatch, cap: float | None) -> list:
    """torch.cuda's memory-cap calls replaced by fakes that check their arguments as torch
    does; `cap`: the fraction the program set before (None: a torch without the getter).
    Returns the list of (fraction, device) each set call gets."""
    from types import SimpleNamespace

    from torch.cuda._utils import _get_device_index
    capped = []

    def set_fraction(fraction, device):
        _get_device_index(device)  # torch's own check: raises for a device without an index
        assert isinstance(fraction, float) and 0 <= fraction <= 1
        capped.append((fraction, device))

    def get_fraction(device):
        _get_device_index(device)
        return cap

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(total_memory=80 * 2**30))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    if cap is None:
        monkeypatch.delattr(torch.cuda, "get_per_process_memory_fraction", raising=False)
    else:
        monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", get_fraction)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", _get_device_index)
    monkeypatch.setattr(bf, "TrialSteps", _TrialWithRoomFor40)
    return capped


def test_cuda_search_gets_an_indexed_device(monkeypatch):
    """`train --batch-size auto` passes torch.device("cuda"); torch's memory cap wants an index
    (issue 14: ValueError "Expected a torch.device with a specified index ... got:cuda")."""
    capped = fake_cuda_memory_cap(monkeypatch, 1.0)
    fit = bf.find_batch_size(tiny_model, settings("bf16", torch.device("cuda")),
                             num_classes=4, image_size=16, limit=512)
    assert fit.batch_size == 40 and "on cuda:0 within 90% of its 80 GiB" in fit.how
    assert [device for _, device in capped] == [torch.device("cuda", 0)] * 2
    assert [fraction for fraction, _ in capped] == [0.9, 1.0]  # the cap, then lifted


@pytest.mark.parametrize("cap, after", [(0.5, 0.5), (None, 1.0)])
def test_cuda_search_gives_a_programs_cap_back(monkeypatch, cap, after):
    """A cap the program set (say to share the GPU) bounds the search and is set again after
    it; a torch without get_per_process_memory_fraction gets its default, 1.0, back."""
    capped = fake_cuda_memory_cap(monkeypatch, cap)
    fit = bf.find_batch_size(tiny_model, settings("bf16", torch.device("cuda")),
                             num_classes=4, image_size=16, limit=512)
    searched = 0.9 if cap is None else min(cap, 0.9)
    assert [fraction for fraction, _ in capped] == [searched, after]
    assert f"within {searched:.0%} of its 80 GiB" in fit.how


@pytest.mark.cuda
def test_cuda_search_runs_real_steps_on_the_gpu():
    fit = bf.find_batch_size(tiny_model, settings("bf16", torch.device("cuda")),
                             num_classes=4, image_size=16, limit=64)
    assert fit.batch_size == 64 and "1 trial step pair(s) on cuda:" in fit.how


def test_divisor_for_a_global_batch():
    assert rules.divisor_at_most(1024, 300) == 256
    assert rules.divisor_at_most(96, 40) == 32
    assert rules.divisor_at_most(7, 5) == 1


def test_global_batch_size_sets_the_accumulation(train_cli, tiny_dataset, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", out, "--epochs", 1,
                                  "--batch-size", 16, "--global-batch-size", 48, *FAST)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accum_steps"] == 3 and summary["global_batch_size"] == 48
    assert "accum_steps: 3: --global-batch-size 48 = 16 x 1 rank(s) x 3" in stdout


def test_auto_batch_with_a_global_batch(train_cli, tiny_dataset, tmp_path, monkeypatch):
    """On the default device (the CPU here, the GPU on a CUDA machine, where this caught the
    index-less device of issue 14): memory with room for 20 images makes the micro-batch 16 (a
    multiple of 8 and a divisor of 48), and accumulation makes up the rest."""
    real = bf.find_batch_size
    real_steps = bf.TrialSteps._steps

    def steps(trial, batch):  # CUDA: real trial steps up to 20 images, out of memory above
        if batch > 20:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        real_steps(trial, batch)

    def tight(build, step_settings, **k):  # CPU: a memory budget with room for 20 images
        if step_settings.device.type == "cuda":
            return real(build, step_settings, **k)
        fixed, per_image = bf.estimate_cpu_bytes(build, step_settings, image_size=k["image_size"])
        return real(build, step_settings, **k, budget_bytes=int(fixed + 20.5 * per_image))

    monkeypatch.setattr(bf.TrialSteps, "_steps", steps)
    monkeypatch.setattr(bf, "find_batch_size", tight)
    out = tmp_path / "run"
    code, stdout, err = train_cli("--data", tiny_dataset, "--out", out, "--epochs", 1,
                                  "--batch-size", "auto", "--global-batch-size", 48, *FAST)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["batch_size"], summary["accum_steps"]) == (16, 3)
    assert "but 48 does not fit: 16 is the largest that does" in stdout


@pytest.mark.parametrize("flags, message", [
    (("--batch-size", 16, "--global-batch-size", 40), "not a multiple of batch-size 16"),
    (("--batch-size", 16, "--global-batch-size", 48, "--accum-steps", 2), "contradicts"),
])
def test_inconsistent_batch_flags_are_one_line_errors(train_cli, tiny_dataset, tmp_path, flags,
                                                      message):
    code, _, err = train_cli("--data", tiny_dataset, "--out", tmp_path / "run", *flags, *FAST)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
