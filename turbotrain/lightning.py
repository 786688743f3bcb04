"""Lightning: `TurbotrainDataModule`, turbotrain's Loaders as a LightningDataModule.

    pip install 'turbotrain[lightning]'

    from turbotrain.lightning import TurbotrainDataModule
    data = TurbotrainDataModule("OUT", batch_size=256, image_size=224, normalize=True)
    lightning.Trainer(max_epochs=16).fit(model, datamodule=data)

`setup()` opens one `turbotrain.Loader` per split (train, val) once Lightning has placed this
process: the device is the strategy's root device and rank / world size are the trainer's
(under DDP the process group exists by then, and the Loader checks that they agree), and
`teardown()` closes them. What Lightning does around dataloaders, and what this module does
about it (read in lightning 2.6's loops/fit_loop.py, loops/fetchers.py,
utilities/combined_loader.py):

* Epochs: Lightning calls `set_epoch` only on a DataLoader's sampler. The train split is
  handed to Lightning as `EpochLoader`, whose iteration starts with
  `Loader.set_epoch(trainer.current_epoch)`, so every epoch has its own order and
  augmentation, and a resumed epoch the one it had.
* Mid-epoch resume: Lightning saves the `state_dict()` of every train dataloader that has one
  in its own checkpoint (the fit loop's "combined_loader" state) and, on
  `Trainer.fit(ckpt_path=...)`, calls `load_state_dict()` before iterating. `EpochLoader`
  passes both to the Loader, whose position is the batches it handed out, so a run resumed
  from a checkpoint saved after step k trains on batch k + 1 onwards of that epoch.
* Prefetching and buffers: Lightning's fetcher reads one batch ahead only when the loader has
  no length (ours have one); and no turbotrain pipeline reuses a batch's memory for a later
  batch (pytorch and resident allocate each batch, ffcv clones FFCV's reused buffers, DALI 2's
  dynamic executor returns fresh outputs), so a batch stays valid however far ahead anything
  reads (tests/test_lightning.py checks what `training_step` sees against a plain iteration).
* Evaluation: every validation pass (the sanity check's 2 batches, then each epoch's) starts
  at the split's first batch.
* Device: batches are already on the module's device, so `transfer_batch_to_device` hands
  them on untouched instead of walking them through Lightning's generic copy.
"""
from __future__ import annotations

from typing import Iterator

import torch

try:
    import lightning.pytorch as pl
except ImportError as exc:  # one line saying what to install
    raise ImportError("turbotrain.lightning needs Lightning: pip install "
                      "'turbotrain[lightning]' (or pip install lightning)") from exc

from turbotrain.train.config.config import AUTO
from turbotrain.train.engine import loader as loader_module
from turbotrain.train.engine.loader import Loader, LoaderError

__all__ = ["EpochLoader", "TurbotrainDataModule"]


class EpochLoader:
    """A Loader as Lightning iterates it (the module docstring): its length, its batches,
    `set_epoch(epoch_of())` at the start of each pass (train), or each pass from the first
    batch (evaluation), and its state for Lightning's checkpoint."""

    def __init__(self, loader: Loader, epoch_of=None):
        self.loader = loader
        self._epoch_of = epoch_of  # None: evaluation, every pass from the start

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # A generator: Lightning calls iter() to check that a loader is iterable and throws
        # the iterator away, so nothing may happen before the first batch is asked for.
        if self._epoch_of is None:
            self.loader.load_state_dict({"epoch": self.loader.epoch, "batch_index": 0})
        else:
            self.loader.set_epoch(self._epoch_of())
        yield from self.loader

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)

    def __repr__(self) -> str:
        return f"EpochLoader({self.loader!r})"


