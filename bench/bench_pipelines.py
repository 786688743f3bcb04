"""Input pipelines side by side: ours (`pytorch`, `resident`) against FFCV, DALI and torchvision
used directly (`plain_ffcv`, `plain_dali`, `plain_torchvision`: bench/registry.py CONTENDERS).

    .venv/bin/python bench/bench_pipelines.py [--images 3000] [--batches 100] [--rounds 2]

Data (generated once, cached under bench/.cache/, shared with bench_prepare.py):

* photos: `--images` photo-like 500x375 q90 JPEGs (~60 KB) as an ImageFolder, prepared with
  `prepare-dataset`'s default options (JPEG pass-through);
* cifar: 50,000 CIFAR-sized (32x32) images from the same generator, prepared from a .npz with
  the default options (stored raw).

Every contender runs in its own fresh process (FFCV and DALI keep threads and compiled state),
on both cores, with the same batch size, and is timed the same way: `--warmup` untimed batches,
then `--batches` timed ones, across epoch boundaries. Photos: RandomResizedCrop 224 + flip,
uint8 out, batch 64. CIFAR: pad-and-crop (FFCV: RandomTranslate) + flip, batch 512. All
contenders run `--rounds` times, interleaved, and the best round counts (the machine is shared;
the load average at each run is recorded). Writes bench/results/pipelines.json and prints
the table with the ratios the issue asks for.

torchvision runs twice: `plain_torchvision` with stock pillow (what `pip install torchvision`
gives; the goal's baseline) and `plain_torchvision_simd` with this venv's pillow-simd (a
comparison, no goal).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
CACHE = ROOT / ".cache"
RESULTS = ROOT / "results" / "pipelines.json"
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

import common  # noqa: E402

CIFAR_IMAGES = 50_000
WORKERS = 2  # both cores of the build machine; every contender gets the same

# name -> (dataset, what it is). Goals below refer to these names.
CONTENDERS = {
    "pytorch": ("photos", "turbotrain pytorch pipeline (threads)"),
    "pytorch_processes": ("photos", "turbotrain pytorch pipeline, DataLoader worker processes"),
    "plain_ffcv": ("photos", "FFCV Loader: RandomResizedCropRGBImageDecoder + flip, os_cache"),
    "plain_dali": ("photos", "DALI CPU: external_source + image_random_crop + resize + flip"),
    "plain_torchvision": ("photo_folder", "torchvision ImageFolder + PIL, DataLoader 2 "
                          "workers (stock pillow, as pip installs it)"),
    "plain_torchvision_simd": ("photo_folder", "the same with pillow-simd (AVX2), as make "
                               "install builds it"),
    "bare_decode": ("photos", "simplejpeg full decode of the stored bytes, 2 threads"),
    "resident_cifar": ("cifar", "turbotrain resident pipeline, raw 32x32, pad-crop + flip"),
    "plain_ffcv_cifar": ("cifar", "FFCV Loader: SimpleRGBImageDecoder + flip + "
                         "RandomTranslate"),
    "pytorch_cifar": ("cifar", "turbotrain pytorch pipeline on the raw 32x32 split"),
}
PER_SECOND, PER_CPU_SECOND = "images_per_second", "images_per_cpu_second"
GOALS = [  # (ours, theirs, minimum ratio or None: a comparison only, of which metric)
    ("pytorch", "plain_ffcv", 2.0, PER_SECOND),
    ("pytorch", "plain_ffcv", 1.5, PER_CPU_SECOND),
    ("pytorch", "plain_dali", 1.5, PER_SECOND),
    # bare_decode: simplejpeg's full decode of the same bytes on the same threads. The kernel
    # decodes only the crop's rows and iMCU columns, so it can beat a full decode.
    ("pytorch", "bare_decode", 1.0, PER_SECOND),
    ("pytorch", "plain_torchvision", 3.0, PER_SECOND),
    ("pytorch", "plain_torchvision_simd", None, PER_SECOND),  # no goal: pillow-simd's worth
    ("resident_cifar", "plain_ffcv_cifar", 3.0, PER_SECOND),
]


# -- data -----------------------------------------------------------------------------------------
def photo_folder(images: int) -> Path:
    from turbotrain.datasets.synthetic import write_shapes_imagefolder
    per_class = images // 10
    root = CACHE / f"photos-{per_class}"  # the same folder bench_prepare.py uses
    write_shapes_imagefolder(root, train_per_class=per_class, val_per_class=0,
                             size=(500, 375), quality=90)
    return root


def cifar_npz() -> Path:
    import numpy as np
    from turbotrain.datasets.synthetic import shape_image
    path = CACHE / f"cifar-like-{CIFAR_IMAGES}.npz"
    if not path.exists():
        labels = np.arange(CIFAR_IMAGES) % 10
        images = np.stack([shape_image(1, i, int(labels[i]), size=(32, 32))
                           for i in range(CIFAR_IMAGES)])
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, images=images, labels=labels)
        tmp.rename(path)
    return path


def prepared(source: Path, name: str) -> Path:
    """`prepare-dataset SOURCE OUT` with the default options (once); returns OUT."""
    from turbotrain.datasets.prepare.convert import PrepareOptions, prepare_dataset
    out = CACHE / f"{name}-prepared"
    if not (out / "dataset.json").exists():
        prepare_dataset(source, out, PrepareOptions(progress=False))
    return out


# -- one contender, in a child process -----------------------------------------------------------
def _cpu_seconds() -> float | None:
    """CPU time of this process and all its descendants (worker processes), or None."""
    try:
        import psutil
    except ImportError:
        return None
    total = 0.0
    me = psutil.Process()
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:  # a worker that just exited
            continue
        total += times.user + times.system
    return total


def _timed(epochs, warmup: int, batches: int) -> dict:
    """Images/s (and images per CPU-second, which a busy neighbour disturbs less) of
    `batches` batches after `warmup`; `epochs(e)` iterates epoch e's batches."""
    def endless():
        epoch = 0
        while True:
            yield from epochs(epoch)
            epoch += 1
    stream = endless()
    for _ in range(warmup):
        next(stream)
    cpu = _cpu_seconds()
    started = time.perf_counter()
    images = sum(len(next(stream)[0]) for _ in range(batches))
    wall = time.perf_counter() - started
    result = {"images_per_second": images / wall}
    if cpu is not None:
        result["images_per_cpu_second"] = images / (_cpu_seconds() - cpu)
    return result


