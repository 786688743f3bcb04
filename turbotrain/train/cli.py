"""The `train` command's flags and entry point; turbotrain/cli.py mounts them as
`turbotrain train` and as the `train` console script.

    train --data OUT                              # everything else auto, reasons printed
    train --data OUT --model resnet18 --epochs 16 --batch-size 128 --accum-steps 2
    train --config run.yaml --lr 0.2              # flags win over the YAML file
    train --out RUNDIR --resume                   # continue exactly where it stopped
    torchrun --nproc-per-node 8 -m turbotrain train --data OUT       # one process per GPU
"""
from __future__ import annotations

import argparse
import sys

from turbotrain.arg_parser import CommandParser
from turbotrain.datasets import DatasetError
from turbotrain.pipeline import PipelineError, pipeline_names

from .config.config_files import config_and_sources
from .config.config_flags import add_config_arguments
from .errors import DistributedFailure, Interrupted, TrainError, TrainingDiverged
from .models.models import model_names
from .step.determinism import fix_cublas_workspace
from .step.host_memory import keep_freed_memory

PROG = "train"


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds one flag per TrainConfig field, grouped, to `parser`."""

    model_help = (f"ours: {', '.join(model_names())}; any torchvision classifier "
                  "(resnet18, resnet50, ...); timm:NAME when timm is installed")
    parser.description = parser.description or "Train a classifier on a prepared dataset."
    add_config_arguments(parser, pipeline_choices=pipeline_names(), model_help=model_help)


def _user_errors() -> tuple[type[BaseException], ...]:
    return TrainError, DatasetError, PipelineError


def run_train(args: argparse.Namespace) -> int:
    """Runs `train` for parsed `args`; returns the exit code. A user error prints one line
    `train: error: ...` on stderr and returns 2."""
    user_errors = _user_errors()
    # The command owns its process: glibc keeps freed blocks for reuse (host_memory.py, 1.4x
    # faster CPU steps), set before the pipelines and the model allocate anything (pipeline
    # worker processes fork later and inherit it). train() called from a program leaves its
    # caller's allocator alone; the run's printed `host_memory` decision says which happened.
    keep_freed_memory()
    try:
        config, sources = config_and_sources(args)
        # Before anything touches CUDA (the batch search runs CUDA steps early): step/
        # determinism.py says why cuBLAS needs it then.
        fix_cublas_workspace(config.deterministic)
        # lazy: `train --help` does not load the trainer (+80 ms)
        from .engine.trainer import train
        train(config, sources)
    except user_errors as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except (TrainingDiverged, DistributedFailure) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Interrupted as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; the last checkpoint written, if any, is kept",
              file=sys.stderr)
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    add_train_arguments(parser)
    return run_train(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
