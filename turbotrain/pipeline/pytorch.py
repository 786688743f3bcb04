"""`pytorch`: the CPU input pipeline that needs nothing beyond torch, numpy and our decode kernel.

A batch is one task: decoded, cropped, resized and flipped into a freshly allocated uint8 NHWC
batch by `cpu_decode` (one call into the compiled kernel, csrc/; the Python decode path where
the kernel is not built). Two ways to run the tasks, side by side in `turbotrain bench`:

* ``threads`` (default): `cpu_decode.DecodeAhead` keeps a few batches queued on the kernel's
  own thread pool, whose threads never take the GIL: a training loop's Python-busy main thread
  beside them costs them nothing (bench/bench_kernel.py measures both modes beside such a
  thread), and nothing crosses a process boundary (a 64 x 224 px batch is 9.6 MB).
* ``processes``: a ``torch.utils.data.DataLoader`` over a batch sampler with ``num_workers``
  worker processes, ``persistent_workers``, ``prefetch_factor`` and ``pin_memory`` on CUDA;
  workers write into shared memory directly (no copy on the way back), each making one kernel
  call per batch. What the Python decode path needs beside a busy main thread.

Both hand host batches to `transfer.to_device` (pinned, non-blocking copy on a side stream on
CUDA). A sample that fails to decode raises one `SampleDecodeError` line naming the file and
the sample, in the caller's thread, never a hang.
"""
from __future__ import annotations

import logging
from typing import Iterator

import numpy as np
import torch

from turbotrain.datasets.beton import map_guard
from turbotrain.datasets.beton.shards import LocalShard

from . import kernel, worker_death
from .base import PipelineError, PipelineOptions
from .cpu_decode import ONE_CV2_THREAD, BatchDecoder, DecodeAhead
from .ordered import OrderedPipeline
from .registry import Capabilities, register_pipeline
from .transfer import to_device
from .workers import choose_workers

log = logging.getLogger(__name__)

# Batches queued ahead per worker: 2 keeps every worker busy while the consumer takes one
# (the DataLoader default too); more only holds more 9.6 MB batches in memory.
PREFETCH_PER_WORKER = 2


def _host_batch(decoder: BatchDecoder, labels: np.ndarray, epoch: int, indices: np.ndarray,
                size: int, *, shared: bool = False, pinned: bool = False):
    """Decodes one batch into a new uint8 (B, S, S, 3) tensor of S = `size` (the epoch's);
    returns (images, labels)."""
    shape = (len(indices), size, size, 3)
    if shared:
        # What torch's default_collate does in a worker: allocate in shared memory up front so
        # sending the batch to the main process copies nothing.
        storage = torch.UntypedStorage._new_shared(int(np.prod(shape)))
        images = torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)
    else:
        images = torch.empty(shape, dtype=torch.uint8, pin_memory=pinned)
    decoder.decode(indices, epoch, images.numpy())
    return images, torch.from_numpy(labels[indices])


class _ThreadBatches:
    """Batches decoded ahead of the consumer by `cpu_decode.DecodeAhead` (native threads, or
    the Python path's thread pool)."""

    def __init__(self, decoder: BatchDecoder, labels: np.ndarray, workers: int, pinned: bool):
        self.labels, self.pinned = labels, pinned
        self.workers = max(1, workers)
        self.ahead = DecodeAhead(decoder, self.workers)

    def run(self, epoch: int, size: int, batches: list[np.ndarray], upcoming=None) -> Iterator:
        def allocate(indices: np.ndarray) -> torch.Tensor:
            return torch.empty((len(indices), size, size, 3), dtype=torch.uint8,
                               pin_memory=self.pinned)

        for indices, images in self.ahead.run(epoch, batches, allocate, upcoming):
            yield images, torch.from_numpy(self.labels[indices])

    def close(self) -> None:
        self.ahead.close()


class _BatchTasks(torch.utils.data.Dataset):
    """Map-style dataset whose keys are whole batches: (epoch, size, indices) -> (images, labels).

    A decode error is returned as a value rather than raised: the DataLoader would re-raise it
    wrapped in a multi-line "Caught ... in DataLoader worker" message; we raise the one line.
    """

    def __init__(self, decoder: BatchDecoder, labels: np.ndarray):
        self.decoder, self.labels = decoder, labels

    def __getitem__(self, key):
        epoch, size, indices = key
        try:
            return _host_batch(self.decoder, self.labels, epoch, indices, size, shared=True)
        except PipelineError as e:
            return _Failure(str(e))

    def __len__(self) -> int:  # only used by DataLoader's length hints
        return 0


class _Failure:
    def __init__(self, message: str):
        self.message = message


class _EpochKeys(torch.utils.data.Sampler):
    """The DataLoader's sampler: the keys of the batches of the epoch being iterated."""

    def __init__(self):
        self.keys: list = []

    def __iter__(self):
        return iter(self.keys)

    def __len__(self) -> int:
        return len(self.keys)


def _worker_init(_worker_id: int) -> None:
    """Process setup of a worker: one decode stream per process, no intra-op pools."""
    import cv2
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    # torch's worker SIGBUS handler replaced ours; a shrunk .beton is reported by the parent.
    map_guard.guard_quietly()


