"""Flip TTA (step/flip_tta.py): the logits are the mean of two evaluations, the image's and its
mirror's, in every evaluation that uses it (loop.evaluate here; eval and predict through
inference.LoadedModel.logits, test_eval_settings.py)."""
from __future__ import annotations

import torch
from torch import nn

from turbotrain.train.step.distributed import DistEnv
from turbotrain.train.step.flip_tta import eval_logits
from turbotrain.train.step.loop import evaluate


class LeftHeavy(nn.Module):
    """Logits that depend on where in the image the bright pixels are: a mirror changes them."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(-1, 1, 8).repeat(3, 8, 1))  # (3, 8, 8)

    def forward(self, x):
        score = (x.float() * self.weight).sum(dim=(1, 2, 3))
        return torch.stack([score, -score, score * 0.5], dim=1)


class Batches:
    """The pipeline contract evaluate() needs: iteration and a state to rewind to."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def _images(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=g)


def test_tta_logits_are_the_mean_of_the_image_and_its_mirror():
    model, images = LeftHeavy().eval(), _images(6)
    with torch.no_grad():
        plain = model(images)
        mirrored = model(images.flip(3))
        tta = eval_logits(model, images, tta=True)
        assert torch.equal(eval_logits(model, images, tta=False), plain)
    assert not torch.allclose(plain, mirrored)  # the mirror does change this model's logits
    torch.testing.assert_close(tta, (plain + mirrored) / 2)
    # A mirrored batch gets the same TTA logits: the pair is the same two images.
    with torch.no_grad():
        torch.testing.assert_close(eval_logits(model, images.flip(3), tta=True), tta)


def test_evaluate_with_tta_scores_the_mean_logits():
    model = LeftHeavy()
    images, labels = _images(10, seed=1), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    batches = Batches([(images[:6], labels[:6]), (images[6:], labels[6:])])
    kwargs = dict(device=torch.device("cpu"), precision="fp32", channels_last=False,
                  env=DistEnv())
    with_tta = evaluate(model, batches, tta=True, **kwargs)
    without = evaluate(model, batches, **kwargs)
    with torch.no_grad():
        mean = (model(images) + model(images.flip(3))) / 2
    want_loss = float(nn.functional.cross_entropy(mean, labels))
    want_accuracy = float((mean.argmax(1) == labels).float().mean())
    assert abs(with_tta["val_loss"] - want_loss) < 1e-5
    assert with_tta["val_accuracy"] == want_accuracy
    with torch.no_grad():
        assert abs(without["val_loss"] - float(nn.functional.cross_entropy(model(images),
                                                                           labels))) < 1e-5
    assert with_tta["val_loss"] != without["val_loss"]
