"""A plain PyTorch training script whose mistakes are switched on by flags: what
bench_doctor.py runs the doctor on (and tests/train/tools/test_doctor_*.py, tiny). It knows
nothing of the doctor; it prints one line `RESULT {json}` with its own images/s, timed from
the end of its warm-up steps to its last step, so a run with and without the doctor (or
before and after a change) is compared on the script's own clock.

    python bench/doctor_script.py --data pil:FOLDER --workers 0           # decode in the loop
    python bench/doctor_script.py --workers 2 --threads 2                 # on 2 cores
    python bench/doctor_script.py --batch-size 8                          # where 128 fits
    torchrun --nproc-per-node 2 bench/doctor_script.py --accum 2          # DDP, gloo
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--data", default="tensors", help="tensors, or pil:FOLDER (an ImageFolder)")
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--model", choices=["conv", "mlp"], default="conv")
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--bf16", action="store_true", help="autocast to bf16")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--item", action="store_true", help="loss.item() every step")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--no-sync", action="store_true", help="DDP no_sync on the micro-batches")
    p.add_argument("--no-loader", action="store_true", help="slice tensors, no DataLoader")
    p.add_argument("--hook-ab", type=int, default=0, metavar="BLOCK",
                   help="under `turbotrain doctor`: after warm-up, turn the hook's timing off and "
                        "on every BLOCK steps, and report both sides' block times (bench)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--fail-at", type=int, default=0, help="raise at this step (tests)")
    p.add_argument("--exit-code", type=int, default=0)
    return p.parse_args(argv)


def dataset(args):
    if args.data.startswith("pil:"):
        from torchvision import datasets, transforms
        return datasets.ImageFolder(args.data[4:], transforms.Compose([
            transforms.RandomResizedCrop(args.image_size), transforms.ToTensor()]))
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(args.samples, 3, args.image_size, args.image_size,
                                     generator=g),
                         torch.randint(0, 10, (args.samples,), generator=g))


def model_of(args) -> torch.nn.Module:
    w = args.width
    if args.model == "mlp":
        return torch.nn.Sequential(torch.nn.Flatten(),
                                   torch.nn.Linear(3 * args.image_size ** 2, 8 * w),
                                   torch.nn.ReLU(), torch.nn.Linear(8 * w, 8 * w),
                                   torch.nn.ReLU(), torch.nn.Linear(8 * w, 10))
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, w, 3, padding=1), torch.nn.BatchNorm2d(w), torch.nn.ReLU(),
        torch.nn.Conv2d(w, 2 * w, 3, padding=1, stride=2), torch.nn.BatchNorm2d(2 * w),
        torch.nn.ReLU(), torch.nn.Conv2d(2 * w, 2 * w, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(2 * w, 10))


def batches(args, data, rank: int, world: int):
    if args.no_loader:
        x, y = data.tensors
        while True:
            for i in range(rank * args.batch_size, len(x), world * args.batch_size):
                yield x[i:i + args.batch_size], y[i:i + args.batch_size]
    sampler = None
    if world > 1:
        from torch.utils.data.distributed import DistributedSampler
        sampler = DistributedSampler(data, num_replicas=world, rank=rank)
    if len(data) < world * args.batch_size:  # drop_last would leave no batch at all
        raise SystemExit(f"{len(data)} samples: fewer than one batch of {args.batch_size} "
                         f"for each of {world} rank(s)")
    loader = DataLoader(data, batch_size=args.batch_size, num_workers=args.workers,
                        pin_memory=args.pin_memory, shuffle=sampler is None, sampler=sampler,
                        drop_last=True, persistent_workers=args.workers > 0)
    while True:
        yield from loader


def main(argv=None) -> int:
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        torch.distributed.init_process_group("gloo")
    device = torch.device(args.device)
    model = model_of(args).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if args.bf16
                else contextlib.nullcontext())
    stream = batches(args, dataset(args), rank, world)
    started = None
    ab = HookAB(args.hook_ab) if args.hook_ab else None
    for step in range(args.steps):
        if ab is not None and step >= args.warmup:
            ab.at_step(step - args.warmup)
        if step == args.fail_at and args.fail_at:
            raise RuntimeError(f"planted failure at step {step}")
        if step == args.warmup:
            started = time.perf_counter()
        for micro in range(args.accum):
            x, y = next(stream)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if args.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            last = micro == args.accum - 1
            skip = args.no_sync and world > 1 and not last
            with model.no_sync() if skip else contextlib.nullcontext():
                with autocast:
                    loss = F.cross_entropy(model(x), y) / args.accum
                loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if args.item:
            loss.item()
    seconds = time.perf_counter() - started if started is not None else 0.0
    timed = args.steps - args.warmup
    images = timed * args.batch_size * args.accum
    result = {"rank": rank, "steps": timed, "seconds": round(seconds, 4),
              "images_per_second": round(images / seconds, 2) if seconds else None}
    if ab is not None:
        ab.at_step(timed)
        result["hook_ab"] = ab.blocks
    print("RESULT " + json.dumps(result), flush=True)
    if world > 1:
        # DDP's reducer must go before its process group: left to the interpreter's exit, it
        # was destroyed after the group and the rank aborted ("terminate called without an
        # active exception", 2 runs in 5 under torchrun on the 2-core box)
        del model, optimizer
        gc.collect()
        torch.distributed.destroy_process_group()
    return args.exit_code


class HookAB:
    """The doctor hook's cost inside one process: blocks of steps timed with the hook's timing
    on and off in turn (its patches pass straight through while off). Both sides share the
    process's speed, which here differs from one process to the next by up to 4x for a
    1.5 ms step, more than the cost being measured."""

    def __init__(self, block: int):
        patches = sys.modules.get("turbotrain_doctor.doctor_patches")  # doctor_run.HOOK_PACKAGE
        self.clock = getattr(patches, "CLOCK", None)
        if self.clock is None:
            raise SystemExit("--hook-ab: run this script under `turbotrain doctor`")
        self.block = block
        self.blocks: dict[str, list[float]] = {"on": [], "off": []}
        self.started = None

    def at_step(self, timed_step: int) -> None:
        if timed_step % self.block:
            return
        now = time.perf_counter()
        if self.started is not None:
            self.blocks["on" if self.clock.active else "off"].append(now - self.started)
            self.clock.active = not self.clock.active
        self.started = now


if __name__ == "__main__":
    raise SystemExit(main())
