"""The checks of bench/gpu_check.py that would have caught issue 41's bugs on the GPU host, each
one `check` line (ok / FAILED) in gpu_check's report:

* device facts: a CPU-only run's precision follows the CPU's own bf16 flag (/proc/cpuinfo),
  not the GPUs' (Machine.detect passed the last GPU's flag as the CPU's), and detecting for
  `--device cpu` opens no CUDA context (a fresh process: torch.cuda.is_initialized());
* DALI's hand-off: its GPU batches equal its CPU path's byte for byte where both are exact
  (raw samples at the training size; the same crop boxes), over several epochs: a missing
  stream wait shows as different pixels, not as an error;
* hidden syncs: one training step of each pipeline (resident, pytorch, dali, ffcv as installed)
  under torch.cuda.set_sync_debug_mode("error");
* compile and DDP: `train` builds torch.compile(DDP(model)) (DDP first), and a step runs.
  With one GPU DDP has no all-reduce to overlap: both orders are timed only with 2+ GPUs.

On a CPU (--smoke) only the first runs: the others need CUDA.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent


def device_checks(report, engines: dict, cuda: bool) -> None:
    checks = [bf16_flag_of_a_cpu_run]
    if cuda:
        checks += [dali_pixels_exact, no_hidden_sync, compile_wraps_ddp]
    for check in checks:
        try:
            check(report, engines)
        except Exception as e:  # noqa: BLE001 - a check reports any failure and goes on
            report.check(check.__name__, False, f"{type(e).__name__}: {e}"[:300])


def bf16_flag_of_a_cpu_run(report, engines) -> None:
    from turbotrain import host
    from turbotrain.train.config.config import TrainConfig
    from turbotrain.train.plan import detect_machine, plan
    from turbotrain.train.step.distributed import dist_env_from_environ
    flags = host.cpu_info().flags
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    machine = detect_machine(dist_env_from_environ())
    picked = plan(TrainConfig(data="d", device="cpu"), None, machine)["precision"].value
    want = "bf16" if native else "fp32"
    gpus = ", ".join(f"{g.name} bf16={g.bf16}" for g in machine.gpus) or "no GPU"
    report.check("cpu run precision", machine.cpu_bf16 == native and picked == want,
                 f"CPU flags say native bf16={native}; detected {machine.cpu_bf16}; "
                 f"--device cpu plans {picked} (want {want}); GPUs: {gpus}")
    code = ("from turbotrain.train.plan import detect_machine; import torch; "
            "from turbotrain.train.step.distributed import dist_env_from_environ as e; "
            "detect_machine(e(), gpus=False); print(torch.cuda.is_initialized())")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    report.check("cpu run opens no CUDA context", out.stdout.strip() == "False",
                 f"torch.cuda.is_initialized() after detecting for --device cpu: "
                 f"{out.stdout.strip() or out.stderr.strip()[-200:]}")


def _raw_split(folder: Path, count: int = 256, side: int = 32):
    import numpy as np

    from turbotrain.datasets import open_dataset
    from turbotrain.datasets.beton import layout
    from turbotrain.datasets.beton.writer import BetonWriter
    images = np.random.default_rng(7).integers(0, 256, (count, side, side, 3), dtype=np.uint8)
    path = folder / "raw.beton"
    with BetonWriter(path, count, page_size=layout.MIN_PAGE_SIZE) as writer:
        for i in range(count):
            writer.append(layout.MODE_RAW, side, side, images[i].tobytes(), i % 10)
    return open_dataset(path)


def _epoch(pipeline, epoch: int) -> list:
    pipeline.set_epoch(epoch)
    return [(images.cpu(), labels.cpu()) for images, labels in pipeline]


def dali_pixels_exact(report, engines) -> None:
    if not engines.get("dali"):
        report.check("dali pixels exact", False, "DALI is missing: not checked")
        return
    import torch

    from turbotrain.pipeline import build_pipeline
    with tempfile.TemporaryDirectory() as folder:
        dataset = _raw_split(Path(folder))
        options = dict(train=False, batch_size=64, image_size=32, seed=3, workers=4)
        with build_pipeline("dali", dataset, device=torch.device("cuda"), **options) as gpu:
            on_gpu = [_epoch(gpu, e) for e in range(3)]
        with build_pipeline("dali", dataset, device=torch.device("cpu"), **options) as cpu:
            on_cpu = _epoch(cpu, 0)
    differing = sum(not (torch.equal(g[0], c[0]) and torch.equal(g[1], c[1]))
                    for epoch in on_gpu for g, c in zip(epoch, on_cpu))
    report.check("dali pixels exact", differing == 0 and len(on_cpu) > 0,
                 f"{differing} of {3 * len(on_cpu)} GPU batches differ from the CPU path's "
                 "(raw samples, same boxes, 3 epochs)")


def no_hidden_sync(report, engines) -> None:
    import torch
    from torch import nn

    from turbotrain.pipeline import build_pipeline
    from turbotrain.train.step.loop import StepSettings, make_engine

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 10)

        def forward(self, images):
            return self.head(self.conv(images.float() / 255).mean((2, 3)))
    cuda = torch.device("cuda")
    names = ["resident", "pytorch"] + [n for n in ("dali", "ffcv") if engines.get(n)]
    with tempfile.TemporaryDirectory() as folder:
        dataset = _raw_split(Path(folder))
        for name in names:
            settings = StepSettings(device=cuda, precision="bf16", channels_last=True, lr=0.01)
            engine = make_engine(Tiny().to(cuda, memory_format=torch.channels_last), settings)
            synced = []
            for train in (True, False):
                with build_pipeline(name, dataset, device=cuda, train=train, batch_size=32,
                                    image_size=32, seed=0, workers=2) as pipeline:
                    pipeline.set_epoch(0)
                    batches = iter(pipeline)
                    engine.micro_step(*next(batches), will_step=True)  # warm-up
                    engine.optimizer_step(0)
                    torch.cuda.synchronize()
                    torch.cuda.set_sync_debug_mode("error")
                    try:
                        images, labels = next(batches)
                        if train:
                            engine.micro_step(images, labels, will_step=True)
                            engine.optimizer_step(1)
                    except RuntimeError as e:
                        synced.append(f"{'train' if train else 'eval'}: {e}"[:160])
                    finally:
                        torch.cuda.set_sync_debug_mode(0)
            report.check(f"{name}: no hidden sync", not synced,
                         "; ".join(synced) or "one train step and one eval batch under "
                         "set_sync_debug_mode('error')")


def compile_wraps_ddp(report, engines) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from turbotrain.train.config.config import TrainConfig
    from turbotrain.train.engine.builder import _place_model
    from turbotrain.train.step.distributed import DistEnv
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        config = TrainConfig(data="d", compile=True, precision="bf16", channels_last=False)
        planned = SimpleNamespace(config=config, device=torch.device("cuda", 0),
                                  compile_mode="default")
        model, _ = _place_model(nn.Linear(64, 10), planned, DistEnv(world_size=2), None,
                                lambda *a: None)
        inner = type(getattr(model, "_orig_mod", None)).__name__
        model(torch.randn(32, 64, device="cuda")).sum().backward()
        torch.cuda.synchronize()
        report.check("compile wraps DDP", inner == "DistributedDataParallel",
                     f"train's model: {type(model).__name__} of {inner}; a step ran "
                     f"({torch.cuda.device_count()} GPU(s): both orders timed only with 2+)")
    finally:
        dist.destroy_process_group()
