"""`ffcv`: FFCV's compiled CPU loader over the same `.beton`, behind a watchdog.

    pip install 'turbotrain[ffcv]'   # builds against pkg-config, libopencv-dev, libturbojpeg0-dev
                                     # (`make install` / `.ci/run` install those apt packages)

What FFCV does here: its `Loader` memory-maps the file, compiles the per-field pipelines with
numba and runs them in its own thread (``num_workers`` numba threads decode in parallel, GIL
released), ``batches_ahead`` batches ahead. Images go through `ffcv_decoder.SharedBoxDecoder`
(FFCV's libjpeg-turbo decode + cv2 INTER_AREA resize, with the shared boxes and flips), then
FFCV's ``ToTensor``, ``ToDevice`` (pinned, non-blocking, one CUDA stream per batch slot) and
``ToTorchImage(channels_last=True)``; labels go through ``IntDecoder``. There is no
``NormalizeImage``: pixels stay uint8 until the model's stem, which also keeps us clear of the
CPU hang of FFCV issues #350/#396 (``NormalizeImage`` after ``ToTensor``).

Where we depart from FFCV's defaults, and why:

* Order: FFCV's own RANDOM order is ``default_rng(seed + epoch).permutation`` (and
  ``DistributedSampler`` with ``distributed=True``); QUASI_RANDOM is another order again. Neither
  is the contract's. We skip ``Loader.__iter__`` (five lines) and hand FFCV's epoch iterator
  the concatenated batches of `order.order_for` for this rank (random or quasi-random: FFCV
  reads whatever indices it is given), so `ffcv` yields the same batches as every other
  pipeline: the same rank's slice (DistributedSampler-style ``rank::world``,
  which is what FFCV's ``distributed=True`` would do, so we leave it False rather than slice
  twice), same drop_last, resume at batch k.
* Augmentation: the shared boxes (see ffcv_decoder.py), not numba's unseeded RNG.
* Progressive resizing: as FFCV's own ImageNet example does (``decoder.output_size = (res,
  res)`` before each epoch's iterator), the epoch's size is set on the decoder before its
  epoch iterator is made; each iterator allocates its buffers from the declared shapes again
  and the compiled code reads the output size from them, so nothing is recompiled.
* Hangs: an exception in FFCV's thread kills it silently and ``next()`` then waits forever on
  its queue. Our iterator subclass catches it in the thread and queues it; the consumer waits
  with a deadline (``batch_timeout_s``) and checks that the thread is alive, so every failure
  reaches the caller as one `PipelineError`. The Loader is built under a deadline too
  (`_within`): #350/#396 is an endless loop in its constructor, not in the thread.
* Batch lifetime: FFCV reuses each batch buffer ``batches_ahead + 2`` batches later; we clone
  what we hand out (2.8 ms per 64 x 224 x 224 batch on one CPU thread, against ~33 ms for FFCV
  to decode it on two cores: ~8 %, the price of batches a caller may keep, as with every other
  pipeline; on a GPU the clone is a device copy of microseconds).
* Threads: FFCV's ``Compiler.set_num_threads`` also calls ``torch.set_num_threads`` in the
  calling thread. It only runs in FFCV's threads here (Loader build, epoch iterator), never in
  the caller's, so the trainer's thread budget stands; `_keep_torch_threads` guards that.
* numba: FFCV 1.0.2 mutates one of numba's interned types, which breaks compiled functions as
  soon as a second Loader exists (train + eval); `_patch_ffcv_state_type` fixes that.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
import types
from contextlib import contextmanager
from queue import Empty, Full, Queue

import numpy as np
import torch

from . import augment
from .auto import sharded_reason
from .base import PipelineError, PipelineOptions, PipelineUnavailable
from .cpu_decode import SampleDecodeError
from .ffcv_decoder import STATUS, box_rows, shared_box_decoder_class
from .ordered import OrderedPipeline
from .registry import Capabilities, OptionalPackage, register_pipeline
from .workers import choose_workers

log = logging.getLogger(__name__)

INSTALL_HINT = ("install with: pip install 'turbotrain[ffcv]' (needs the apt packages "
                "pkg-config libopencv-dev libturbojpeg0-dev; `make install` does both)")
# The first batch of a Loader also waits for numba to compile its pipeline (4-8 s on the 2-core
# dev box, 14 s under a test suite's load); a healthy 64 x 224 px batch after that takes ~0.2 s
# there.
FIRST_BATCH_S = 8.0
DEFAULT_BATCH_TIMEOUT_S = 300.0
# FFCV's default: batches decoded ahead of the one being consumed.
BATCHES_AHEAD = 3
# Building a Loader takes ~0.1 s; see `_within`.
BUILD_TIMEOUT_S = 60.0
_POLL_S = 0.5  # how often the consumer re-checks that FFCV's thread is alive
# Last in auto's order: the pytorch pipeline measured >= 1.2x its CPU loader on the same file
# (bench/bench_pipelines.py), so it runs when asked for by name (or when nothing before it can).
CAPABILITIES = Capabilities(
    preference=40, package=OptionalPackage(module="ffcv", distribution="ffcv", label="FFCV"),
    refuses_shards="FFCV's Loader reads one .beton file", first_batch_seconds=FIRST_BATCH_S)


def import_ffcv():
    """The `ffcv` module, or PipelineUnavailable saying how to install it."""
    try:
        import ffcv
        import ffcv.loader  # noqa: F401  (fails on a broken build, not later mid-epoch)
    except ImportError as e:
        raise PipelineUnavailable(f"pipeline 'ffcv' needs FFCV ({e}); {INSTALL_HINT}") from e
    return ffcv


def _within(timeout_s: float, build):
    """build() run in a helper thread; PipelineError if it has not returned in `timeout_s`.

    Building a Loader takes ~0.1 s (numba compiles lazily, at the first batch); FFCV issues
    #350/#396 make it loop forever instead. A Python thread cannot be killed, so a stuck one
    keeps spinning (daemon, it ends with the process), but the caller gets an error, not a hang.
    """
    results: Queue = Queue(maxsize=1)

    def target():
        try:
            results.put((True, build()))
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread below
            results.put((False, e))

    threading.Thread(target=target, name="turbotrain-ffcv-build", daemon=True).start()
    try:
        ok, value = results.get(timeout=timeout_s)
    except Empty:
        raise PipelineError(
            f"ffcv: building its Loader did not finish within {timeout_s:.0f} s; FFCV loops "
            f"forever on a compiled op after ToTensor (FFCV issues #350/#396)") from None
    if not ok:
        raise value
    return value


@contextmanager
def _keep_torch_threads():
    """FFCV's Compiler.set_num_threads calls torch.set_num_threads; undo that on exit."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def _patch_ffcv_state_type() -> None:
    """Stops FFCV 1.0.2 from corrupting numba's type cache (idempotent).

    ``OSCacheManager.state_type`` takes numba's interned ``uint8[::1]`` type and sets
    ``mutable = False`` on it, in place. That changes the hash of a type already used as a key
    in compiled functions' overload tables, so once a second Loader exists numba raises
    KeyError (as "Exception ignored in finalize", or mid-epoch in the loader thread). The
    replacement builds the same read-only type as a new object.
    """
    import numba
    from ffcv.memory_managers.os_cache import OSCacheManager
    from ffcv.pipeline.compiler import Compiler
    if getattr(OSCacheManager, "_turbotrain_patched", False):
        return

    def readonly_bytes():
        return numba.types.Array(numba.uint8, 1, "C", readonly=True)

    def state_type(self):
        pointers = numba.types.Array(numba.uint64, 1, "C")
        return numba.types.Tuple([readonly_bytes(), pointers, pointers])

    def compile_reader(self):  # FFCV's, with the read-only return type spelled out
        def read(address, mem_state):
            size = mem_state[2][np.searchsorted(mem_state[1], address)]
            return mem_state[0][address:address + size]
        return Compiler.compile(read, readonly_bytes()(numba.uint64, self.state_type))

    OSCacheManager.state_type = property(state_type)
    OSCacheManager.compile_reader = compile_reader
    OSCacheManager._turbotrain_patched = True


