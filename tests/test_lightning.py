"""turbotrain.lightning.TurbotrainDataModule against the real Lightning, on CPU, one thread.

* Fashion-MNIST (10,000 train / 2,000 val images, prepared by `prepare`): a small CNN trained
  by `Trainer.fit` for one epoch reaches >= 80 % val accuracy (measured 83.3 %).
* Mid-epoch resume through Lightning's own checkpoint (ModelCheckpoint every 5 steps): a run
  resumed from step 5 (epoch 0) and from step 20 (epoch 1) trains on exactly the batches the
  uninterrupted run trained on from there, with the same losses, bit for bit.
* What `training_step` sees is what the Loader makes: the per-image checksums of two epochs
  under `fit` equal those of a plain iteration of the same Loader (pytorch and resident), the
  epochs differ, and batches kept unconsumed stay valid while later ones are made.
* DDP with 2 CPU processes through Lightning's own launcher (strategy="ddp"): each rank trains
  on its own half of the split, the batches a plain Loader(rank=r, world_size=2) gives.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import lightning.pytorch as L
from lightning.pytorch.callbacks import ModelCheckpoint

from turbotrain import Loader, LoaderError
from turbotrain.lightning import TurbotrainDataModule
from turbotrain.train.models.models import InputStem

from .fashion_subset import prepare_fashion_subset
from .train.tiny_data import write_tiny_dataset

REPO = Path(__file__).resolve().parents[1]
TRAIN_IMAGES, VAL_IMAGES = 10_000, 2_000
# small_cnn, 1 epoch of 10,000 images at batch 32, Adam: 83.3 % measured (batch 64: 80.8 %).
ACCURACY = 0.80
CPU = dict(device="cpu", workers=1, threads=1)
QUIET = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
             enable_model_summary=False)

# One pytest worker runs this whole module (make test: --dist loadgroup), so its module-scoped
# fixture runs once, not once per worker: its fixtures prepare Fashion-MNIST subsets.
pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("lightning"),
              pytest.mark.usefixtures("child_processes")]


def checksums(images: torch.Tensor) -> list[int]:
    """One number per image, sensitive to every pixel and its place."""
    flat = images.reshape(len(images), -1).to(torch.int64)
    weights = torch.arange(flat.shape[1], dtype=torch.int64) % 251 + 1
    return (flat * weights).sum(1).tolist()


def small_cnn(num_classes: int, image_size: int, width: int = 16) -> torch.nn.Module:
    """Two conv-BN-ReLU-pool stages and a linear head: ~1.3 MMAC per 28 px image, 14x less
    than compact28, which took 42 s for the same epoch on the busy 2-core box."""
    def stage(c_in, c_out):
        return torch.nn.Sequential(torch.nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
                                   torch.nn.BatchNorm2d(c_out), torch.nn.ReLU(),
                                   torch.nn.MaxPool2d(2))
    return torch.nn.Sequential(stage(3, width), stage(width, 2 * width), torch.nn.Flatten(),
                               torch.nn.Linear(2 * width * (image_size // 4) ** 2, num_classes))


class Classifier(L.LightningModule):
    """small_cnn behind turbotrain's uint8 input stem (models.InputStem); records what each
    step saw."""

    def __init__(self, num_classes: int, mean, std, image_size: int, steps: int,
                 lr: float = 2e-3):
        super().__init__()
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(InputStem(mean, std), small_cnn(num_classes, image_size))
        self.model.to(memory_format=torch.channels_last)
        self.lr, self.steps = lr, steps
        self.seen: dict[int, tuple[float, list[int]]] = {}  # step -> (loss, image checksums)
        self.correct = self.total = 0

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = torch.nn.functional.cross_entropy(self.model(images), labels)
        self.seen[self.global_step] = (loss.item(), checksums(images))
        return loss

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        self.correct += int((self.model(images).argmax(1) == labels).sum())
        self.total += len(labels)

    def on_validation_epoch_start(self):
        self.correct = self.total = 0

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.lr)
        # A pure function of the step (linear decay), so a resumed run has nothing to drift.
        decay = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: max(0.0, 1 - step / self.steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": decay, "interval": "step"}}


def classifier_for(data: TurbotrainDataModule, steps: int) -> Classifier:
    loader = data.train_loader
    return Classifier(loader.num_classes, loader.dataset.mean, loader.dataset.std,
                      loader.image_size, steps)


def fit(data: TurbotrainDataModule, module=None, *, ckpt_path=None, **trainer) -> Classifier:
    """Trainer.fit(module, datamodule=data); the module made after setup (it needs the
    dataset's classes and stats)."""
    if module is None:
        data.setup("fit")
        module = classifier_for(data, steps=trainer.pop("steps", 100))
    options = {**QUIET, "enable_checkpointing": False, **trainer}
    L.Trainer(**options).fit(module, datamodule=data, ckpt_path=ckpt_path)
    return module


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("lightning") / "tiny", train=256, val=64)


