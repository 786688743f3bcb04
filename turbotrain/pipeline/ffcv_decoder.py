"""An FFCV image decoder whose crops and flips are the shared ones (augment.py), not FFCV's RNG.

FFCV's RandomResizedCropRGBImageDecoder draws its boxes with numba's ``np.random`` inside the
compiled loop: per-thread state that no seed reaches, so crops change from run to run and
differ from every other pipeline's. This decoder is the same compiled loop (FFCV's
libjpeg-turbo ``imdecode``, then FFCV's ``resize_crop``, i.e. cv2 INTER_AREA, into the batch)
but reads each sample's box and flip from a small per-slot buffer that `ffcv.py` fills from
`augment.crop_boxes(seed, epoch, indices)` just before FFCV runs the batch. Augmentation is
therefore identical in parameters to `pytorch` and `dali`; only the resize filter differs.

It also checks libjpeg-turbo's return code, which FFCV ignores (a corrupt JPEG there becomes an
uninitialised image): the status goes into the same buffer, and `ffcv.py` raises one error
naming the sample.

Layout of the per-sample int32 row: ``top, left, height, width, flip, status``.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from turbotrain.datasets.beton.layout import MODE_JPEG

from . import augment

BOX_COLUMNS = 6
TOP, LEFT, HEIGHT, WIDTH, FLIP, STATUS = range(BOX_COLUMNS)
BOX_DTYPE = np.dtype("<i4")


def shared_box_decoder_class():
    """The decoder class (defined lazily: importing ffcv costs ~1 s and needs the package)."""
    global _DECODER_CLASS
    if _DECODER_CLASS is None:
        _DECODER_CLASS = _define_decoder()
    return _DECODER_CLASS


_DECODER_CLASS = None


def _define_decoder():
    from ffcv.fields.rgb_image import ResizedCropRGBImageDecoder
    from ffcv.libffcv import imdecode, resize_crop
    from ffcv.pipeline.allocation_query import AllocationQuery
    from ffcv.pipeline.compiler import Compiler

    class SharedBoxDecoder(ResizedCropRGBImageDecoder):
        """Decode + crop box + resize to ``image_size`` + flip, boxes given per batch.

        `family` is an augment family; PAD_CROP / IDENTITY (small images) resize the whole
        image to ``image_size`` when needed, then copy the box with reflect padding.
        """

        def __init__(self, image_size: int, family: str):
            super().__init__((image_size, image_size))
            self.image_size = image_size
            self.family = family
            self.scale = None  # unused: the boxes come from augment.py
            self.ratio = None

        def get_crop_generator(self):  # abstract in FFCV; never called here
            raise NotImplementedError

        def declare_state_and_memory(self, previous_state):
            state, (destination, decoded) = super().declare_state_and_memory(previous_state)
            s = self.image_size
            boxes = AllocationQuery((BOX_COLUMNS,), BOX_DTYPE)
            resized = AllocationQuery((s, s, 3), np.dtype("<u1"))  # small images only
            return replace(state, jit_mode=True), (destination, decoded, boxes, resized)

        def generate_code(self):
            mem_read = self.memory_read
            my_range = Compiler.get_iterator()
            imdecode_c = _compiled(Compiler, imdecode)
            resize_crop_c = _compiled(Compiler, resize_crop)
            flip_c = _compiled(Compiler, _flip_in_place)
            pad_crop_c = _compiled(Compiler, _reflect_crop)
            zero, one, no = np.uint32(0), np.uint32(1), np.bool_(False)
            small = self.family in (augment.PAD_CROP, augment.IDENTITY)
            size = self.image_size

            def decode(batch_indices, my_storage, metadata, storage_state):
                destination, decoded, boxes, resized = my_storage
                for k in my_range(len(batch_indices)):
                    field = metadata[batch_indices[k]]
                    data = mem_read(field['data_ptr'], storage_state)
                    height = np.uint32(field['height'])
                    width = np.uint32(field['width'])
                    pixels = 3 * height * width
                    status = 0
                    if field['mode'] == MODE_JPEG:
                        # Typed (not literal) constants: numba 0.68's dispatcher finaliser
                        # raises KeyError for overloads keyed by Literal[int] arguments.
                        status = imdecode_c(data, decoded[k], height, width, height, width,
                                            zero, zero, one, one, no, no)
                        image = decoded[k].reshape(-1)[:pixels].reshape(height, width, 3)
                    else:
                        image = data.reshape(height, width, 3)
                    boxes[k, STATUS] = status
                    if status == 0:
                        top, left = np.int64(boxes[k, TOP]), np.int64(boxes[k, LEFT])
                        if small:
                            source = image
                            if height != size or width != size:
                                resize_crop_c(image, 0, height, 0, width, resized[k])
                                source = resized[k]
                            pad_crop_c(source, top, left, destination[k])
                        else:
                            resize_crop_c(image, top, top + boxes[k, HEIGHT], left,
                                          left + boxes[k, WIDTH], destination[k])
                        if boxes[k, FLIP]:
                            flip_c(destination[k])
                return destination[:len(batch_indices)]

            decode.is_parallel = True
            return decode

    return SharedBoxDecoder


_COMPILED: dict = {}


def _compiled(compiler, function):
    """One numba dispatcher per helper per process: every Loader would otherwise compile its
    own copies (~1 s each on the dev box) and drop them with the Loader."""
    if function not in _COMPILED:
        _COMPILED[function] = compiler.compile(function)
    return _COMPILED[function]


def _flip_in_place(image):
    """Mirrors an HWC image left-right in place (numba-compiled by FFCV's Compiler)."""
    width = image.shape[1]
    for y in range(image.shape[0]):
        for x in range(width // 2):
            for c in range(image.shape[2]):
                t = image[y, x, c]
                image[y, x, c] = image[y, width - 1 - x, c]
                image[y, width - 1 - x, c] = t


def _reflect_crop(source, top, left, out):
    """out = the box at (top, left) of `source` reflect-padded (numpy's mode="reflect").

    Boxes of the small families are `out`-sized and start at most SMALL_IMAGE_PADDING outside
    `source`, which is out-sized too, so one reflection per side is enough.
    """
    size = source.shape[0]
    for y in range(out.shape[0]):
        sy = top + y
        if sy < 0:
            sy = -sy
        elif sy >= size:
            sy = 2 * (size - 1) - sy
        for x in range(out.shape[1]):
            sx = left + x
            if sx < 0:
                sx = -sx
            elif sx >= size:
                sx = 2 * (size - 1) - sx
            for c in range(3):
                out[y, x, c] = source[sy, sx, c]


def box_rows(boxes: augment.CropBoxes) -> np.ndarray:
    """The (B, BOX_COLUMNS) int32 rows the decoder reads, status cleared."""
    rows = np.zeros((len(boxes), BOX_COLUMNS), dtype=BOX_DTYPE)
    rows[:, TOP], rows[:, LEFT] = boxes.top, boxes.left
    rows[:, HEIGHT], rows[:, WIDTH] = boxes.height, boxes.width
    rows[:, FLIP] = boxes.flip
    return rows
