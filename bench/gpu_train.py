"""`train` for bench/gpu_check.py --all: the real command, with two additions for measuring it.

    python bench/gpu_train.py [--compile-mode MODE] -- TRAIN FLAGS

* the `gpu-check-synthetic` pipeline: one random uint8 batch made once on the device and handed
  over again and again. Trained through the same trainer as any pipeline (same model, compile,
  precision, optimizer, timing), its images/s is the bound that no loader can beat, so a
  default run's images/s over it is the loader's cost and nothing else;
* `--compile-mode`: torch.compile's mode for this run (turbotrain.train.plan.device_choice.COMPILE_MODE
  has no flag: gpu_check compares the modes so that the default can be chosen from data).

Exit code and output are train's.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SYNTHETIC = "gpu-check-synthetic"


def register_synthetic() -> None:
    import torch

    from turbotrain.pipeline import Pipeline, pipeline_names, register_pipeline

    class SyntheticPipeline(Pipeline):
        """The same device batch every step: a loader that costs nothing."""
        name = SYNTHETIC

        def __init__(self, dataset, options):
            super().__init__(dataset, options)
            b, s, device = options.batch_size, options.image_size, options.device
            generator = torch.Generator().manual_seed(options.seed)
            images = torch.randint(0, 256, (b, s, s, 3), dtype=torch.uint8, generator=generator)
            self.images = images.to(device).permute(0, 3, 1, 2)  # NCHW view of NHWC bytes
            labels = torch.randint(0, dataset.num_classes, (b,), generator=generator)
            self.labels = labels.to(device)
            share = len(dataset) // options.world_size
            self.batches = share // b if options.drops_last else -(-share // b)

        def __len__(self):
            return self.batches

        def __iter__(self):
            while self.batch_index < self.batches:
                self.batch_index += 1
                yield self.images, self.labels
            self.batch_index = 0

    if SYNTHETIC not in pipeline_names():
        register_pipeline(SYNTHETIC)(SyntheticPipeline)


def main(argv: list[str]) -> int:
    mode = None
    if argv[:1] == ["--compile-mode"]:
        mode, argv = argv[1], argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if mode is not None:
        from turbotrain.train.plan import device_choice
        device_choice.COMPILE_MODE = mode  # what plan's compile_mode rule reads
    try:
        import simplejpeg  # noqa: F401
    except ImportError:  # as gpu_check does for itself (its notes say so)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from gpu_sources import install_simplejpeg_stand_in
        install_simplejpeg_stand_in()
    register_synthetic()
    from turbotrain.cli import main as turbotrain_main
    return turbotrain_main(["train", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