class _Failure:
    """An exception raised in FFCV's thread, queued for the consumer."""

    def __init__(self, error: BaseException):
        self.error = error


class _Stopped(Exception):
    """Raised in FFCV's thread when the consumer has gone (ends the thread quietly)."""


@functools.cache
def _host_only(base):
    """FFCV's EpochIterator with its `IS_CUDA` read as False. FFCV sets that flag once per
    process (torch.cuda.is_available()), so on a GPU host a CPU-device pipeline made a CUDA
    stream per batch slot and an event per batch (a context on GPU 0, ~500 MB there) for
    batches that never leave the host. Its methods are rebound to its module's globals with
    the flag off; nothing of FFCV is changed for a CUDA pipeline beside it."""
    methods = {}
    for name in ("__init__", "run", "run_pipeline", "__next__"):
        f = base.__dict__[name]
        methods[name] = types.FunctionType(f.__code__, {**f.__globals__, "IS_CUDA": False},
                                           f.__name__, f.__defaults__, f.__closure__)
    return type(f"{base.__name__}OnHost", (base,), methods)


def _watched_iterator_class(cuda: bool):
    from ffcv.loader.epoch_iterator import EpochIterator

    class WatchedEpochIterator(EpochIterator if cuda else _host_only(EpochIterator)):
        """FFCV's epoch iterator with shared boxes, decode checks and failures forwarded."""

        def __init__(self, loader, order, *, owner: "FfcvPipeline", epoch: int):
            self.owner, self.epoch = owner, epoch
            super().__init__(loader, order)  # starts the thread

        def run(self):
            try:
                super().run()
            except _Stopped:
                pass
            except BaseException as e:  # noqa: BLE001 - every failure must reach the consumer
                self._deliver(_Failure(e))

        def _deliver(self, item) -> None:
            while not self.terminate_event.is_set():
                try:
                    self.output_queue.put(item, timeout=_POLL_S)
                    return
                except Full:
                    pass

        def run_pipeline(self, b_ix, batch_indices, batch_slot, cuda_event):
            if self.terminate_event.is_set():
                raise _Stopped()
            boxes = self.memory_allocations["operation"][self.owner.decoder_node][2]
            boxes = boxes[batch_slot][:len(batch_indices)]
            boxes[:] = self.owner.box_rows(self.epoch, np.asarray(batch_indices, np.int64))
            result = super().run_pipeline(b_ix, batch_indices, batch_slot, cuda_event)
            failed = np.flatnonzero(boxes[:, STATUS])
            if failed.size:
                i = int(batch_indices[failed[0]])
                raise SampleDecodeError(
                    f"{self.owner.dataset.beton.path}: sample {i} does not decode as a JPEG "
                    f"(FFCV's libjpeg-turbo returned {int(boxes[failed[0], STATUS])})")
            return result

        def next_batch(self, timeout_s: float):
            """The next batch's outputs, or a one-line PipelineError; never waits longer than
            `timeout_s` for a batch."""
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    item = self.output_queue.get(timeout=_POLL_S)
                    break
                except Empty:
                    if not self.is_alive() and self.output_queue.empty():
                        raise PipelineError("ffcv: its loader thread ended without a batch "
                                            "or an error") from None
                    if time.monotonic() > deadline:
                        raise PipelineError(
                            f"ffcv: no batch within {timeout_s:.0f} s (its thread is "
                            f"{'alive' if self.is_alive() else 'dead'}); stopping") from None
            if item is None:  # FFCV's end of epoch, before the batches we asked for
                raise PipelineError("ffcv: its loader ended the epoch early (a bug: please "
                                    "report it)")
            if isinstance(item, _Failure):
                if isinstance(item.error, PipelineError):
                    raise item.error
                first = next((line for line in str(item.error).splitlines() if line.strip()),
                             "")
                raise PipelineError(f"ffcv: {type(item.error).__name__} in its loader thread: "
                                    f"{first.strip()}") from item.error
            slot, result = item
            if cuda:
                self.current_stream.wait_stream(self.cuda_streams[slot])
            return result

        def shutdown(self, timeout_s: float = 10.0) -> None:
            """Stops the thread after at most the batch it is working on."""
            self.terminate_event.set()
            if self.is_alive():
                self.join(timeout_s)
            if self.is_alive():
                log.warning("ffcv: its loader thread did not stop within %.0f s", timeout_s)
            self.close()

    return WatchedEpochIterator


