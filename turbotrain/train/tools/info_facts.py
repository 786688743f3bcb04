"""What `turbotrain info` reports (info.py prints it): versions, CPU, GPUs, the pipelines that
can run, and what `train` would pick here or on a preset machine."""
from __future__ import annotations

import importlib.metadata
import os
import platform

import torch

from turbotrain import __version__
from turbotrain.pipeline import kernel
from turbotrain.pipeline.auto import why_unavailable
from turbotrain.pipeline.registry import capabilities, pipeline_names
from turbotrain.pipeline.resident import budget_of
from turbotrain.pipeline.workers import split_cores

from ..config.config import TrainConfig
from ..engine.data import open_split, open_val_split
from ..plan import DatasetFacts, Machine, detect_machine, plan
from ..step.distributed import dist_env_from_environ

CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16",
                "amx_int8")


def _version(*distributions: str) -> str | None:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def engine_versions() -> dict[str, str]:
    """label -> version of each registered pipeline's optional package ("DALI", "FFCV"), as
    the pipelines declare it (registry.OptionalPackage)."""
    found = {}
    for name in pipeline_names():
        package = capabilities(name).package
        if package is not None:
            found[package.label] = package.version() or "not installed"
    return found


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
    found = {"python": platform.python_version(), "torch": torch.__version__,
             "torch CUDA": torch.version.cuda or "none (CPU build)",
             "cuDNN": str(torch.backends.cudnn.version()) if torch.cuda.is_available() else None,
             "torchvision": _version("torchvision"), **engine_versions(),
             "numba": _version("numba"), "numpy": _version("numpy")}
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
    found["decode kernel"] = kernel.STATUS  # or why the Python path runs instead
    found["simplejpeg"] = _version("simplejpeg")
    if found["simplejpeg"]:
        found["simplejpeg"] += " (bundles libjpeg-turbo; the Python decode path's decoder)"
    found["OpenCV"] = _version("opencv-python-headless", "opencv-python",
                               "opencv-contrib-python")
    return {k: v for k, v in found.items() if v is not None}


def cpu(machine) -> dict:
    return {"model": machine.cpu_model if machine.cpu_model != "unknown" else
            platform.processor() or "unknown",
            "cores usable": machine.cores,
            # a preset describes only what a process there may use
            "cores in machine": os.cpu_count() if machine.name == "this machine"
            else machine.cores,
            "features": [f for f in CPU_FEATURES if f in machine.cpu_flags],
            "torch kernels": torch.backends.cpu.get_cpu_capability(),
            "native bf16": machine.cpu_bf16, "AMX": "amx_tile" in machine.cpu_flags}


def gpus(machine) -> list[dict]:
    """The machine's GPUs as detect_machine (or a preset) describes them: free memory only where
    it was measured, on this rank's GPU (asking the others would open a CUDA context on each,
    ~500 MB of their memory; hardware.py)."""
    return [{"index": i, "name": g.name, "memory GiB": round(g.memory_bytes / 2**30, 1),
             "free GiB": None if g.free_bytes is None else round(g.free_bytes / 2**30, 1),
             "compute capability": "{}.{}".format(*g.capability), "bf16": g.bf16}
            for i, g in enumerate(machine.gpus)]


def pipelines(planned, facts=None) -> dict[str, str]:
    """name -> "usable" or why not, on the plan's machine and device, by auto's own rule
    (auto.why_unavailable): asked for by name (`train --pipeline NAME`), and whether auto would
    take it; they differ for a pipeline with a CPU path that auto takes only on CUDA (dali).
    Without a dataset, a pipeline that holds the decoded split (resident) states its budget."""
    machine, device = planned.machine, planned.device
    gpu = machine.gpu if device.type == "cuda" else None
    budget = budget_of(gpu.free if gpu is not None else machine.ram_bytes, device)
    status = {}
    for name in machine.pipelines:
        declared = capabilities(name)
        if facts is None and declared.holds_decoded_split:
            status[name] = (f"usable when the decoded split fits in {budget[0] / 2**30:.1f} GiB "
                            f"({budget[1]})")
            continue
        need = facts.resident_bytes(planned.config.image_size) if facts is not None else 0
        verdicts = [why_unavailable(name, registered=machine.pipelines,
                                    installed=machine.installed, device_type=device.type,
                                    resident_need=need, budget=budget, named=named)
                    for named in (True, False)]
        by_name, by_auto = verdicts
        if by_name is not None:
            status[name] = f"unavailable: {by_name}"
        elif by_auto is not None:
            status[name] = (f"usable with --pipeline {name} ({declared.cpu_path}); auto skips "
                            f"it here: {by_auto}")
        else:
            status[name] = "usable"
    return status


def train_picks(data: str | None = None, machine=None):
    """What `train --data DATA` would decide on `machine` (this one when None): the plan, and
    name -> "value: reason" for each decision; without data, the machine's decisions and the
    thread split for JPEG and for raw data."""
    machine = machine or detect_machine(dist_env_from_environ())
    facts = None
    if data is not None:
        facts = DatasetFacts.of(open_split(data, "train"), *open_val_split(data))
    planned = plan(TrainConfig(data=data), facts, machine)
    picks = {}
    for name, decision in planned.decisions.items():
        value = decision.value
        if isinstance(value, bool):
            value = "on" if value else "off"
        picks[name.replace("_", " ")] = f"{value}: {decision.reason}"
    for label, jpeg in (("threads, JPEG data", 1.0), ("threads, raw data", 0.0)):
        split = split_cores(planned.device.type, cores=machine.cores_per_rank, workers=None,
                            threads=None, jpeg_fraction=jpeg)
        picks[label] = (f"{split.workers} pipeline workers + {split.torch_threads} torch "
                        f"threads: {split.reason}")
    return picks, planned, facts


def gather(data: str | None = None, machine_name: str | None = None) -> dict:
    preset = Machine.preset(machine_name) if machine_name else None
    picks, planned, facts = train_picks(data, preset)
    return {"turbotrain": __version__, "versions": versions(),
            "machine": planned.machine.describe(), "cpu": cpu(planned.machine),
            "gpus": gpus(planned.machine), "pipelines": pipelines(planned, facts),
            "train would pick": picks}


def format_info(info: dict) -> str:
    lines = [f"turbotrain {info['turbotrain']}", f"machine: {info['machine']}", "",
             "versions:"]
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
        free = "free not measured" if g["free GiB"] is None else f"{g['free GiB']} free"
        lines.append(f"  {g['index']}: {g['name']}, {g['memory GiB']} GiB ({free}), "
                     f"compute {g['compute capability']}, bf16 {'yes' if g['bf16'] else 'no'}")
    lines += ["", "pipelines:"]
    lines += [f"  {k:<20} {v}" for k, v in info["pipelines"].items()]
    lines += ["", "train would pick:"]
    lines += [f"  {k:<20} {v}" for k, v in info["train would pick"].items()]
    return "\n".join(lines)
