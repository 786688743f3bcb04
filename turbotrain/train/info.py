"""`turbotrain info`: what the doctor knows about this machine, and what `train` would pick here.

    turbotrain info [--data OUT] [--json]

Versions (torch, torchvision, DALI, FFCV, Pillow or Pillow-SIMD, simplejpeg, OpenCV and their
JPEG codecs), CPU cores and features (AVX-512, native bf16, AMX), GPUs and their memory, which
pipelines can run, and train's automatic device / precision / compile / thread choices, each
with its reason. With --data, also the pipeline `auto` would pick for that dataset, the image
size, model and batch size.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
from pathlib import Path

PROG = "turbotrain info"
CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16",
                "amx_int8")


def add_info_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None,
                   help="a prepared dataset: also show what train would pick for it")
    p.add_argument("--json", action="store_true", help="print the facts as JSON")


def _version(*distributions: str) -> str | None:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _dali_version() -> str | None:
    """DALI ships as nvidia-dali-cudaXYZ; which one is installed names the CUDA it targets."""
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith("nvidia-dali"):
            return f"{dist.version} ({name})"
    return None


def pillow_build(version: str) -> str:
    """Which PIL runs, from its `PIL.__version__`: every Pillow-SIMD release is a pillow version
    plus .postN, which pillow's own releases never have (a pillow-simd distribution's presence
    proves nothing: it and pillow overwrite each other's PIL/). scripts/build_pillow_simd.py adds
    a local label naming the instructions it compiled for (12.1.1.post0+avx2)."""
    public, _, label = version.partition("+")
    if ".post" not in public:
        return (f"pillow {version} (plain; make install builds pillow-simd, ~1.8x faster PIL "
                "decode + resize, when a C compiler and the jpeg/zlib/webp/tiff headers are "
                "present)")
    instructions = {"avx2": "AVX2", "sse4": "SSE4"}.get(label, "instruction set not recorded")
    return f"pillow-simd {public} ({instructions})"


def versions() -> dict:
    import torch
    found = {"python": platform.python_version(), "torch": torch.__version__,
             "torch CUDA": torch.version.cuda or "none (CPU build)",
             "cuDNN": str(torch.backends.cudnn.version()) if torch.cuda.is_available() else None,
             "torchvision": _version("torchvision"),
             "DALI": _dali_version() or "not installed",
             "FFCV": _version("ffcv") or "not installed", "numba": _version("numba"),
             "numpy": _version("numpy")}
    try:
        import PIL
        from PIL import features
        found["Pillow"] = pillow_build(PIL.__version__)
        if features.check_feature("libjpeg_turbo"):
            found["Pillow JPEG codec"] = f"libjpeg-turbo {features.version('libjpeg_turbo')}"
        else:
            found["Pillow JPEG codec"] = f"libjpeg {features.version('jpg')} (not -turbo: slower)"
    except ImportError:
        pass
    found["simplejpeg"] = _version("simplejpeg")
    if found["simplejpeg"]:
        found["simplejpeg"] += " (bundles libjpeg-turbo; the pytorch pipeline's decoder)"
    found["OpenCV"] = _version("opencv-python-headless", "opencv-python",
                               "opencv-contrib-python")
    return {k: v for k, v in found.items() if v is not None}


def cpu() -> dict:
    from .device import available_cores, cpu_has_native_bf16
    import torch
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown")
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    return {"model": model, "cores usable": available_cores(), "cores in machine": os.cpu_count(),
            "features": [f for f in CPU_FEATURES if f in flags],
            "torch kernels": torch.backends.cpu.get_cpu_capability(),
            "native bf16": cpu_has_native_bf16(), "AMX": "amx_tile" in flags}


def gpus() -> list[dict]:
    import torch
    if not torch.cuda.is_available():
        return []
    found = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        free, total = torch.cuda.mem_get_info(i)
        found.append({"index": i, "name": props.name, "memory GiB": round(total / 2**30, 1),
                      "free GiB": round(free / 2**30, 1),
                      "compute capability": f"{props.major}.{props.minor}",
                      "bf16": props.major >= 8})
    return found


def pipelines(device, dataset=None) -> dict[str, str]:
    """name -> "usable" or why not. Without a dataset, `resident` states its budget."""
    import torch
    from turbotrain.pipeline import PipelineOptions, pipeline_names
    from turbotrain.pipeline.auto import unavailable_reason  # auto's own checks
    from turbotrain.pipeline.resident import memory_budget
    status = {}
    for name in pipeline_names():
        if name == "resident" and dataset is None:
            budget, how = memory_budget(device)
            status[name] = f"usable when the decoded split fits in {budget / 2**30:.1f} GiB ({how})"
            continue
        options = PipelineOptions(train=True, batch_size=64, image_size=224,
                                  device=torch.device(device))
        why_not = unavailable_reason(name, dataset, options)
        status[name] = "usable" if why_not is None else f"unavailable: {why_not}"
    return status


def train_picks(data: str | None = None) -> tuple[dict[str, str], object, object]:
    """What `train` would decide here: name -> "value: reason"; also the device and dataset."""
    from .device import (available_cores, choose_compile, choose_compile_mode, choose_device,
                         choose_precision, describe_gpu, plan_threads)
    picks = {}
    device_choice = choose_device("auto")
    device = device_choice.value
    picks["device"] = f"{device}: {device_choice.reason}"
    gpu = describe_gpu(device)
    precision = choose_precision("auto", device, gpu)
    picks["precision"] = f"{precision.value}: {precision.reason}"
    compile_choice = choose_compile(None, device, gpu)
    picks["compile"] = f"{'on' if compile_choice.value else 'off'}: {compile_choice.reason}"
    if compile_choice.value:
        mode = choose_compile_mode(device, gpu)
        picks["compile mode"] = f"{mode.value}: {mode.reason}"
    cores = available_cores()
    for label, jpeg in (("threads, JPEG data", 1.0), ("threads, raw data", 0.0)):
        plan = plan_threads(device, cores=cores, workers=None, threads=None, jpeg_fraction=jpeg)
        picks[label] = (f"{plan.workers} pipeline workers + {plan.torch_threads} torch threads: "
                        f"{plan.reason}")
    dataset = None
    if data is not None:
        from turbotrain.pipeline import PipelineOptions, choose_pipeline
        from .data import auto_image_size, open_split
        from .models import auto_model
        from .resolve import auto_batch_size
        dataset = open_split(data, "train")
        size, why = auto_image_size(dataset, device.type)
        picks["image size"] = f"{size}: {why}"
        picks["model"] = ": ".join(auto_model(size, device.type, len(dataset)))
        from .config import TrainConfig
        batch, why = auto_batch_size(size, device.type, len(dataset), TrainConfig.epochs)
        picks["batch size"] = f"{batch}: {why} (lowered at start if it does not fit)"
        name, why = choose_pipeline(dataset, PipelineOptions(train=True, batch_size=batch,
                                                             image_size=size, device=device))
        picks["pipeline"] = f"{name}: {why}"
    return picks, device, dataset


def gather(data: str | None = None) -> dict:
    from turbotrain import __version__
    picks, device, dataset = train_picks(data)
    return {"turbotrain": __version__, "versions": versions(), "cpu": cpu(), "gpus": gpus(),
            "pipelines": pipelines(device, dataset), "train would pick": picks}


def format_info(info: dict) -> str:
    lines = [f"turbotrain {info['turbotrain']}", "", "versions:"]
    lines += [f"  {k:<20} {v}" for k, v in info["versions"].items()]
    c = info["cpu"]
    features = " ".join(c["features"]) or "none of " + " ".join(CPU_FEATURES)
    lines += ["", f"CPU: {c['model']}",
              f"  cores                {c['cores usable']} usable of {c['cores in machine']}",
              f"  features             {features}",
              f"  torch kernels        {c['torch kernels']}",
              f"  native bf16          {'yes' if c['native bf16'] else 'no'}; AMX "
              f"{'yes' if c['AMX'] else 'no'}"]
    lines += ["", "GPUs:" if info["gpus"] else "GPUs: none (torch.cuda.is_available() is False)"]
    for g in info["gpus"]:
        lines.append(f"  {g['index']}: {g['name']}, {g['memory GiB']} GiB ({g['free GiB']} free), "
                     f"compute {g['compute capability']}, bf16 {'yes' if g['bf16'] else 'no'}")
    lines += ["", "pipelines:"]
    lines += [f"  {k:<20} {v}" for k, v in info["pipelines"].items()]
    lines += ["", "train would pick:"]
    lines += [f"  {k:<20} {v}" for k, v in info["train would pick"].items()]
    return "\n".join(lines)


def run_info(args: argparse.Namespace) -> int:
    from turbotrain.datasets import DatasetError
    from .errors import TrainError
    try:
        info = gather(args.data)
    except (DatasetError, TrainError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return 0
