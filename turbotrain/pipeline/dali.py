"""`dali`: NVIDIA DALI decodes and augments, fed in the shared sample order.

    pip install 'turbotrain[dali]'          # nvidia-dali-cuda130; its CPU path needs no GPU

On CUDA the JPEGs are decoded by nvJPEG (and the A100/H100 hardware decoder where present)
through ``device="mixed"``; elsewhere DALI runs CPU-only (``device_id=None``) with libjpeg-turbo.
The graph itself is in dali_graph.py. What this module adds around it:

* Order: our `_BatchFeed` hands DALI's ``external_source`` the batches of `order.order_for`
  (random or quasi-random, the same as every pipeline's: each rank's slice, resume at batch k,
  determinism), together with the crop boxes and flips `augment` draws for them. Labels
  never enter DALI: they are looked up for the same indices here, so they cannot get out of
  step with the images.
* Threads: DALI's ``num_threads`` comes from the thread budget (``options.workers``, else
  `workers.choose_workers`), never DALI's default, so DALI and torch do not fight for cores.
* Hand-over: DALI 2's dynamic executor returns fresh output buffers each step; they are wrapped
  with DLPack (no copy, ~9.6 MB saved per 64 x 224 x 224 batch) and viewed as NCHW
  channels_last, the contract's layout.
* Passes: a pass that ends normally leaves the DALI pipeline reusable (``reset()`` restarts
  the feed, ~0 ms); one the caller abandons, or one that failed, has batches in flight, so the
  next pass builds a fresh pipeline (~10 ms on the CPU). So does an epoch of another size under
  progressive resizing (``options.resolution``): the graph's resize to S is fixed when built,
  and a schedule has a handful of sizes, so a rebuild at each change costs less than feeding a
  per-sample size to every batch. The resize runs where the decode does: on the GPU with
  ``device="mixed"``.
* Errors: DALI reports a corrupt JPEG as "sample #k" of whatever batch it was working on and
  then refuses to run again. We re-check the samples of the batches in flight with the
  dataset's strict CPU decoder and raise one `SampleDecodeError` naming the file and the
  dataset index; nothing hangs, because DALI raises in the caller's thread.
"""
from __future__ import annotations

import dataclasses
import logging
from collections import deque

import numpy as np
import torch

from turbotrain.datasets import DatasetError
from turbotrain.datasets.beton.layout import MODE_JPEG, MODE_RAW

from . import augment, kernel
from .base import PipelineError, PipelineOptions, PipelineUnavailable
from .cpu_decode import SampleDecodeError
from .dali_graph import (CROP_SHARED, PLACEHOLDER_RAW, PLACEHOLDER_SIDE, GraphSpec, build_graph,
                         placeholder_jpeg)
from .ordered import OrderedPipeline
from .registry import Capabilities, OptionalPackage, register_pipeline
from .transfer import as_nchw
from .workers import choose_workers

log = logging.getLogger(__name__)

INSTALL_HINT = "install with: pip install 'turbotrain[dali]'"
# Second in auto's order, on CUDA only: nvJPEG decodes on the GPU. Its CPU-only path runs when
# asked for by name but is no reason to pick it.
CAPABILITIES = Capabilities(
    preference=20, needs_cuda="DALI's GPU decode needs a CUDA device", decodes_on_gpu=True,
    cpu_path="DALI's CPU-only decode, libjpeg-turbo on CPU threads",
    package=OptionalPackage(module="nvidia.dali", distribution="nvidia-dali", label="DALI"))


def import_dali():
    """The `nvidia.dali` module, or PipelineUnavailable saying how to install it."""
    try:
        import nvidia.dali
        import nvidia.dali.fn  # noqa: F401  (fails on a broken install, not later mid-build)
    except ImportError as e:
        raise PipelineUnavailable(f"pipeline 'dali' needs NVIDIA DALI ({e}); "
                                  f"{INSTALL_HINT}") from e
    return nvidia.dali