class TurbotrainDataModule(pl.LightningDataModule):
    """The train and val splits of a prepared dataset as turbotrain Loaders.

    data: prepare-dataset's OUT folder (or a .beton, or a URL). train_split / val_split: the
    split names; val_split=None: no validation. val_batch_size: default batch_size. device:
    default the trainer's (the strategy's root device). The other arguments are
    `turbotrain.Loader`'s, under the same names (`workers` as in timm's `--workers`); the
    val Loader takes the train Loader's planned pipeline and image size, as `train` does.
    On CPU, setup() gives torch the Loader's share of the cores (`Loader.torch_threads`: two
    torch threads competing with decode work were measured to slow a step 30x) and teardown()
    puts the previous count back."""

    def __init__(self, data, *, batch_size: int = 256, image_size: int | None = None,
                 pipeline: str = AUTO, normalize: bool = False, dtype: torch.dtype | None = None,
                 workers: int | None = None, threads: int | None = None, seed: int = 0,
                 train_split: str = "train", val_split: str | None = "val",
                 val_batch_size: int | None = None, device=None, worker_mode: str = AUTO,
                 order: str = AUTO, order_window: int = 4,
                 scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3),
                 cache_dir: str | None = None, cache_limit: str | None = None,
                 aa: str | None = None, color_jitter: float = 0.0, reprob: float = 0.0,
                 remode: str = "pixel", recount: int = 1):
        super().__init__()
        if val_batch_size is not None and (not isinstance(val_batch_size, int)
                                           or isinstance(val_batch_size, bool)
                                           or val_batch_size < 1):
            raise LoaderError(f"TurbotrainDataModule(val_batch_size={val_batch_size!r}): "
                              "needs an integer >= 1, or None for batch_size")
        self.data = data
        self.train_split, self.val_split = train_split, val_split
        self.batch_size = batch_size
        self.val_batch_size = batch_size if val_batch_size is None else val_batch_size
        self.device_request = device
        self.options = dict(image_size=image_size, pipeline=pipeline, normalize=normalize,
                            dtype=dtype, workers=workers, threads=threads, seed=seed,
                            worker_mode=worker_mode, order=order, order_window=order_window,
                            scale=scale, ratio=ratio, cache_dir=cache_dir,
                            cache_limit=cache_limit, aa=aa, color_jitter=color_jitter,
                            reprob=reprob, remode=remode, recount=recount)
        # A bad argument fails here, as one LoaderError line naming it, not at fit time.
        for split, size in ((train_split, batch_size), (val_split, self.val_batch_size)):
            if split is not None:
                _check_loader_arguments(data, split, size, device, self.options)
        self.train_loader: Loader | None = None
        self.val_loader: Loader | None = None
        self._threads_before: int | None = None

    # -- Lightning's hooks
    def setup(self, stage: str) -> None:
        """Opens the Loaders `stage` needs ("fit": train and val, "validate": val), once."""
        if stage == "fit" and self.train_loader is None:
            self.train_loader = self._open(self.train_split, self.batch_size, self.options)
            self._share_cores(self.train_loader)
        if stage in ("fit", "validate") and self.val_split and self.val_loader is None:
            options = dict(self.options)
            if self.train_loader is not None:  # the train plan's pipeline and image size
                options.update(pipeline=self.train_loader.pipeline_name,
                               image_size=self.train_loader.image_size)
            self.val_loader = self._open(self.val_split, self.val_batch_size, options)
            if self.train_loader is None:
                self._share_cores(self.val_loader)

    def train_dataloader(self) -> EpochLoader:
        loader = self._opened(self.train_loader, "train_dataloader", "fit")
        return EpochLoader(loader, epoch_of=self._current_epoch)

    def val_dataloader(self) -> EpochLoader | list:
        if not self.val_split:
            return []  # Lightning runs no validation on an empty list
        return EpochLoader(self._opened(self.val_loader, "val_dataloader", "fit' or 'validate"))

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):
        """Our (images, labels) are on the device already: handed on as they are (Lightning's
        own hook rebuilds the batch and calls .to() on every tensor)."""
        parts = batch if isinstance(batch, (tuple, list)) else (batch,)
        if all(isinstance(t, torch.Tensor) and t.device == device for t in parts):
            return batch
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def teardown(self, stage: str) -> None:
        """Closes the Loaders (their threads, worker processes, device memory)."""
        for loader in (self.train_loader, self.val_loader):
            if loader is not None:
                loader.close()
        self.train_loader = self.val_loader = None
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None

    # -- helpers
    def _open(self, split: str, batch_size: int, options: dict) -> Loader:
        trainer = self._trainer_or_none()
        place = {}
        if trainer is not None:
            place = dict(rank=trainer.global_rank, world_size=trainer.world_size)
        device = self.device_request
        if device is None and trainer is not None:
            device = trainer.strategy.root_device
        return Loader(self.data, split, batch_size=batch_size, device=device, **options,
                      **place)

    def _share_cores(self, loader: Loader) -> None:
        if loader.device.type == "cpu" and torch.get_num_threads() != loader.torch_threads:
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(loader.torch_threads)

    def _current_epoch(self) -> int:
        trainer = self._trainer_or_none()
        return 0 if trainer is None else trainer.current_epoch

    def _trainer_or_none(self):
        return getattr(self, "trainer", None)

    def _opened(self, loader: Loader | None, hook: str, stage: str) -> Loader:
        if loader is None:
            raise LoaderError(f"TurbotrainDataModule.{hook}(): call setup('{stage}') first "
                              "(Trainer.fit does)")
        return loader



def _check_loader_arguments(data, split, batch_size, device, options: dict) -> None:
    """Loader's own argument check (one LoaderError line naming the argument)."""
    import inspect
    bound = inspect.signature(Loader).bind(data, split, batch_size=batch_size, device=device,
                                           **options)
    bound.apply_defaults()
    loader_module._check_arguments(dict(bound.arguments))
