"""The `turbotrain` command and its short aliases `prepare-dataset` and `train`.

    turbotrain prepare SOURCE OUT      (also: prepare-dataset SOURCE OUT)
    turbotrain prepare SOURCE OUT --shard-size 1GB --part i/N ; turbotrain merge OUT
    turbotrain prepare SOURCE OUT --shard-size 1GB --engine ray   (the parts as Ray tasks, merged)
    turbotrain inspect OUT | verify OUT
    turbotrain train --data OUT ...    (also: train --data OUT ...)
    turbotrain bench --data OUT ...
    turbotrain tune --data OUT ...     (the fastest train settings on this machine)
    turbotrain info                    (versions, CPU/GPU features, what train would pick)
    turbotrain doctor -- python train.py   (your own script: where the time goes, what to change)
    turbotrain eval --run RUNDIR | predict --run RUNDIR IMAGES | export --run RUNDIR --format F

Heavy packages (torch, cv2, DALI, FFCV) are imported inside each command, so `--help` and
`prepare-dataset` start in a fraction of a second.
"""
from __future__ import annotations

import argparse
import signal
import sys

from . import __version__
from .arg_parser import CommandParser
from .datasets.beton.layout import SMALL_IMAGE_MAX_SIDE
from .datasets.errors import DatasetError
from .files.untrusted import Limits
from .os_failure import reporting
from .printable import printable
from .process_end import run_as_process

EXIT_USAGE = 2


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


def _fail(prog: str, message: str) -> int:
    """One line on stderr; the message often quotes names from a dataset, hence `printable`
    (idempotent: text it already escaped holds nothing left to escape)."""
    print(f"{prog}: error: {printable(message)}", file=sys.stderr)
    return EXIT_USAGE


# -- prepare ------------------------------------------------------------------------------------
def add_prepare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="raw dataset: ImageFolder, CIFAR folder/.tar.gz, MNIST idx "
                                  "folder, .npz, a CSV/TSV of path,label, WebDataset shards "
                                  "(a .tar, a folder, or a pattern like 'train-{0000..0009}"
                                  ".tar'), or a Hugging Face save_to_disk folder / Parquet / "
                                  "Arrow files")
    p.add_argument("out", help="output folder (dataset.json + one .beton per split)")
    p.add_argument("--encoding", choices=["auto", "jpeg", "raw"], default="auto",
                   help=f"auto: raw pixels for images <= {SMALL_IMAGE_MAX_SIDE} px, JPEG "
                        "otherwise (default)")
    p.add_argument("--max-side", type=int, default=512,
                   help="downsize so the longest side is at most N px; 0 keeps it (default 512)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality when re-encoding")
    p.add_argument("--workers", type=int, default=0, help="encoding processes (default: all cores)")
    p.add_argument("--val-fraction", type=float, default=0.0,
                   help="carve a class-stratified val split from a one-split source")
    p.add_argument("--on-error", choices=["fail", "skip"], default="fail",
                   help="fail (default): stop at the first unreadable image; skip: list it in "
                        "OUT/skipped.txt")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing OUT that prepare-dataset made (never any other "
                        "folder); with --part: redo that part's files only")
    p.add_argument("--classes", choices=["all", "present"], default="all",
                   help="all (default): every class the source declares (CIFAR's, a "
                        "ClassLabel's, integer labels 0..max), with its label id, even one "
                        "with no images (a warning names them); present: only the classes "
                        "with images in some split, renumbered 0..K-1 in the source's order")
    hf = p.add_argument_group("Hugging Face sources (Parquet, Arrow, save_to_disk)")
    hf.add_argument("--image-column", metavar="NAME", default=None,
                    help="the column of images (default: image, else img)")
    hf.add_argument("--label-column", metavar="NAME", default=None,
                    help="the column of labels (default: label, else labels)")
    shards = p.add_argument_group("shards and parts (docs/FORMAT.md)")
    shards.add_argument("--shard-size", metavar="SIZE", default=None,
                        help="write each split as numbered .beton shards of about SIZE of "
                             "source data (1GB, 512MB, 64MiB or bytes; at least 8MiB); "
                             "default: one .beton per split. The train split is stored "
                             "in a fixed shuffled order, so each shard mixes the classes")
    shards.add_argument("--part", metavar="I/N", default=None,
                        help="convert only part I of N (0 <= I < N) of the shards, for one "
                             "machine of many; then `turbotrain merge OUT`")
    shards.add_argument("--engine", choices=["local", "ray"], default="local",
                        help="local (default): this process; ray: every part as a Ray task "
                             "(retried if its worker dies), then merge (pip install "
                             "'turbotrain[ray]'; docs/PREPARE_AT_SCALE.md)")
    shards.add_argument("--parts", type=int, metavar="N", default=None,
                        help="with --engine ray: the number of parts (default: 4 per CPU of "
                             "the cluster, at most one per shard)")
    shards.add_argument("--address", metavar="ADDR", default=None,
                        help="with --engine ray: the cluster to run on (default: a local one)")
    safety = p.add_argument_group("limits on untrusted data (docs/SECURITY.md)")
    safety.add_argument("--allow-outside-root", action="store_true",
                        help="read CSV rows and symlinks that lead outside SOURCE (refused by "
                             "default)")
    safety.add_argument("--max-file-mb", type=_positive_mb, default=Limits.max_file_bytes >> 20,
                        metavar="MB", help="largest image or list file read (default %(default)s)")
    safety.add_argument("--max-array-mb", type=_positive_mb,
                        default=Limits.max_array_bytes >> 20, metavar="MB",
                        help="largest pixel data of a CIFAR/idx/.npz source, inflated "
                             "(default %(default)s)")
    safety.add_argument("--max-inflate-ratio", type=float, default=Limits.max_inflate_ratio,
                        metavar="X", help="refuse a compressed source that inflates more than "
                                          "X times its size, above 64 MiB (default %(default)g)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: when stderr is a terminal)")