def _ours(name: str, data: str, args) -> dict:
    import torch
    from turbotrain.datasets import open_dataset
    from turbotrain.pipeline import PipelineOptions, build_pipeline
    from turbotrain.pipeline.bench import bare_decode_rate
    from turbotrain.pipeline.pytorch import PyTorchPipeline
    dataset = open_dataset(data, "train")
    if name == "bare_decode":
        bare_decode_rate(dataset, samples=len(dataset), threads=WORKERS, rounds=1)  # warm-up
        cpu = _cpu_seconds()
        rate = bare_decode_rate(dataset, samples=len(dataset), threads=WORKERS, rounds=1)
        result = {"images_per_second": rate}
        if cpu is not None:
            result["images_per_cpu_second"] = len(dataset) / (_cpu_seconds() - cpu)
        return result
    options = dict(train=True, batch_size=args.batch_size, image_size=args.image_size,
                   device=torch.device("cpu"), seed=0, workers=WORKERS)
    if name == "pytorch_processes":
        pipeline = PyTorchPipeline(dataset, PipelineOptions(**options), mode="processes")
    else:
        pipeline = build_pipeline(name.split("_")[0], dataset, **options)

    def epochs(epoch):
        pipeline.set_epoch(epoch)
        return iter(pipeline)
    try:
        return _timed(epochs, args.warmup, args.batches)
    finally:
        pipeline.close()