class _ProcessBatches:
    """Batches from a torch DataLoader with worker processes (see the module docstring)."""

    def __init__(self, decoder: BatchDecoder, labels: np.ndarray, workers: int, pinned: bool):
        self.keys = _EpochKeys()
        self.loader = torch.utils.data.DataLoader(
            _BatchTasks(decoder, labels), batch_size=None, sampler=self.keys,
            num_workers=workers, persistent_workers=workers > 0,
            prefetch_factor=PREFETCH_PER_WORKER if workers > 0 else None,
            pin_memory=pinned, worker_init_fn=_worker_init if workers > 0 else None,
            collate_fn=_no_collate,
            multiprocessing_context=_start_method(decoder.dataset) if workers > 0 else None)

    def run(self, epoch: int, size: int, batches: list[np.ndarray], upcoming=None) -> Iterator:
        self.keys.keys = [(epoch, size, indices) for indices in batches]
        iterator = iter(self.loader)
        worker_death.watch(self)  # after iter: torch's SIGCHLD handler is set by then
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                return
            except (RuntimeError, ConnectionError, EOFError) as exc:
                # A worker that died surfaces here as torch's RuntimeError or a broken
                # shared-memory hand-over; anything else is not ours to translate.
                error = worker_death.as_pipeline_error(exc, self.worker_processes)
                if error is None:
                    raise
                raise error from None
            if isinstance(batch, _Failure):
                raise PipelineError(batch.message)
            yield batch

    def worker_processes(self) -> list:
        """The live DataLoader's worker processes in worker-id order (none before the first
        epoch or with 0 workers)."""
        return list(getattr(getattr(self.loader, "_iterator", None), "_workers", ()))

    def close(self) -> None:
        iterator = getattr(self.loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()  # persistent workers otherwise live until exit
        self.loader._iterator = None


def _no_collate(batch):
    return batch


def _start_method(dataset) -> str | None:
    """How worker processes start: fork (torch's default on Linux: the split's maps are
    inherited, nothing is pickled), unless a shard is remote. The object-store client's runtime,
    the cache's prefetch threads and its file locks do not survive fork (a forked worker hung
    for good in our suite while the parent prefetched), so those workers start fresh and open
    the split they are sent (PreparedSplit pickles without maps or hooks)."""
    shards = getattr(dataset, "shards", ())
    return "spawn" if any(not isinstance(s, LocalShard) for s in shards) else None


# How the batch tasks run; an unknown name lists the choices.
MODES = {"threads": _ThreadBatches, "processes": _ProcessBatches}
DEFAULT_MODE = "threads"


class PyTorchPipeline(OrderedPipeline):
    """The `pytorch` pipeline; `mode` is "threads" (default) or "processes" (see MODES).

    ``workers`` (from the options, else `choose_workers`) decode threads or worker processes;
    0 means decoding in the caller (processes mode) or a single thread (threads mode).
    """
    name = "pytorch"

    def __init__(self, dataset, options: PipelineOptions, *, mode: str | None = None):
        super().__init__(dataset, options)
        mode = mode or options.worker_mode or DEFAULT_MODE
        if mode not in MODES:
            raise PipelineError(f"unknown pytorch pipeline mode {mode!r}; choose one of: "
                                f"{', '.join(MODES)}")
        self.workers, why = choose_workers(options.workers, self.device)
        self.mode = mode
        self.decoder = BatchDecoder(dataset, image_size=options.image_size, train=options.train,
                                    seed=options.seed, crop_ratio=options.crop_ratio,
                                    scale=options.scale, ratio=options.ratio)
        labels = np.asarray(dataset.labels, dtype=np.int64)
        pinned = self.device.type == "cuda"
        self.source = MODES[mode](self.decoder, labels, self.workers, pinned)
        # processes mode: one cv2 thread in this process before the DataLoader forks workers
        # (held_setting.py: a fork beside a live cv2 pool hangs the worker's own setting), and
        # for the Python path when this process decodes (no workers). threads mode: DecodeAhead
        # holds it where the Python path runs. Given back in close.
        self._release_cv2 = (ONE_CV2_THREAD.hold() if mode == "processes"
                             else _nothing_to_release)
        log.info("pytorch pipeline: %s, %s, augmentation %s, %s", mode, why, self.decoder.family,
                 kernel.STATUS)

    def _produce(self, epoch: int, batches: list[np.ndarray]):
        # The next epoch's batches, for DecodeAhead to draw their first boxes early: a training
        # loop's next epoch is usually epoch + 1 from its start (anything else is redrawn).
        return to_device(self.source.run(epoch, self.decode_size(epoch), batches,
                                         lambda: self.order.batches(epoch + 1)),
                         self.device)

    def close(self) -> None:
        self.source.close()
        self._release_cv2()


def _nothing_to_release() -> None:
    pass


# Third in auto's order: the CPU pipeline that needs nothing optional and runs anywhere;
# measured >= 1.2x FFCV's CPU loader on the same file (bench/bench_pipelines.py), so it comes
# before ffcv.
CAPABILITIES = Capabilities(preference=30)


@register_pipeline("pytorch", CAPABILITIES)
def build_pytorch(dataset, options: PipelineOptions) -> PyTorchPipeline:
    return PyTorchPipeline(dataset, options)