def _positive_mb(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of MiB, not {text}")
    return value


def run_prepare(args: argparse.Namespace, prog: str = "prepare-dataset") -> int:
    # lazy: each command's modules load when it runs: `turbotrain --help` stays at 0.15 s
    from .datasets.prepare.convert import PrepareError, PrepareOptions, prepare_dataset
    from .datasets.prepare.shard_plan import ShardPlanError, parse_part, parse_shard_size
    try:
        shard_size = None if args.shard_size is None else parse_shard_size(args.shard_size)
        part = None if args.part is None else parse_part(args.part)
    except ShardPlanError as e:
        return _fail(prog, str(e))
    if args.engine == "local" and (args.parts is not None or args.address is not None):
        return _fail(prog, "--parts and --address are for --engine ray (with --engine local, "
                           "run --part i/N on each machine)")
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)  # clean up on `kill` too
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    limits = Limits(max_file_bytes=args.max_file_mb << 20, max_array_bytes=args.max_array_mb << 20,
                    max_inflate_ratio=args.max_inflate_ratio)
    options = PrepareOptions(encoding=args.encoding, max_side=args.max_side, quality=args.quality,
                             workers=args.workers, val_fraction=args.val_fraction,
                             on_error=args.on_error, overwrite=args.overwrite, progress=progress,
                             limits=limits, allow_outside_root=args.allow_outside_root,
                             shard_size=shard_size, part=part, image_column=args.image_column,
                             label_column=args.label_column, classes=args.classes)
    try:
        if args.engine == "ray":
            return _prepare_on_ray(args, options)
        info = prepare_dataset(args.source, args.out, options)
    except PrepareError as e:
        return _fail(prog, str(e))
    except KeyboardInterrupt:
        done = "this part was not finished" if part else f"{args.out} was left untouched"
        if args.engine == "ray":
            done = (f"the parts done so far stay in {args.out}: run the same command again to "
                    f"do the others and merge")
        print(f"{prog}: interrupted; {done}", file=sys.stderr)
        return 130
    if info["workers"]["note"]:
        print(f"{prog}: note: {info['workers']['note']}", file=sys.stderr)
    _print_class_lines(prog, info["class_lines"])
    if part and info.get("skipped_as_done"):
        print(f"part {part[0]}/{part[1]} of {args.out} is already done with the same inputs: "
              f"skipped (--overwrite redoes it)")
        return 0
    if part:
        shards = info["shards"]
        written = sum(s["num_samples"] for s in shards)
        skipped = sum(len(s["skipped"]) for s in shards)
        print(f"prepared part {part[0]}/{part[1]} of {args.out}: {len(shards)} shard(s), "
              f"{written} images, {skipped} skipped, {info['seconds']:.1f} s; when every part "
              f"is done: turbotrain merge {args.out}")
        return 0
    written = sum(s["num_samples"] for s in info["splits"].values())
    skipped = sum(s["skipped"] for s in info["splits"].values())
    size = sum(s["bytes"] for s in info["splits"].values())
    rate = written / info["seconds"] if info["seconds"] else 0.0
    splits = ", ".join(f"{k} {v['num_samples']}" for k, v in info["splits"].items())
    print(f"prepared {args.out}: {written} images ({splits}), {len(info['classes'])} "
          f"class{'' if len(info['classes']) == 1 else 'es'}, "
          f"{size / 1e6:.1f} MB, {rate:.0f} images/s, {skipped} skipped"
          + (f" (see {args.out}/skipped.txt)" if skipped else ""))
    return 0