@pytest.fixture(scope="module")
def fashion(tmp_path_factory):
    """The first 10,000 train and 2,000 test images of Fashion-MNIST, through `prepare`."""
    return prepare_fashion_subset(tmp_path_factory.mktemp("fashion"), TRAIN_IMAGES, VAL_IMAGES)


@pytest.mark.slow
def test_fit_fashion_mnist_reaches_the_stated_accuracy(fashion):
    data = TurbotrainDataModule(fashion, batch_size=32, pipeline="pytorch", **CPU)
    module = fit(data, max_epochs=1, steps=TRAIN_IMAGES // 32, num_sanity_val_steps=0)
    assert len(module.seen) == TRAIN_IMAGES // 32  # full batches, the last partial dropped
    assert module.total == VAL_IMAGES  # every val image once, the last batch kept
    accuracy = module.correct / module.total
    assert accuracy >= ACCURACY, f"val accuracy {accuracy:.3f} < {ACCURACY}"
    assert data.train_loader is None and data.val_loader is None  # teardown closed them


def test_mid_epoch_resume_through_lightnings_checkpoint(tiny, tmp_path):
    """16 steps an epoch, 2 epochs; checkpoints every 5 steps by ModelCheckpoint."""
    kwargs = dict(batch_size=16, pipeline="pytorch", **CPU)
    saver = ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=5,
                            save_top_k=-1, save_on_train_epoch_end=False)
    whole = fit(TurbotrainDataModule(tiny, **kwargs), max_epochs=2, steps=32,
                enable_checkpointing=True, callbacks=[saver])
    assert sorted(whole.seen) == list(range(32))
    for step, epoch in ((5, 0), (20, 1)):
        ckpt = tmp_path / f"step={step}.ckpt"
        saved = torch.load(ckpt, weights_only=False)
        # The Loader's position is in Lightning's own fit-loop state.
        state, = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]
        assert (state["epoch"], state["batch_index"]) == (epoch, step - 16 * epoch)
        data = TurbotrainDataModule(tiny, **kwargs)
        data.setup("fit")
        resumed = fit(data, classifier_for(data, steps=32), ckpt_path=ckpt, max_epochs=2)
        assert sorted(resumed.seen) == list(range(step, 32))
        for s in range(step, 32):
            assert resumed.seen[s] == whole.seen[s], f"step {s} after resuming at {step}"


@pytest.mark.parametrize("pipeline", ["pytorch", "resident"])
def test_training_step_sees_the_loaders_own_batches(tiny, pipeline):
    kwargs = dict(batch_size=32, pipeline=pipeline, **CPU)
    module = fit(TurbotrainDataModule(tiny, val_split=None, **kwargs), max_epochs=2,
                 num_sanity_val_steps=0)
    with Loader(tiny, **kwargs) as plain:
        want = []
        for epoch in (0, 1):
            plain.set_epoch(epoch)
            want += [checksums(images) for images, _ in plain]
    got = [module.seen[step][1] for step in sorted(module.seen)]
    assert got == want and len(got) == 2 * 256 // 32
    assert got[:8] != got[8:]  # each epoch its own order and augmentation