class FfcvPipeline(OrderedPipeline):
    name = "ffcv"

    def __init__(self, dataset, options: PipelineOptions, *,
                 batch_timeout_s: float = DEFAULT_BATCH_TIMEOUT_S):
        num_shards = getattr(dataset, "num_shards", 1)
        if num_shards > 1:  # FFCV's Loader maps one file; it cannot read a list of shards
            raise PipelineUnavailable(
                f"pipeline 'ffcv': {sharded_reason(CAPABILITIES, num_shards)}")
        super().__init__(dataset, options)
        import_ffcv()
        _patch_ffcv_state_type()
        if self.device.type not in ("cpu", "cuda"):
            raise PipelineUnavailable(f"pipeline 'ffcv' runs on cpu or cuda, not {self.device}")
        self.workers, why = choose_workers(options.workers, self.device)
        self.batch_timeout_s = batch_timeout_s
        self.family = augment.choose_augmentation(dataset.heights, dataset.widths,
                                                  train=options.train)
        self._heights = np.asarray(dataset.heights, dtype=np.int64)
        self._widths = np.asarray(dataset.widths, dtype=np.int64)
        self._iterator_class = _watched_iterator_class(self.device.type == "cuda")
        self.decoder = shared_box_decoder_class()(options.image_size, self.family)
        with _keep_torch_threads():
            self.loader = _within(BUILD_TIMEOUT_S, self._make_loader)
        self.decoder_node = next(node.id for node in self.loader.graph.nodes
                                 if getattr(node, "decoder", None) is self.decoder)
        self._iterator = None
        log.info("ffcv pipeline: %d threads (%s), augmentation %s", max(1, self.workers), why,
                 self.family)

    def _make_loader(self):
        from ffcv.fields.basics import IntDecoder
        from ffcv.loader import Loader, OrderOption
        from ffcv.transforms import Squeeze, ToDevice, ToTensor
        beton = self.dataset.beton
        image_name = beton.field_names[int(beton.image_field[1:])]
        label_name = beton.field_names[int(beton.label_field[1:])]
        pipelines = {name: None for name in beton.field_names}  # other fields: not decoded
        # ToDevice only on CUDA: on the CPU it would copy every batch once more before our
        # clone (a second ~2.8 ms memcpy per 9.6 MB batch for nothing).
        to_device = ([ToDevice(self.device, non_blocking=True)]
                     if self.device.type == "cuda" else [])
        pipelines[image_name] = [self.decoder, *self._image_ops(to_device)]
        pipelines[label_name] = [IntDecoder(), ToTensor(), Squeeze(1), *to_device]
        # FFCV returns the pipelines' outputs in the order of the file's fields.
        decoded = [name for name in beton.field_names if pipelines[name] is not None]
        self._positions = (decoded.index(image_name), decoded.index(label_name))
        # order/distributed/seed only shape FFCV's own traversal, which we never use (see the
        # module docstring); SEQUENTIAL keeps its constructor from touching torch.distributed.
        return Loader(str(beton.path), batch_size=self.options.batch_size,
                      num_workers=max(1, self.workers), order=OrderOption.SEQUENTIAL,
                      distributed=False, seed=self.options.seed, os_cache=True,
                      pipelines=pipelines, drop_last=self.options.drops_last,
                      batches_ahead=BATCHES_AHEAD)

    def _image_ops(self, to_device: list) -> list:
        """What follows the decoder. Compiled (numba) ops must all come before ToTensor:
        FFCV's stage grouping loops forever on compiled -> Python -> compiled (#350/#396,
        e.g. NormalizeImage after ToTensor on the CPU); `_within` turns that into an error."""
        from ffcv.transforms import ToTensor, ToTorchImage
        return [ToTensor(), *to_device, ToTorchImage(channels_last=True)]

    def box_rows(self, epoch: int, indices: np.ndarray) -> np.ndarray:
        """The decoder's per-sample rows for `indices` (called in FFCV's thread)."""
        boxes = augment.crop_boxes(self.family, seed=self.options.seed, epoch=epoch,
                                   indices=indices, heights=self._heights[indices],
                                   widths=self._widths[indices],
                                   image_size=self.options.image_size,
                                   crop_ratio=self.options.crop_ratio,
                                   scale=self.options.scale, ratio=self.options.ratio)
        return box_rows(boxes)

    def _produce(self, epoch: int, batches: list[np.ndarray]):
        if not batches:
            return
        self.close()  # a pass abandoned without closing its generator (not seen in CPython)
        order = np.concatenate(batches).astype(np.uint64)
        size = self.decode_size(epoch)
        self.decoder.output_size = (size, size)  # read when the iterator allocates its buffers
        with _keep_torch_threads():
            iterator = self._iterator_class(self.loader, order, owner=self, epoch=epoch)
        self._iterator = iterator
        try:
            for _ in batches:
                result = iterator.next_batch(self.batch_timeout_s)
                images, labels = (result[k] for k in self._positions)
                # Clones: FFCV reuses these buffers a few batches later (module docstring).
                # The copy runs in this thread while FFCV's threads decode the next batches.
                yield images.clone(memory_format=torch.channels_last), labels.clone()
        finally:
            if self._iterator is iterator:
                self._iterator = None
            iterator.shutdown()

    def close(self) -> None:
        if self._iterator is not None:
            self._iterator.shutdown()
            self._iterator = None


@register_pipeline("ffcv", CAPABILITIES)
def build_ffcv(dataset, options: PipelineOptions) -> FfcvPipeline:
    return FfcvPipeline(dataset, options)