def _print_class_lines(prog: str, lines: list[str]) -> None:
    """prepare's warnings and notes on classes with no images (sources/class_labels.py)."""
    for line in lines:
        print(f"{prog}: {printable(line)}", file=sys.stderr)


def _prepare_on_ray(args: argparse.Namespace, options) -> int:
    # lazy: the Ray engine (and Ray) load only for --engine ray
    from .datasets.prepare.engine_ray import prepare_with_ray
    info, run = prepare_with_ray(args.source, args.out, options, parts=args.parts,
                                 address=args.address)
    _print_class_lines("prepare-dataset", run.class_lines)
    written = sum(s["num_samples"] for s in info["splits"].values())
    print(f"prepared {args.out} on Ray: {run.parts} parts ({run.skipped} already done, "
          f"{run.ran} run, {run.parts_per_second:.2f} parts/s), merged: {written} images, "
          f"{run.seconds:.1f} s")
    return 0


# -- inspect / verify ---------------------------------------------------------------------------
def run_inspect(args: argparse.Namespace) -> int:
    # lazy: each command's modules load when it runs: `turbotrain --help` stays at 0.15 s
    from .datasets import explain
    from .datasets.beton.verify import describe
    try:
        print(describe(args.out))
    except DatasetError as e:
        return _fail("turbotrain inspect", explain(args.out, e))
    return 0


def run_verify(args: argparse.Namespace) -> int:
    # lazy: each command's modules load when it runs: `turbotrain --help` stays at 0.15 s
    from .datasets import explain
    from .datasets.beton.verify import verify
    try:
        problems = verify(args.out, progress=sys.stderr.isatty())
    except DatasetError as e:
        return _fail("turbotrain verify", explain(args.out, e))
    for problem in problems:
        print(printable(problem), file=sys.stderr)
    if problems:
        return _fail("turbotrain verify", f"{len(problems)} problem(s) in {args.out}")
    print(f"{printable(args.out)}: ok")
    return 0


def run_merge(args: argparse.Namespace) -> int:
    # lazy: each command's modules load when it runs: `turbotrain --help` stays at 0.15 s
    from .datasets.prepare.merge import MergeError, merge
    from .datasets.prepare.part_status import parts_status, status_lines
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)  # `kill` ends it as Ctrl-C does
    try:
        if args.check:  # what merge would find, part by part; nothing is written
            lines = status_lines(parts_status(args.out))
            print("\n".join(lines))
            return 0 if lines[-1].endswith("ready to merge") else 1
        info = merge(args.out)
    except MergeError as e:
        return _fail("turbotrain merge", str(e))
    except KeyboardInterrupt:
        # Whatever it was doing, merging again finishes it: the manifests go only after
        # dataset.json is written. A second Ctrl-C while the exit joins the hashing threads
        # ends the process without a traceback.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        print(f"turbotrain merge: interrupted; run `turbotrain merge {printable(args.out)}` "
              f"again to finish", file=sys.stderr)
        return 130
    shards = sum(len(s["shards"]) for s in info["splits"].values())
    written = sum(s["num_samples"] for s in info["splits"].values())
    print(f"merged {printable(args.out)}: {shards} shards, {written} images")
    return 0


