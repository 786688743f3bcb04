"""`turbotrain info`: what the doctor knows about this machine, and what `train` would pick here.

    turbotrain info [--data OUT] [--machine NAME] [--json]

Versions (torch, torchvision, DALI, FFCV, Pillow or Pillow-SIMD, simplejpeg, OpenCV and their
JPEG codecs), CPU cores and features (AVX-512, native bf16, AMX), GPUs and their memory, which
pipelines can run, and the plan `train` would make here (plan/): device / precision / compile /
thread choices, each with its reason; with --data, every decision for that dataset (image size,
model, batch size or its search bound, lr, warm-up, pipeline, threads). --machine plans for a
machine we are not on (plan.PRESETS: cpu2, h200, 8xh200, 2x8xh200, ...).

The facts are gathered in info_facts.py, which imports torch; this module does not, so that
`info --help` starts in 0.19 s.
"""
from __future__ import annotations

import argparse
import json
import sys

from turbotrain.datasets import DatasetError

from ..errors import TrainError

PROG = "turbotrain info"


def add_info_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None,
                   help="a prepared dataset: also show what train would pick for it")
    p.add_argument("--json", action="store_true", help="print the facts as JSON")
    p.add_argument("--machine", default=None, metavar="NAME",
                   help="show the plan for a machine we are not on: cpu2, cpu16-avx2, h200, "
                        "v100, 8xh200, 8xh200-torchrun, 2x8xh200 (train/plan/machine.py)")


def run_info(args: argparse.Namespace) -> int:
    # lazy: `info --help` needs no torch (0.19 s against 2.2 s)
    from turbotrain.pipeline import PipelineError

    from .info_facts import format_info, gather
    try:
        info = gather(args.data, getattr(args, "machine", None))
    except (DatasetError, TrainError, PipelineError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return 0
