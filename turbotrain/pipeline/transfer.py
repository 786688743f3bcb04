"""The last step of every CPU-side pipeline: uint8 NHWC host batches -> the target device.

Batches stay uint8 over the bus (4x fewer bytes than float32; normalisation happens on the
device, in the model's input stem). On CUDA the host batch is pinned and copied with
``non_blocking=True`` on a side stream, one batch ahead, so the copy overlaps the previous
step's compute (timm's PrefetchLoader idea); the consuming stream waits on it before use.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch


def as_nchw(images_nhwc: torch.Tensor) -> torch.Tensor:
    """The (B, 3, H, W) channels_last view of an NHWC batch: the same bytes, no copy."""
    return images_nhwc.permute(0, 3, 1, 2)


def to_device(batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
              device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yields each host (images NHWC uint8, labels int64) batch as device (NCHW view, labels)."""
    device = torch.device(device)
    if device.type != "cuda":
        for images, labels in batches:
            yield as_nchw(images.to(device)), labels.to(device)
        return
    yield from _cuda_prefetch(batches, device)


def _cuda_prefetch(batches, device: torch.device):
    side = torch.cuda.Stream(device=device)
    pending = None
    for images, labels in batches:
        # Both pinned: a non_blocking copy from pageable memory is staged by the driver and
        # returns only when done, so the labels' copy stalled the host on every batch.
        images, labels = pinned(images), pinned(labels)
        with torch.cuda.stream(side):
            copied = torch.cuda.Event()
            ready = (images.to(device, non_blocking=True), labels.to(device, non_blocking=True),
                     copied)
            copied.record(side)
        if pending is not None:
            yield _hand_over(pending, device)
        pending = ready
    if pending is not None:
        yield _hand_over(pending, device)


def pinned(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in page-locked memory (itself when it already is)."""
    return tensor if tensor.is_pinned() else tensor.pin_memory()


def _hand_over(batch, device: torch.device):
    images, labels, copied = batch
    consumer = torch.cuda.current_stream(device)
    # Wait for this batch's copy only (an event), not for the next batch's copy queued since.
    consumer.wait_event(copied)
    # The tensors were allocated on the side stream: tell the caching allocator that the
    # consumer stream uses them, so their memory is not reused before its work is done.
    images.record_stream(consumer)
    labels.record_stream(consumer)
    return as_nchw(images), labels


def host_array_to(array, device: torch.device) -> torch.Tensor:
    """A small host array (numpy or tensor) on `device` without stalling the host: on CUDA it
    is copied from pinned memory (torch's caching host allocator reuses the block) and queued
    on the current stream; from pageable memory the copy would wait for the stream's queued
    work, the training step included."""
    host = torch.as_tensor(array)
    if torch.device(device).type == "cuda":
        return pinned(host).to(device, non_blocking=True)
    return host.to(device)