# -- cache ------------------------------------------------------------------------------------
def run_cache(args: argparse.Namespace) -> int:
    # lazy: each command's modules load when it runs: `turbotrain --help` stays at 0.15 s
    from .datasets.remote.split import cache_settings
    from .datasets.remote.shard_cache import LOCKS, ShardCache, shown_size
    try:
        folder, limit = cache_settings(args.cache_dir, args.cache_limit)
        if not (folder / LOCKS).is_dir():  # never made by the cache: nothing is created
            print(f"{printable(folder)}: no shard cache there (nothing was downloaded into it)")
            return 0
        cache = ShardCache(folder, limit)
        if args.clear:
            files, nbytes = cache.clear()
            print(f"deleted {files} file(s) of the cache, {shown_size(nbytes)}")
        ours, strangers = cache.contents()
    except (DatasetError, OSError) as e:
        return _fail("turbotrain cache", str(e) if isinstance(e, DatasetError)
                     else f"--cache-dir {folder}: {e.strerror or e}")
    held = [made for made, busy in ours if busy]
    total = sum(made.bytes for made, _ in ours)
    print(f"{printable(folder)}: {len(ours)} file(s) of the cache, {shown_size(total)} of its "
          f"{shown_size(limit)} limit; {len(held)} held by a running process"
          + ("" if args.clear or not ours else " (--clear deletes the others)"))
    if strangers:
        print(f"{len(strangers)} other name(s), which the cache never reads, counts or deletes "
              f"(yours, an older turbotrain's shards, or files whose record was lost); delete "
              f"those nobody needs yourself:")
        for path in strangers[:STRANGERS_SHOWN]:
            print(f"  {printable(path.name)}")
        if len(strangers) > STRANGERS_SHOWN:
            print(f"  ... and {len(strangers) - STRANGERS_SHOWN} more")
    return 0


STRANGERS_SHOWN = 20


def _add_cache_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", help="the shard cache folder (default: $TURBOTRAIN_CACHE, "
                                       "else ~/.cache/turbotrain/shards)")
    p.add_argument("--cache-limit", help="its limit, for the report (default: "
                                         "$TURBOTRAIN_CACHE_LIMIT, else 50GB)")
    p.add_argument("--clear", action="store_true",
                   help="delete every file the cache downloaded that no running process holds")


# -- dispatch ---------------------------------------------------------------------------------
def _add_inspect_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", help="a prepared dataset folder")


def _add_merge_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", help="the folder the parts were written into (or copied together in)")
    p.add_argument("--check", "--parts-status", action="store_true",
                   help="list the done, missing and damaged parts (by manifest and shard "
                        "sizes) and merge nothing; exit code 1 unless all are done")


def _train_command():
    # lazy: torch (~1.5 s) loads only for the command that needs it
    from .train.cli import add_train_arguments, run_train
    return add_train_arguments, run_train


def _bench_command():
    # lazy: torch (~1.5 s) loads only for the command that needs it
    from .pipeline.bench import add_bench_arguments, run_bench
    return add_bench_arguments, run_bench


def _tune_command():
    # lazy: torch (~1.5 s) loads only for the command that needs it
    from .train.tools.tune import add_tune_arguments, run_tune
    return add_tune_arguments, run_tune


def _info_command():
    # lazy: `info --help` needs no torch (0.19 s)
    from .train.tools.info import add_info_arguments, run_info
    return add_info_arguments, run_info


def _demo_command():
    # lazy: numpy and PIL load only when the demo runs
    from .demo import add_demo_arguments, run_demo
    return add_demo_arguments, run_demo


def _doctor_command():
    # lazy: the doctor's parent never needs torch until it draws the timeline
    from .train.tools.doctor import add_doctor_arguments, run_doctor
    return add_doctor_arguments, run_doctor


