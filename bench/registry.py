"""The one list of benchmarks, and the one name of each contender they measure.

`BENCHMARKS`: what `run_all.py` runs and `report.py` renders into BENCHMARKS.md, one section
each, in this order. A benchmark NAME is a script (bench_NAME.py unless it names another) that
writes bench/results/NAME.json through `common.write_results` and has `markdown(result) -> str`
(its section's table); NAME is also its `run_all.py --only NAME` and its `## NAME` in
bench/NOTES.md. Not benchmarks of their own: gpu_all.py, gpu_sources.py and gpu_train.py (parts
of gpu_check.py), bf16_probe.py (`make bf16-probe`, a diagnosis), common.py (what they share).

`CONTENDERS` names every input pipeline (and whole training script) the tables set side by side,
once, with whose code it is, as BENCHMARKS.md's Contenders table explains (`plain_ffcv` is FFCV's
Loader with its own decoder; `ffcv` is our pipeline that runs FFCV's Loader inside).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    name: str  # bench/results/<name>.json; run_all --only <name>; "## <name>" in NOTES.md
    title: str  # the heading of its section in BENCHMARKS.md
    args: tuple[str, ...] = ()  # what run_all passes beyond the script's defaults
    needs_cuda: bool = False  # run_all skips it on a machine without a CUDA GPU
    script: str = ""  # under bench/; bench_<name>.py unless given

    def __post_init__(self) -> None:
        object.__setattr__(self, "script", self.script or f"bench_{self.name}.py")

    @property
    def command(self) -> str:
        """The run `make bench` makes; BENCHMARKS.md shows it unless the JSON holds its own."""
        return " ".join(["python", f"bench/{self.script}", *self.args])


BENCHMARKS = (
    Benchmark("prepare", "Dataset conversion: prepare-dataset vs FFCV"),
    Benchmark("sources", "Conversion speed by source: ImageFolder, WebDataset, Parquet"),
    Benchmark("prepare_ray",
              "Conversion on Ray: --engine ray vs --engine local on one machine (issue 34)"),
    Benchmark("pipelines", "Input pipelines: ours vs FFCV, DALI, SPDL, torchvision"),
    Benchmark("kernel", "The compiled decode kernel: beside a busy thread, per stage"),
    Benchmark("engines", "Our pipeline engines on one file: pytorch, dali, ffcv"),
    Benchmark("pillow", "PIL decode + resize: pillow-simd vs pillow"),
    Benchmark("train_precision", "Training step: precision and memory format"),
    Benchmark("time_to_accuracy", "Time to 90 % on Fashion-MNIST (issue #5)"),
    Benchmark("levers", "Time to accuracy: the plan's levers (progressive resizing, test-time "
              "resolution, flip TTA) on vs off (issue 42)"),
    # issue 46: what --aa / --color-jitter / --reprob cost a batch, on the training device
    Benchmark("augment",
              "Augmentations after decode (--aa, --color-jitter, --reprob): cost per batch"),
    Benchmark("ddp", "Several processes (DDP)"),
    Benchmark("loader", "Your own loop: turbotrain.Loader vs train"),
    Benchmark("lightning", "Lightning: TurbotrainDataModule vs train"),
    Benchmark("predict", "Using a model: predict vs the eval pipeline, and load time"),
    Benchmark("order", "Sample order on a split larger than memory: quasi-random vs random"),
    Benchmark("remote", "Datasets in object storage: shard cache vs local, obstore vs s3fs"),
    # issue 32: turbotrain demo + --time-budget, ~6 min
    Benchmark("demo", "turbotrain demo, and --time-budget honoured (issue 32)"),
    # issue 43: the doctor's advice applied, predicted vs measured
    Benchmark("doctor",
              "turbotrain doctor: its top finding applied, predicted vs measured speedup"),
    # gpu_check.py's own default output is bench/results/gpu_check.json; said explicitly.
    Benchmark("gpu_check", "GPU", ("--json", "bench/results/gpu_check.json"), needs_cuda=True,
              script="gpu_check.py"),
)
BY_NAME = {b.name: b for b in BENCHMARKS}


@dataclass(frozen=True)
class Contender:
    whose: str  # "turbotrain", or the library run directly
    what: str  # in a few words; each table says how it was set up


TURBOTRAIN = "turbotrain"
CONTENDERS = {
    # our pipelines, named as --pipeline takes them, and variants of them
    "pytorch": Contender(TURBOTRAIN, "the pytorch pipeline: compiled decode kernel, threads"),
    "pytorch_processes": Contender(TURBOTRAIN, "the pytorch pipeline in DataLoader worker "
                                               "processes"),
    "pytorch_python": Contender(TURBOTRAIN, "the pytorch pipeline on the Python decode path "
                                            "(TURBOTRAIN_NATIVE=0)"),
    "pytorch_cifar": Contender(TURBOTRAIN, "the pytorch pipeline on a raw 32x32 split"),
    "native_calls": Contender(TURBOTRAIN, "the kernel called from a Python thread pool, one "
                                          "native call per batch (the mechanism not chosen)"),
    "resident": Contender(TURBOTRAIN, "the resident pipeline: the split in memory"),
    "resident_cifar": Contender(TURBOTRAIN, "the resident pipeline on a raw 32x32 split"),
    "dali": Contender(TURBOTRAIN, "the dali pipeline: DALI's graph fed our crop boxes"),
    "dali_own_crop": Contender(TURBOTRAIN, "the dali pipeline with DALI's own random crop"),
    "dali_no_hw_decoder": Contender(TURBOTRAIN, "the dali pipeline without the hardware JPEG "
                                                "decoder (nvJPEG on CUDA cores only)"),
    "ffcv": Contender(TURBOTRAIN, "the ffcv pipeline: FFCV's Loader in our sample order, our "
                                  "crop boxes"),
    # other libraries, used directly
    "plain_ffcv": Contender("FFCV", "FFCV's DatasetWriter or Loader with its own decoders"),
    "plain_ffcv_cifar": Contender("FFCV", "FFCV's Loader on a raw 32x32 dataset"),
    "plain_dali": Contender("DALI", "a DALI pipeline written with DALI's own operators, CPU"),
    "plain_torchvision": Contender("torchvision", "ImageFolder + PIL transforms + DataLoader, "
                                                  "stock pillow"),
    "plain_torchvision_simd": Contender("torchvision", "the same with pillow-simd"),
    "plain_torchvision_decode_jpeg": Contender("torchvision", "torchvision.io.decode_jpeg on "
                                                              "each batch's bytes, v2 transforms"),
    "plain_spdl": Contender("SPDL", "SPDL's PipelineBuilder: FFmpeg decode with a crop + scale "
                                   "filter, threads"),
    "plain_torchvision_nvjpeg": Contender("torchvision", "torchvision's batched nvJPEG decode "
                                                         "on the GPU"),
    "plain_pytorch": Contender("PyTorch", "a plain PyTorch training script: torchvision "
                                          "transforms, DataLoader workers"),
    # references: neither side's loader
    "bare_decode": Contender("simplejpeg", "a full decode of the stored bytes, nothing else: "
                                           "the ceiling of a decode-bound pipeline"),
}
