"""Running a trained model: what `eval`, `predict` and `export` share.

Each command loads a model from `--run RUNDIR` (its best.safetensors, else final.safetensors;
see weights.py) or from `--weights FILE`, and runs it as the trainer's evaluation does: eval
mode, autocast in the run's precision, channels_last for conv nets, the cores split between the
input threads and torch by the trainer's own rule (`device.plan_threads`). With `--run`, the
run's saved settings (RUNDIR/config.yaml) are the defaults, so `eval` on the run's own val
split repeats the number the run logged. A user's mistake is one line and exit code 2, as in
`train`.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from turbotrain.datasets import DatasetError
from turbotrain.datasets.sources.source import SourceError
from turbotrain.pipeline import PipelineError
from turbotrain.printable import printable
from turbotrain.process_end import stdout_reader_gone

from ..config.config_files import read_yaml
from ..config.config_flags import parse_value
from ..errors import TrainError
from ..models.models import get_model_spec
from ..plan.device_choice import pick_channels_last, pick_device, pick_precision
from ..plan.hardware import detect_machine
from ..step.device import apply_torch_threads, autocast_context, available_cores, plan_threads
from ..step.distributed import dist_env_from_environ
from ..step.flip_tta import eval_logits
from ..weights.weights import MAX_SIDE, ModelCard, load_classifier, run_weights


@dataclass
class LoadedModel:
    """A model ready to run, and where it came from."""
    model: torch.nn.Module          # Classifier (uint8 NCHW in, logits out), eval mode
    card: ModelCard
    path: Path                      # the weights file read
    run_dir: Path | None            # with --run
    settings: dict                  # the run's config.yaml ({} without a run)
    device: torch.device
    precision: str
    channels_last: bool
    load_seconds: float             # reading the file and building the model
    # The evaluation the run made (the card's), unless --eval-res / --tta / --no-tta say
    # otherwise: the input side, and whether logits average the image's and its mirror's.
    input_size: int = 0
    tta: bool = False

    @property
    def memory_format(self) -> torch.memory_format:
        return torch.channels_last if self.channels_last else torch.contiguous_format

    @torch.no_grad()
    def logits(self, images: torch.Tensor) -> torch.Tensor:
        """The logits of a uint8 (B, 3, S, S) batch on the model's device, computed as the
        trainer's `loop.evaluate` computes them, in autocast's dtype (bf16 logits tie more
        often than float32 ones: argmax and topk on these very values break ties as the
        trainer's evaluation did)."""
        images = images.to(self.device, non_blocking=True)
        images = images.contiguous(memory_format=self.memory_format)
        with autocast_context(self.device, self.precision):
            return eval_logits(self.model, images, tta=self.tta)


def add_model_arguments(parser: argparse.ArgumentParser, *, runtime: bool = True) -> None:
    """--run RUNDIR | --weights FILE (one of them), and with `runtime` --device, --precision."""
    source = parser.add_argument_group("model (one of)")
    which = source.add_mutually_exclusive_group(required=True)
    # dest run_dir: `args.run` is the command's entry point (turbotrain/cli.py).
    which.add_argument("--run", metavar="RUNDIR", dest="run_dir",
                       help="a train run folder: its best.safetensors (the best val accuracy), "
                            "else final.safetensors; its config.yaml gives the defaults below")
    which.add_argument("--weights", metavar="FILE",
                       help="a weights file: best.safetensors, final.safetensors, or `export "
                            "--format safetensors`'s")
    if not runtime:
        return
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where to run (default: auto, CUDA when available)")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default=None,
                        help="autocast precision (default: the run's, when on the same kind of "
                             "device; else auto, as train picks)")
    parser.add_argument("--eval-res", type=eval_side, default=None, metavar="PX",
                        help="input resolution (default: the weights card's, the resolution "
                             "the run evaluated at)")
    parser.add_argument("--tta", action=argparse.BooleanOptionalAction, default=None,
                        help="flip test-time augmentation: average each image's logits with "
                             "its mirror's (default: as the run evaluated, the card's)")


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `minimum` (--batch-size, --top-k, --workers)."""
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {text}")
        return value
    parse.__name__ = "int"  # argparse's "invalid int value: 'x'"
    return parse


def eval_side(text: str) -> int:
    """An argparse type: --eval-res, a side in pixels of 8 to MAX_SIDE."""
    value = at_least(8)(text)
    if value > MAX_SIDE:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_SIDE}, not {text}")
    return value


eval_side.__name__ = "int"


def load_model(args: argparse.Namespace, *, device: str = "auto",
               precision: str | None = None, prog: str = "turbotrain") -> LoadedModel:
    """The model `args.run` or `args.weights` names, on the device and in the precision asked
    for (or the run's, unless it is emulated and slow here: then what train would pick here,
    said in a note on stderr). TrainError for a missing run, a run without weights, or a file
    that is not a turbotrain weights file (all one line)."""
    started = time.perf_counter()
    run_dir = None
    if getattr(args, "run_dir", None):
        run_dir = Path(args.run_dir)
        if not run_dir.is_dir():
            raise TrainError(f"--run {run_dir}: no such run folder"
                             + ("" if not run_dir.exists() else " (it is a file: pass it as "
                                "--weights FILE)"))
        source = run_weights(run_dir)
    else:
        source = Path(args.weights)
        if source.is_dir():
            raise TrainError(f"--weights {source} is a folder; pass --run {source}, or the "
                             "weights file in it")
    settings = run_settings(run_dir) if run_dir is not None else {}
    # The same decisions as train's (plan/device_choice.py), for the machine detected once.
    requested = getattr(args, "device", device) or device
    machine = detect_machine(dist_env_from_environ(), gpus=requested != "cpu")
    dev = pick_device(requested, machine.gpus,
                      machine.local_rank).value
    gpu = machine.gpu if dev.type == "cuda" else None
    model, card = load_classifier(source, dev)
    same_kind = settings.get("device") == dev.type
    asked = getattr(args, "precision", precision) or precision
    inherited = asked is None
    if asked is None:
        asked = settings.get("precision", "auto") if same_kind else "auto"
    chosen_precision = pick_precision(asked, dev.type, gpu, machine.cpu_bf16)
    if chosen_precision.warning and inherited:  # a bf16 run on a CPU without native bf16
        chosen_precision = pick_precision("auto", dev.type, gpu, machine.cpu_bf16)
        print(f"{prog}: note: the run's precision {asked} is emulated on this CPU (3-6x slower "
              f"than fp32); running in {chosen_precision.value} (--precision {asked} keeps "
              f"the run's)", file=sys.stderr)
    elif chosen_precision.warning:
        print(f"{prog}: warning: {chosen_precision.warning}", file=sys.stderr)
    spec = get_model_spec(card.model, model_kwargs=card.model_kwargs, image_size=card.image_size)
    channels_last = settings.get("channels_last") if same_kind else None
    channels_last = pick_channels_last(channels_last, spec.conv).value
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    size = getattr(args, "eval_res", None) or card.input_size
    if size != card.image_size and not spec.any_size:
        raise TrainError(f"--eval-res {size}: model {card.model} is built for "
                         f"{card.image_size} px inputs; leave --eval-res out")
    tta = getattr(args, "tta", None)
    return LoadedModel(model=model, card=card, path=Path(source), run_dir=run_dir,
                       settings=settings, device=dev,
                       precision=chosen_precision.value,
                       channels_last=channels_last,
                       load_seconds=time.perf_counter() - started,
                       input_size=size, tta=card.tta if tta is None else tta)


# What eval, predict and export take from a run's config.yaml.
RUN_SETTINGS = ("data", "batch_size", "pipeline", "worker_mode", "precision", "channels_last",
                "device", "seed")


def run_settings(run_dir: Path) -> dict:
    """The RUN_SETTINGS in RUNDIR/config.yaml (train's resolved values), each checked as its
    flag is; {} without the file. Other keys are ignored, so a run written by another version
    of train (more or fewer settings) still evaluates."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return {}
    loaded = read_yaml(path)
    loaded = loaded if isinstance(loaded, dict) else {}
    settings = {}
    for name in RUN_SETTINGS:
        raw = loaded.get(name.replace("_", "-"), loaded.get(name))
        if raw is not None and isinstance(raw, (str, int, float, bool)):
            settings[name] = parse_value(name, raw)
    return settings


def apply_thread_plan(device: torch.device, *, workers: int | None, jpeg: bool):
    """The trainer's split of the cores between input threads and torch (device.plan_threads:
    on a CPU they must not compete); applies torch's share and returns the plan."""
    plan = plan_threads(device, cores=available_cores(), workers=workers, threads=None,
                        jpeg_fraction=1.0 if jpeg else 0.0)
    apply_torch_threads(plan.torch_threads)
    return plan


def user_errors() -> tuple[type[BaseException], ...]:
    """What ends a command with one line and exit code 2: bad input, not a bug."""
    return TrainError, DatasetError, PipelineError, SourceError


def run_command(prog: str, body: Callable[[argparse.Namespace], int],
                args: argparse.Namespace) -> int:
    """body(args)'s exit code; a user error is `PROG: error: ...` on stderr and 2."""
    try:
        return body(args)
    except user_errors() as exc:
        return fail(prog, str(exc))
    except BrokenPipeError:
        if stdout_reader_gone():  # `predict ... | head`: ends quietly (process_end.py)
            raise
        return fail(prog, "a connection closed while writing to it (Broken pipe)")
    except OSError as exc:  # writing an output where it cannot go, a disk full
        where = f"{exc.filename}: " if exc.filename else ""
        return fail(prog, f"{where}{exc.strerror or exc}")
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def fail(prog: str, message: str) -> int:
    """One line on stderr (names from a dataset or a card are escaped); returns 2."""
    print(f"{prog}: error: {printable(' '.join(message.split()))}", file=sys.stderr)
    return 2


def describe(loaded: LoadedModel) -> str:
    """One line: which weights, what model, where they came from."""
    card, info = loaded.card, loaded.card.info
    origin = [f"{key} {info[key]}" for key in ("epoch", "step") if key in info]
    if isinstance(info.get("val_accuracy"), (int, float)):
        origin.append(f"val_accuracy {info['val_accuracy']:.2%}")
    evaluated = (f", evaluated at {loaded.input_size} px" if loaded.input_size
                 and loaded.input_size != card.image_size else "")
    tta = ", flip TTA" if loaded.tta else ""
    return (f"{loaded.path}: {card.model}, {card.num_classes} classes, {card.image_size} px"
            + evaluated + tta + (f" ({', '.join(origin)})" if origin else "")
            + f"; {loaded.device}, {loaded.precision}, loaded in {loaded.load_seconds:.2f} s")
