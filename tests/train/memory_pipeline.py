"""`test-memory` and `test-slow`: in-test pipelines that honour the batch contract with the
whole split in memory, so trainer tests do not depend on the real pipelines. Importing this
module registers them (once, even when imported twice)."""
from __future__ import annotations

import time

import numpy as np
import torch

from turbotrain.pipeline import Pipeline, pipeline_names, register_pipeline

SLOW_BATCH_SECONDS = 0.05  # test-slow: a loader that is the bottleneck


class MemoryPipeline(Pipeline):
    name = "test-memory"
    delay = 0.0
    cpu_workers = 0  # loads in the training process

    def __init__(self, dataset, options):
        super().__init__(dataset, options)
        size = options.image_size
        images = np.stack([dataset.image(i) for i in range(len(dataset))])  # N,H,W,3
        pixels = torch.from_numpy(images).permute(0, 3, 1, 2)
        if pixels.shape[-1] != size:
            pixels = torch.nn.functional.interpolate(pixels.float(), size=(size, size),
                                                     mode="nearest").to(torch.uint8)
        self.images = pixels.contiguous(memory_format=torch.channels_last)
        self.labels = torch.as_tensor(np.asarray(dataset.labels), dtype=torch.int64)
        per_rank = len(dataset) // options.world_size
        b = options.batch_size
        self.batches = per_rank // b if options.drops_last else -(-per_rank // b)

    def __len__(self):
        return self.batches

    def _order(self, epoch):
        o = self.options
        if o.train:
            order = np.random.default_rng([o.seed, epoch]).permutation(len(self.labels))
        else:
            order = np.arange(len(self.labels))
        return order[o.rank::o.world_size]

    def __iter__(self):
        epoch, b = self.epoch, self.options.batch_size
        order = self._order(epoch)
        device = self.options.device
        while self.batch_index < self.batches:
            index = torch.as_tensor(order[self.batch_index * b:(self.batch_index + 1) * b])
            if self.delay:
                time.sleep(self.delay)
            images = self.images[index].contiguous(memory_format=torch.channels_last).to(device)
            labels = self.labels[index].to(device)
            self.batch_index += 1
            yield images, labels
        self.batch_index = 0


class SlowPipeline(MemoryPipeline):
    name = "test-slow"
    delay = SLOW_BATCH_SECONDS


if "test-memory" not in pipeline_names():
    register_pipeline("test-memory")(MemoryPipeline)
    register_pipeline("test-slow")(SlowPipeline)