@pytest.mark.parametrize("pipeline", ["pytorch", "resident"])
def test_batches_kept_unconsumed_stay_valid(tiny, pipeline):
    """What a fetcher that reads ahead does, at any depth: no batch's memory is reused."""
    with Loader(tiny, batch_size=16, pipeline=pipeline, normalize=False, **CPU) as loader:
        at_arrival, kept = [], []
        for images, labels in loader:
            at_arrival.append(checksums(images))
            kept.append(images)  # not cloned
        assert [checksums(images) for images in kept] == at_arrival
        assert len({id(images.untyped_storage()) for images in kept}) == len(kept)


def test_every_validation_pass_starts_at_the_first_batch(tiny):
    data = TurbotrainDataModule(tiny, batch_size=16, pipeline="pytorch", **CPU)
    data.setup("fit")
    val = data.val_dataloader()
    sanity = [checksums(images) for (images, _), _ in zip(val, range(2))]  # abandoned after 2
    full = [checksums(images) for images, _ in val]
    assert len(full) == len(val) == 4 and full[:2] == sanity
    data.teardown("fit")


def test_transfer_batch_to_device_keeps_batches_already_there(tiny):
    data = TurbotrainDataModule(tiny, batch_size=16, pipeline="pytorch", **CPU)
    batch = (torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64))
    assert data.transfer_batch_to_device(batch, torch.device("cpu"), 0) is batch


def test_arguments_fail_at_construction_in_one_line(tiny):
    with pytest.raises(LoaderError) as error:
        TurbotrainDataModule(tiny, batch_size=0)
    assert str(error.value).startswith("Loader(batch_size=0)") and "\n" not in str(error.value)
    with pytest.raises(LoaderError, match="val_batch_size=-1"):
        TurbotrainDataModule(tiny, val_batch_size=-1)
    with pytest.raises(LoaderError, match=r"call setup\('fit'\) first"):
        TurbotrainDataModule(tiny).train_dataloader()


DDP_SCRIPT = """
import json, sys
import lightning.pytorch as L
from turbotrain.datasets import open_dataset
from turbotrain.lightning import TurbotrainDataModule
from tests.test_lightning import QUIET, Classifier

data_dir, out = sys.argv[1], sys.argv[2]


class Recording(Classifier):
    def on_train_end(self):
        loader = self.trainer.datamodule.train_loader
        with open(f"{out}/rank{self.global_rank}.json", "w") as f:
            json.dump({"world_size": self.trainer.world_size, "batches": len(loader),
                       "seen": [self.seen[s][1] for s in sorted(self.seen)]}, f)


train = open_dataset(data_dir, split="train")
module = Recording(train.num_classes, train.mean, train.std, image_size=16, steps=8)
# Loaders opened by Trainer.fit's setup, once Lightning's launcher made the process group.
data = TurbotrainDataModule(data_dir, batch_size=16, pipeline="pytorch", val_split=None,
                            workers=1, threads=1)
trainer = L.Trainer(**{**QUIET, "devices": 2}, strategy="ddp", max_epochs=1,
                    enable_checkpointing=False)
trainer.fit(module, datamodule=data)
"""


def test_ddp_two_cpu_processes_each_read_their_half(tiny, tmp_path):
    script = tmp_path / "ddp_fit.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    # Its own process group, so a timeout also ends the rank Lightning's launcher started.
    proc = subprocess.Popen([sys.executable, str(script), str(tiny), str(tmp_path)], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the 2-process fit ran over 150 s:\n{err[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, recorded in enumerate(ranks):
        assert recorded["world_size"] == 2 and recorded["batches"] == 256 // 2 // 16
        with Loader(tiny, batch_size=16, pipeline="pytorch", rank=rank, world_size=2,
                    **CPU) as plain:
            assert recorded["seen"] == [checksums(images) for images, _ in plain]
    images = [{c for batch in r["seen"] for c in batch} for r in ranks]
    assert not images[0] & images[1]  # disjoint halves


def test_without_lightning_the_import_says_what_to_install(monkeypatch):
    import importlib
    monkeypatch.setitem(sys.modules, "lightning", None)  # what a missing package looks like
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    monkeypatch.delitem(sys.modules, "turbotrain.lightning")
    with pytest.raises(ImportError) as error:
        importlib.import_module("turbotrain.lightning")
    assert "pip install 'turbotrain[lightning]'" in str(error.value)
    assert "\n" not in str(error.value)