def ffcv_epochs(name: str, data: str, *, batch_size: int, image_size: int, workers: int):
    """epochs(e) -> an iterator over FFCV's batches (bench_kernel.py uses it too)."""
    from ffcv.fields.decoders import (IntDecoder, RandomResizedCropRGBImageDecoder,
                                      SimpleRGBImageDecoder)
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, RandomTranslate, ToTensor, ToTorchImage

    from turbotrain.pipeline.augment import SMALL_IMAGE_PADDING  # the same shift as `resident`
    if name == "plain_ffcv_cifar":
        image = [SimpleRGBImageDecoder(), RandomHorizontalFlip(),
                 RandomTranslate(padding=SMALL_IMAGE_PADDING),
                 ToTensor(), ToTorchImage()]
    else:
        size = (image_size, image_size)
        image = [RandomResizedCropRGBImageDecoder(size), RandomHorizontalFlip(), ToTensor(),
                 ToTorchImage()]
    # No NormalizeImage: on CPU it hangs (FFCV issues #350/#396); our contract ships uint8 anyway.
    loader = Loader(str(Path(data) / "train.beton"), batch_size=batch_size,
                    num_workers=workers, order=OrderOption.RANDOM, os_cache=True, drop_last=True,
                    pipelines={"image": image, "label": [IntDecoder(), ToTensor()]})
    return lambda epoch: iter(loader)


def _ffcv(name: str, data: str, args) -> dict:
    return _timed(ffcv_epochs(name, data, batch_size=args.batch_size,
                              image_size=args.image_size, workers=WORKERS),
                  args.warmup, args.batches)


def dali_epochs(data: str, *, batch_size: int, image_size: int, workers: int):
    """epochs(e) -> DALI's CPU pipeline fed the stored JPEG bytes of the same file, in our
    sample order (bench_kernel.py uses it too)."""
    import numpy as np
    from nvidia.dali import fn, pipeline_def, types
    from turbotrain.datasets import open_dataset
    from turbotrain.pipeline.order import SampleOrder
    dataset = open_dataset(data, "train")
    order = SampleOrder(len(dataset), batch_size=batch_size, seed=0)
    per_epoch = len(order)

    def source(iteration: int):  # batch mode: a list of 1-D uint8 arrays
        indices = order.batches(iteration // per_epoch)[iteration % per_epoch]
        return [np.asarray(dataset.beton.payload(i)) for i in indices]

    @pipeline_def(batch_size=batch_size, num_threads=workers, device_id=None)
    def graph():
        jpegs = fn.external_source(source=source, batch=True, dtype=types.UINT8)
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0],
                                               random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=image_size, resize_y=image_size)
        return fn.flip(images, horizontal=fn.random.coin_flip())
    pipe = graph()
    pipe.build()

    def epochs(epoch):
        for _ in range(per_epoch):
            out, = pipe.run()
            yield (np.asarray(out.as_tensor()),)
    return epochs


def _dali(name: str, data: str, args) -> dict:
    return _timed(dali_epochs(data, batch_size=args.batch_size, image_size=args.image_size,
                              workers=WORKERS), args.warmup, args.batches)


def _torchvision(name: str, data: str, args) -> dict:
    import torch
    from torchvision import datasets, transforms
    transform = transforms.Compose([transforms.RandomResizedCrop(args.image_size),
                                    transforms.RandomHorizontalFlip(), transforms.PILToTensor()])
    folder = datasets.ImageFolder(str(Path(data) / "train"), transform=transform)
    loader = torch.utils.data.DataLoader(folder, batch_size=args.batch_size, shuffle=True,
                                         num_workers=WORKERS, drop_last=True,
                                         persistent_workers=True)
    import PIL
    return {**_timed(lambda epoch: iter(loader), args.warmup, args.batches),
            "pil": PIL.__version__}  # pillow-simd's carries "+avx2"


RUNNERS = {"pytorch": _ours, "pytorch_processes": _ours, "bare_decode": _ours,
           "resident_cifar": _ours, "pytorch_cifar": _ours, "plain_ffcv": _ffcv,
           "plain_ffcv_cifar": _ffcv, "plain_dali": _dali, "plain_torchvision": _torchvision,
           "plain_torchvision_simd": _torchvision}
# torchvision's baseline is what `pip install torchvision` gives a user: stock pillow. This venv
# holds pillow-simd (make install builds it), so that side runs with stock pillow first on
# PYTHONPATH, installed once with `pip install --target` (bench_pillow.py's folder), and
# plain_torchvision_simd shows what pillow-simd alone buys torchvision.
STOCK_PILLOW_SIDES = {"plain_torchvision"}


def child(args) -> int:
    import torch
    torch.set_num_threads(1)  # parallelism comes from each loader's own workers/threads
    common.print_result(RUNNERS[args.child](args.child, args.data, args))
    return 0