class _BatchFeed:
    """The iterable behind DALI's external_source: one tuple of per-sample inputs per batch.

    DALI calls ``iter()`` on it when the pipeline is built and after each ``reset()``; each
    call starts the pass set by `start`. Batches handed to DALI but not yet returned to the
    caller are kept in `in_flight` (at most prefetch + 1), to name a failing sample.
    """

    def __init__(self, pipeline: "DaliPipeline"):
        self.owner = pipeline
        self.epoch = 0
        self.batches: list[np.ndarray] = []
        self.in_flight: deque[np.ndarray] = deque()

    def start(self, epoch: int, batches: list[np.ndarray]) -> None:
        self.epoch, self.batches = epoch, batches
        self.in_flight.clear()

    def __iter__(self):
        return self._generate()

    def _generate(self):
        # Read the pass at the first next(), not at iter(): DALI calls iter() as soon as a pass
        # runs out (before `start` sets the next one) and next() only after ``reset()``.
        epoch, batches = self.epoch, self.batches
        for indices in batches:
            self.in_flight.append(indices)
            yield self.owner.graph_inputs(epoch, indices)


class DaliPipeline(OrderedPipeline):
    name = "dali"

    def __init__(self, dataset, options: PipelineOptions, *, crop: str = CROP_SHARED,
                 hw_decoder_load: float | None = None):
        super().__init__(dataset, options)
        import_dali()
        self.workers, why = choose_workers(options.workers, self.device)
        self.family = augment.choose_augmentation(dataset.heights, dataset.widths,
                                                  train=options.train)
        self._modes = np.asarray(dataset.modes, dtype=np.uint8)
        self._heights = np.asarray(dataset.heights, dtype=np.int64)
        self._widths = np.asarray(dataset.widths, dtype=np.int64)
        self._labels = np.asarray(dataset.labels, dtype=np.int64)
        has_raw = bool((self._modes == MODE_RAW).any())
        s = options.image_size
        self.spec = GraphSpec(
            family=self.family, image_size=s,
            has_jpeg=bool((self._modes == MODE_JPEG).any()) or not has_raw, has_raw=has_raw,
            resize_small=bool(((self._heights != s) | (self._widths != s)).any()),
            batch_size=options.batch_size, num_threads=max(1, self.workers),
            device_id=self._device_id(), crop=crop, seed=options.seed,
            scale=options.scale, ratio=options.ratio, hw_decoder_load=hw_decoder_load)
        self._placeholder_jpeg = placeholder_jpeg() if self.spec.mixed else None
        self._feed = _BatchFeed(self)
        self._pipe = None
        self._reusable = False  # the last pass ended normally: reset() instead of a rebuild
        log.info("dali pipeline: %s, %s threads (%s), augmentation %s, crop %s",
                 "mixed (GPU) decode" if self.spec.on_gpu else "CPU-only",
                 self.spec.num_threads, why, self.family, crop)

    def _device_id(self) -> int | None:
        if self.device.type == "cpu":
            return None
        if self.device.type != "cuda":
            raise PipelineUnavailable(f"pipeline 'dali' runs on cpu or cuda, not {self.device}")
        return self.device.index if self.device.index is not None else torch.cuda.current_device()

    # -- what DALI is fed -----------------------------------------------------------------------
    def graph_inputs(self, epoch: int, indices: np.ndarray) -> tuple:
        """Per-sample inputs of one batch, in the order of ``self.spec.inputs()``.

        Raises SampleDecodeError for a JPEG whose header declares another size than the
        metadata: nvJPEG (and DALI's CPU decoder) allocate and decode whatever size the header
        declares, up to 65,535 x 65,535, so the header is checked before DALI sees the bytes.
        The batch's payloads are located in one vectorised step (`payload_views`) and their
        headers checked in one call into the decode kernel (`check_headers`, without the GIL);
        bench/bench_kernel.py measures the feed per image against the per-sample Python loop
        it replaced. DALI calls this up to its prefetch depth ahead, so the error can come a
        batch or two before the failing one would have been delivered (those delivered passed
        the same check)."""
        spec, split = self.spec, self.dataset  # payload_views by global index, any shard
        is_jpeg = self._modes[indices] == MODE_JPEG
        views = split.payload_views(indices)
        values: dict[str, object] = {}
        if spec.has_jpeg:
            self._check_headers(indices, is_jpeg, views)
            values["jpeg"] = [view if j else self._placeholder_jpeg
                              for view, j in zip(views, is_jpeg.tolist())]
        if spec.has_raw:
            shapes = zip(self._heights[indices].tolist(), self._widths[indices].tolist())
            values["raw"] = [PLACEHOLDER_RAW if j else view.reshape(h, w, 3)
                             for view, j, (h, w) in zip(views, is_jpeg.tolist(), shapes)]
        if spec.boxed or spec.flips:
            boxes = augment.crop_boxes(self.family, seed=self.options.seed, epoch=epoch,
                                       indices=indices, heights=self._heights[indices],
                                       widths=self._widths[indices],
                                       image_size=self.options.image_size,
                                       crop_ratio=self.options.crop_ratio,
                                       scale=self.options.scale, ratio=self.options.ratio)
            self._box_inputs(values, boxes, is_jpeg)
        if spec.mixed:
            values["is_jpeg"] = is_jpeg.astype(np.uint8)
            values["is_raw"] = (~is_jpeg).astype(np.uint8)
        return tuple(values[name] for name in spec.inputs())

    def _check_headers(self, indices: np.ndarray, is_jpeg: np.ndarray, views: list) -> None:
        """SampleDecodeError for the first JPEG of the batch whose header lies about its size;
        one that cannot be read at all is left to DALI's decode (see _failure)."""
        if kernel.NATIVE is not None:
            addresses, sizes, keep = self.dataset.payload_addresses(indices)
            table = kernel.sample_table(data=addresses, size=sizes,
                                        height=self._heights[indices],
                                        width=self._widths[indices], top=0, left=0, box_h=0,
                                        box_w=0, mode=self._modes[indices], flip=0)
            bad = kernel.NATIVE.check_headers(table)
            del keep
            if bad is not None:
                self._refuse(int(indices[bad[0]]), (bad[1], bad[2]))
            return
        # lazy: cv2 and PIL (~0.2 s) load for a JPEG dataset only
        from turbotrain.datasets.beton.sample_codec import ImageError, stored_jpeg_size
        for i, j, view in zip(indices.tolist(), is_jpeg.tolist(), views):
            if not j:
                continue
            try:
                declared = stored_jpeg_size(view)
            except ImageError:
                continue
            if declared != (int(self._heights[i]), int(self._widths[i])):
                self._refuse(i, declared)

    def _refuse(self, i: int, declared: tuple[int, int]) -> None:
        raise SampleDecodeError(
            f"{self.dataset.where(i)}: its JPEG header declares {declared[1]}x{declared[0]} "
            f"pixels, the metadata {self._widths[i]}x{self._heights[i]}; refused before decoding")

    def _box_inputs(self, values: dict, boxes: augment.CropBoxes, is_jpeg: np.ndarray) -> None:
        spec = self.spec
        anchor = np.stack([boxes.top, boxes.left], axis=1).astype(np.int32)
        shape = np.stack([boxes.height, boxes.width], axis=1).astype(np.int32)
        if spec.family == augment.PAD_CROP:
            anchor += augment.SMALL_IMAGE_PADDING  # boxes are relative to the unpadded image
        if spec.boxed:
            values["anchor"], values["shape"] = anchor, shape
            if "raw_anchor" in spec.inputs():
                # Each branch gets the real box for its samples and the 8x8 stand-in's box
                # for the others.
                stand_in_anchor = np.zeros_like(anchor)
                stand_in_shape = np.full_like(shape, PLACEHOLDER_SIDE)
                jpeg = is_jpeg[:, None]
                values["anchor"] = np.where(jpeg, anchor, stand_in_anchor)
                values["shape"] = np.where(jpeg, shape, stand_in_shape)
                values["raw_anchor"] = np.where(jpeg, stand_in_anchor, anchor)
                values["raw_shape"] = np.where(jpeg, stand_in_shape, shape)
        if spec.flips:
            values["flip"] = boxes.flip.astype(np.int32)

    # -- the passes -----------------------------------------------------------------------------
    def _pipe_for(self, epoch: int, batches: list[np.ndarray]):
        self._feed.start(epoch, batches)
        size = self.decode_size(epoch)
        if size != self.spec.image_size:  # progressive resizing: a graph for this size
            self.spec = dataclasses.replace(self.spec, image_size=size)
            self._pipe, self._reusable = None, False
        if self._pipe is not None and self._reusable:
            self._pipe.reset()  # calls iter(feed): the pass just set
        else:
            self._pipe = None  # drop an abandoned or failed pipeline before building another
            try:
                self._pipe = build_graph(self.spec, self._feed)
            except RuntimeError as e:
                raise PipelineError(f"dali: could not build the pipeline: "
                                    f"{_dali_reason(e)}") from e
        self._reusable = False
        return self._pipe

    def _produce(self, epoch: int, batches: list[np.ndarray]):
        if not batches:
            return
        pipe = self._pipe_for(epoch, batches)
        for position in range(len(batches)):
            images = self._run(pipe)
            indices = self._feed.in_flight.popleft()
            if position == len(batches) - 1:
                # Reach the feed's end now, so the pass counts as finished (and the pipeline
                # is reused) even when the caller stops right after the last batch.
                self._reusable = self._ended(pipe)
            yield as_nchw(images), self._device_labels(indices)

    def _run(self, pipe) -> torch.Tensor:
        try:
            (output,) = run_on_our_stream(pipe, self.device)
        except StopIteration:
            raise PipelineError("dali: the pipeline ran out of batches before the epoch "
                                "ended (a bug: please report it)") from None
        except SampleDecodeError:  # raised by our own feed (graph_inputs): already one line
            self._pipe = None
            raise
        except RuntimeError as e:
            self._pipe = None  # DALI refuses to run again after an error
            raise self._failure(e) from None
        return torch.from_dlpack(output.as_tensor())  # zero-copy

    def _ended(self, pipe) -> bool:
        try:
            run_on_our_stream(pipe, self.device)
        except StopIteration:
            return True
        except RuntimeError:
            return False
        return False  # more batches than expected: never reuse this pipeline

    def _device_labels(self, indices: np.ndarray) -> torch.Tensor:
        labels = torch.from_numpy(self._labels[indices])
        if self.device.type == "cuda":
            return labels.pin_memory().to(self.device, non_blocking=True)
        return labels

    def _failure(self, error: RuntimeError) -> PipelineError:
        """One line naming the failing sample when a stored sample is to blame."""
        reason = _dali_reason(error)
        for indices in self._feed.in_flight:
            for i in indices.tolist():
                try:
                    self.dataset.image(i)
                except DatasetError:
                    what = "JPEG" if self._modes[i] == MODE_JPEG else "raw image"
                    return SampleDecodeError(
                        f"{self.dataset.where(i)} does not decode as a {what} "
                        f"(DALI: {reason})")
        return PipelineError(f"dali: {reason}")

    def close(self) -> None:
        self._pipe = None
        self._reusable = False


def run_on_our_stream(pipe, device: torch.device) -> tuple:
    """One `pipe.run()` whose GPU outputs are ordered before our work, explicitly: DALI binds
    them to torch's current stream (run's `cuda_stream`, exec_dynamic), making that stream
    wait for DALI's own before anything we queue reads them. Without a stream DALI would wait
    on the host instead (a sync per batch); the DLPack export's implicit wait is not relied on.
    On a CPU device the outputs are host memory: nothing to order."""
    if device.type != "cuda":
        return pipe.run()
    return pipe.run(torch.cuda.current_stream(device))


def _dali_reason(error: BaseException) -> str:
    """The informative line of DALI's multi-line error (the one after "encountered:")."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for k, line in enumerate(lines):
        if line == "encountered:" and k + 1 < len(lines):
            return lines[k + 1]
    return lines[-1] if lines else type(error).__name__


@register_pipeline("dali", CAPABILITIES)
def build_dali(dataset, options: PipelineOptions) -> DaliPipeline:
    return DaliPipeline(dataset, options)