def _eval_command():
    # lazy: torch (~1.5 s) loads only for the command that needs it
    from .train.use.evaluate import add_eval_arguments, run_eval
    return add_eval_arguments, run_eval


def _predict_command():
    # lazy: torch (~1.5 s) loads only for the command that needs it
    from .train.use.predict import add_predict_arguments, run_predict
    return add_predict_arguments, run_predict


def _export_command():
    # lazy: torch (~1.5 s) loads only for the command that needs it
    from .train.use.export import add_export_arguments, run_export
    return add_export_arguments, run_export


# name -> (one-line help, loader returning (add_arguments, run)). Loaders import lazily so that
# `turbotrain prepare` never pays for importing torch (~1.5 s here) and `--help` stays instant.
COMMANDS = {
    "prepare": ("convert a raw image dataset into .beton files (alias: prepare-dataset)",
                lambda: (add_prepare_arguments, run_prepare)),
    "inspect": ("show what a prepared dataset holds",
                lambda: (_add_inspect_arguments, run_inspect)),
    "verify": ("check every checksum and decode every image",
               lambda: (_add_inspect_arguments, run_verify)),
    "merge": ("check the parts of a `prepare --part i/N` conversion and write dataset.json",
              lambda: (_add_merge_arguments, run_merge)),
    "cache": ("what the shard cache of --data URLs holds; --clear deletes what no run holds",
              lambda: (_add_cache_arguments, run_cache)),
    "train": ("train a model on a prepared dataset", _train_command),
    "bench": ("images/s of each pipeline on a prepared dataset", _bench_command),
    "demo": ("generate a sample dataset, prepare it and train on it", _demo_command),
    "tune": ("find the fastest pipeline, workers and batch size for train on this machine",
             _tune_command),
    "info": ("versions, CPU/GPU features, usable pipelines and what train would pick here",
             _info_command),
    "doctor": ("run your own training script with a hook: where each step's time goes, "
               "the verdict, and what to change (-- python train.py)", _doctor_command),
    "eval": ("a trained model's accuracy on a prepared split: eval.json, confusion.png",
             _eval_command),
    "predict": ("class names and probabilities for image files, as a CSV", _predict_command),
    "export": ("a trained model as safetensors, TorchScript or ONNX, checked against it",
               _export_command),
}
ALIASES = {"prepare-dataset": "prepare"}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The full parser; only `command`'s subparser gets its arguments (the others are listed)."""
    parser = CommandParser(prog="turbotrain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"turbotrain {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, load) in COMMANDS.items():
        aliases = [a for a, target in ALIASES.items() if target == name]
        p = sub.add_parser(name, aliases=aliases, help=help_text, description=help_text)
        if name == command:
            add_arguments, run = load()
            add_arguments(p)
            p.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    command = ALIASES.get(command, command)
    # Parsing too: building train's parser imports torch, which an address-space limit stops.
    return reporting(command_prog(command), _parse_and_run, command, argv)


def _parse_and_run(command: str | None, argv: list[str]) -> int:
    args = build_parser(command if command in COMMANDS else None).parse_args(argv)
    return args.run(args)


def command_prog(command: str | None) -> str:
    """The name a command's error lines start with (as its own `_fail` calls say it)."""
    if command not in COMMANDS:
        return "turbotrain"
    return {"prepare": "prepare-dataset", "train": "train"}.get(command, f"turbotrain {command}")


def prepare_dataset_main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="prepare-dataset",
                           description="Convert a raw image dataset into .beton files.")
    add_prepare_arguments(parser)
    return reporting("prepare-dataset", run_prepare, parser.parse_args(argv))


def train_main(argv: list[str] | None = None) -> int:
    return main(["train", *(sys.argv[1:] if argv is None else argv)])


def console_main() -> None:
    """`turbotrain ...` (the console script; `python -m turbotrain` too): main, then the end
    process_end.py gives a process that read a URL."""
    run_as_process(main)


def console_prepare_dataset() -> None:
    run_as_process(prepare_dataset_main)


def console_train() -> None:
    run_as_process(train_main)


if __name__ == "__main__":
    console_main()