# -- the parent: data, rounds, table ----------------------------------------------------------------
def run_one(name: str, data: Path, args, batch_size: int, image_size: int) -> dict:
    env = None
    if name in STOCK_PILLOW_SIDES:
        import bench_pillow  # beside this file
        env = bench_pillow.env_with_pillow(bench_pillow.plain_pillow(None))
    return common.run_child([__file__, "--child", name, "--data", data,
                             "--batch-size", batch_size, "--image-size", image_size,
                             "--batches", args.batches, "--warmup", args.warmup],
                            timeout=args.timeout, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--images", type=int, default=3000, help="photo-like JPEGs (default 3000)")
    parser.add_argument("--batches", type=int, default=100, help="timed batches per run")
    parser.add_argument("--warmup", type=int, default=10, help="untimed batches per run")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repeats; best counts")
    parser.add_argument("--only", nargs="+", choices=sorted(CONTENDERS), default=None)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per run")
    parser.add_argument("--child", choices=sorted(CONTENDERS), help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, default=64, help=argparse.SUPPRESS)
    parser.add_argument("--image-size", type=int, default=224, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)

    CACHE.mkdir(parents=True, exist_ok=True)
    folder = photo_folder(args.images)
    data = {"photo_folder": folder, "photos": prepared(folder / "train", folder.name),
            "cifar": prepared(cifar_npz(), "cifar-like")}
    names = args.only or list(CONTENDERS)

    def contender(name: str):
        kind = CONTENDERS[name][0]
        batch, size = (512, 32) if kind == "cifar" else (64, 224)
        return lambda: run_one(name, data[kind], args, batch, size)
    runs = common.interleaved(args.rounds, {name: contender(name) for name in names})

    def best(name: str, metric: str) -> float | None:
        return common.best(runs[name], metric)
    goals = []
    for ours, theirs, minimum, metric in GOALS:
        if ours in runs and theirs in runs and best(ours, metric) and best(theirs, metric):
            goal = {"ours": ours, "theirs": theirs, "goal": minimum, "metric": metric}
            for measured in (PER_SECOND, PER_CPU_SECOND):
                if best(ours, measured) and best(theirs, measured):
                    goal[f"ratio_{measured}"] = best(ours, measured) / best(theirs, measured)
            goal["met"] = goal[f"ratio_{metric}"] >= minimum if minimum else None
            goals.append(goal)
    report = {
        "command": common.command_line(__file__, argv),
        "cores": len(os.sched_getaffinity(0)), "workers": WORKERS,
        "photos": {"images": args.images, "size": "500x375 q90", "batch_size": 64,
                   "image_size": 224},
        "cifar": {"images": CIFAR_IMAGES, "size": "32x32 raw", "batch_size": 512},
        "batches": args.batches, "warmup": args.warmup, "rounds": args.rounds,
        "results": {name: {"images_per_second": best(name, "images_per_second"),
                           "images_per_cpu_second": best(name, "images_per_cpu_second"),
                           "what": CONTENDERS[name][1], "runs": runs[name]} for name in names},
        "goals": goals,
    }
    common.write_results(RESULTS, report)

    print(f"\n{'contender':<18} {'images/s':>10} {'img/CPU-s':>10}  what (best of {args.rounds})")
    for name in names:
        rate, per_cpu = best(name, "images_per_second"), best(name, "images_per_cpu_second")
        print(f"{name:<18} {rate:>10,.0f} {per_cpu or 0:>10,.0f}  {CONTENDERS[name][1]}"
              if rate else f"{name:<18} {'-':>10}  {runs[name][-1].get('error')}")
    print(f"\n{'goal':<30} {'wall':>6} {'CPU':>6} {'needed':>7}")
    for g in goals:
        label = g["ours"] + " / " + g["theirs"] + (" (CPU-s)" if g["metric"] == PER_CPU_SECOND
                                                    else "")
        print(f"{label:<30} {g['ratio_images_per_second']:>6.2f} "
              f"{g.get('ratio_images_per_cpu_second', float('nan')):>6.2f} "
              + (f"{g['goal']:>6.1f}x {'met' if g['met'] else 'NOT MET'}" if g["goal"]
                 else "      -  (comparison only)"))
    print(f"\nwrote {RESULTS.relative_to(ROOT.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
