"""The DALI graph behind the `dali` pipeline: what runs inside DALI for one split.

Everything DALI sees comes from one ``fn.external_source`` in batch mode, fed by `dali.py` in the
shared sample order (order.py), so the ranks' slices, determinism and mid-epoch resume are the
contract's, not DALI's reader's. Per sample it receives the stored bytes (a 1-D uint8 JPEG
stream, or the HWC uint8 array of a raw sample), the crop box and the flip bit that `augment`
drew for (seed, epoch, index): the same parameters every other pipeline uses, so a `dali` batch
shows the same crops as a `pytorch` batch. Per family (see augment.py):

* RESIZED_CROP (train) and CENTRE_CROP (eval): ``decoders.image_slice`` decodes only the box
  (libjpeg-turbo on the CPU, nvJPEG / the A100+ hardware decoder with ``device="mixed"``), then
  ``resize`` to S x S (linear, antialiased when shrinking) and ``flip``. Feeding our boxes
  costs nothing measurable against DALI's own ``decoders.image_random_crop`` (2-core box,
  bench/bench_engines.py, best of 3: 1,394 vs 1,408 images/s), which is kept as
  ``crop="dali"`` for that comparison only (its RNG is DALI's: crops then differ from the
  other pipelines'). On the CPU the ROI decode is fast (1,790 images/s per thread for 500x375
  q90, vs simplejpeg's 1,770 full decodes) but DALI's CPU resize adds ~0.7 ms per image
  (1,790 -> 790 images/s per thread), where cv2's INTER_LINEAR in `pytorch` costs ~60 us:
  `dali` is the GPU engine, `pytorch` stays the CPU one (2,910 vs 1,394 images/s here).
* PAD_CROP (small images, train): decode/reshape, resize to S x S when the stored size differs,
  reflect-pad by SMALL_IMAGE_PADDING (DALI has no reflect padding, so two mirrored strips are
  sliced and concatenated per axis), slice the S x S box, flip.
* IDENTITY (small images, eval): decode/reshape and resize to S x S when needed.

Splits that mix JPEG and raw samples (prepare's ``--encoding auto`` on sources with both small
and large images) run both branches for every sample, the unused one on an 8x8 stand-in, and
keep the right one with a 0/1 mask (``a * is_jpeg + b * is_raw``); DALI 2.4 has no public
per-sample select, and its conditionals are not documented for mixed-device decoders.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import augment

# DALI's own random crop, for comparison in the benchmark (augmentation then differs).
CROP_SHARED, CROP_DALI = "shared", "dali"


@dataclass(frozen=True)
class GraphSpec:
    family: str              # augment family: RESIZED_CROP, CENTRE_CROP, PAD_CROP or IDENTITY
    image_size: int
    has_jpeg: bool
    has_raw: bool
    resize_small: bool       # PAD_CROP / IDENTITY: some stored sizes differ from image_size
    batch_size: int
    num_threads: int
    device_id: int | None    # None: CPU-only DALI (no CUDA needed)
    prefetch: int = 2        # batches DALI works on ahead of the one being consumed
    crop: str = CROP_SHARED  # CROP_SHARED (augment's boxes) or CROP_DALI (its RNG)
    seed: int = 0            # DALI's RNG seed, only used with CROP_DALI
    # RandomResizedCrop's ranges, only used with CROP_DALI (CROP_SHARED boxes carry them).
    scale: tuple[float, float] = augment.RESIZED_CROP_SCALE
    ratio: tuple[float, float] = augment.RESIZED_CROP_RATIO
    # Share of JPEGs sent to the A100/H100 hardware decoder with device="mixed"; None keeps
    # DALI's default. bench/gpu_check.py compares 0.0 (CUDA nvJPEG only) with the default.
    hw_decoder_load: float | None = None

    def __post_init__(self):
        if self.crop not in (CROP_SHARED, CROP_DALI):
            raise ValueError(f"crop must be {CROP_SHARED!r} or {CROP_DALI!r}, not {self.crop!r}")
        if self.dali_crops and self.has_raw:
            raise ValueError("crop='dali' is a benchmark comparison for JPEG splits only")

    @property
    def on_gpu(self) -> bool:
        return self.device_id is not None

    @property
    def mixed(self) -> bool:
        return self.has_jpeg and self.has_raw

    @property
    def flips(self) -> bool:
        return self.family in (augment.RESIZED_CROP, augment.PAD_CROP)

    @property
    def boxed(self) -> bool:
        """Whether the graph takes per-sample boxes (anchor, shape) from the feed."""
        return self.family != augment.IDENTITY and not self.dali_crops

    @property
    def dali_crops(self) -> bool:
        return self.crop == CROP_DALI and self.family == augment.RESIZED_CROP

    def inputs(self) -> tuple[str, ...]:
        """The names of the per-sample inputs, in the order the feed yields them."""
        names = []
        if self.has_jpeg:
            names.append("jpeg")
        if self.has_raw:
            names.append("raw")
        if self.boxed:
            names += ["anchor", "shape"]
            if self.mixed and self.family != augment.PAD_CROP:
                # Stored-pixel boxes differ per branch: the stand-in needs its own 8x8 box.
                names += ["raw_anchor", "raw_shape"]
        if self.flips and not self.dali_crops:
            names.append("flip")
        if self.mixed:
            names += ["is_jpeg", "is_raw"]
        return tuple(names)


def build_graph(spec: GraphSpec, feed):
    """A built DALI pipeline whose one output is the (B, S, S, 3) uint8 HWC batch.

    `feed` is an iterable yielding, per batch, one list/array per name of `spec.inputs()`;
    ``cycle="raise"``: when it is exhausted the pipeline raises StopIteration, and
    ``reset()`` calls ``iter(feed)`` again for the next pass.

    ``exec_dynamic=True`` (DALI 2's executor): every ``run()`` returns freshly allocated
    outputs that live as long as something references them, so the caller can wrap them with
    DLPack and keep them past the next iteration with no copy (the classic executor reuses its
    output buffers, which is why DALIGenericIterator used to copy every batch).
    """
    from nvidia.dali import fn, pipeline_def, types

    names = spec.inputs()
    dtypes = {"jpeg": types.UINT8, "raw": types.UINT8, "anchor": types.INT32,
              "shape": types.INT32, "raw_anchor": types.INT32, "raw_shape": types.INT32,
              "flip": types.INT32, "is_jpeg": types.UINT8, "is_raw": types.UINT8}
    layouts = {"raw": "HWC"}

    @pipeline_def(batch_size=spec.batch_size, num_threads=spec.num_threads,
                  device_id=spec.device_id, prefetch_queue_depth=spec.prefetch,
                  seed=spec.seed, exec_dynamic=True)
    def graph():
        outputs = fn.external_source(source=feed, num_outputs=len(names), batch=True,
                                     cycle="raise", dtype=[dtypes[n] for n in names],
                                     layout=[layouts.get(n, "") for n in names])
        inputs = dict(zip(names, outputs))
        images = []
        if spec.has_jpeg:
            images.append(_jpeg_branch(fn, types, spec, inputs))
        if spec.has_raw:
            images.append(_raw_branch(fn, spec, inputs))
        if spec.mixed:
            jpeg, raw = images
            is_jpeg, is_raw = inputs["is_jpeg"], inputs["is_raw"]
            if spec.on_gpu:
                is_jpeg, is_raw = is_jpeg.gpu(), is_raw.gpu()
            image = jpeg * is_jpeg + raw * is_raw
        else:
            image = images[0]
        if spec.flips:
            flip = fn.random.coin_flip(probability=0.5) if spec.dali_crops else inputs["flip"]
            image = fn.flip(image, horizontal=flip)
        return image

    pipe = graph()
    pipe.build()
    return pipe


def _jpeg_branch(fn, types, spec: GraphSpec, inputs):
    device = "mixed" if spec.on_gpu else "cpu"
    data = inputs["jpeg"]
    hardware = ({"hw_decoder_load": spec.hw_decoder_load}
                if spec.on_gpu and spec.hw_decoder_load is not None else {})
    if spec.family in (augment.RESIZED_CROP, augment.CENTRE_CROP):
        if spec.dali_crops:
            image = fn.decoders.image_random_crop(
                data, device=device, output_type=types.RGB, **hardware,
                random_area=list(spec.scale), random_aspect_ratio=list(spec.ratio),
                num_attempts=augment.RESIZED_CROP_ATTEMPTS)
        else:
            image = fn.decoders.image_slice(data, inputs["anchor"], inputs["shape"],
                                            device=device, output_type=types.RGB, **hardware,
                                            axis_names="HW", normalized_anchor=False,
                                            normalized_shape=False)
        return _resize(fn, image, spec.image_size)
    image = fn.decoders.image(data, device=device, output_type=types.RGB, **hardware)
    return _small_image(fn, spec, inputs, image)


def _raw_branch(fn, spec: GraphSpec, inputs):
    image = inputs["raw"]
    if spec.on_gpu:
        image = image.gpu()
    if spec.family in (augment.RESIZED_CROP, augment.CENTRE_CROP):
        anchor, shape = ((inputs["raw_anchor"], inputs["raw_shape"]) if spec.mixed
                         else (inputs["anchor"], inputs["shape"]))
        image = fn.slice(image, anchor, shape, axis_names="HW", normalized_anchor=False,
                         normalized_shape=False)
        return _resize(fn, image, spec.image_size)
    return _small_image(fn, spec, inputs, image)


def _small_image(fn, spec: GraphSpec, inputs, image):
    s = spec.image_size
    if spec.resize_small or spec.mixed:  # mixed: the 8x8 stand-ins need resizing too
        image = _resize(fn, image, s)
    if spec.family == augment.PAD_CROP:
        p = augment.SMALL_IMAGE_PADDING
        image = _reflect_pad(fn, image, s, p)
        image = fn.slice(image, inputs["anchor"], inputs["shape"], axis_names="HW",
                         normalized_anchor=False, normalized_shape=False)
    return image


def _resize(fn, image, size: int):
    from nvidia.dali import types
    # Linear with DALI's antialiasing when shrinking: close to what the `pytorch` pipeline's
    # INTER_LINEAR / INTER_AREA pair gives (tests/pipeline/test_parity.py bounds the difference)
    # and to torchvision's antialiased RandomResizedCrop. Antialiasing costs ~15 % of DALI's
    # CPU throughput at 224 px (1,464 vs 1,709 images/s without it, 2 threads), nothing
    # measurable next to nvJPEG on a GPU; we keep the better filter.
    return fn.resize(image, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR,
                     antialias=True)


def _reflect_pad(fn, image, size: int, pad: int):
    """numpy's ``pad(mode="reflect")`` (cv2's BORDER_REFLECT_101) of an S x S HWC image."""
    # Columns first, then rows: either way the axis being padded is still `size` long.
    # (fn.flip flips horizontally unless told otherwise: its `horizontal` defaults to 1.)
    for axis, mirror in ((1, {"horizontal": 1, "vertical": 0}),
                         (0, {"horizontal": 0, "vertical": 1})):
        before = fn.flip(fn.slice(image, start=[1], end=[pad + 1], axes=[axis]), **mirror)
        after = fn.flip(fn.slice(image, start=[size - pad - 1], end=[size - 1], axes=[axis]),
                        **mirror)
        image = fn.cat(before, image, after, axis=axis)
    return image


def placeholder_jpeg() -> np.ndarray:
    """An 8x8 grey JPEG: what the JPEG branch decodes for raw samples of a mixed split."""
    import cv2
    ok, data = cv2.imencode(".jpg", np.full((8, 8, 3), 128, dtype=np.uint8))
    if not ok:
        raise RuntimeError("cv2 could not encode the 8x8 placeholder JPEG")
    return data.reshape(-1)


PLACEHOLDER_SIDE = 8
PLACEHOLDER_RAW = np.zeros((PLACEHOLDER_SIDE, PLACEHOLDER_SIDE, 3), dtype=np.uint8)
