"""`turbotrain doctor [--steps N] [--warmup K] [--out DIR] [--stop] -- COMMAND ...`: runs your
own training script, unmodified, with a hook that times its steps (doctor_hook.py), then says
where the time went, the verdict in `train`'s words, and what to change, ranked by the
measured gain. The report goes to stderr (the script's stdout stays its own) and to
DIR/doctor.json, with DIR/timeline.png; the measurements stay in DIR/measurements/.
The doctor's exit code is the script's.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from turbotrain import host
from turbotrain.files.safe_create import write_file

from .doctor_analysis import SHARE_NAMES, SHARES, analyse, processes, summary
from .doctor_findings import KEEP_FREED_MEMORY
from .doctor_run import MEASUREMENTS, CommandError, check_command, read_measurements, \
    run_measured

PROG = "turbotrain doctor"
DEFAULT_WARMUP = 5


def add_doctor_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=_positive, default=None, metavar="N",
                   help="optimizer steps to time after the warm-up (default: about 5 s worth, "
                        "10 to 300, decided from the warm-up's pace)")
    p.add_argument("--warmup", type=_not_negative, default=DEFAULT_WARMUP, metavar="K",
                   help=f"steps left untimed first (default {DEFAULT_WARMUP})")
    p.add_argument("--out", default="doctor", metavar="DIR",
                   help="where doctor.json, timeline.png and the measurements go "
                        "(default: ./doctor)")
    p.add_argument("--stop", action="store_true",
                   help="end the script once the steps are timed and probed (exit code 0); "
                        "default: let it run to its end")
    p.add_argument("--data-estimate", action=argparse.BooleanOptionalAction, default=True,
                   help="when the run is input-bound on an ImageFolder: prepare a sample of "
                        "it and time turbotrain's loader on it (a few seconds; default: on)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="the training command, e.g. -- python train.py --epochs 1, "
                        "-- torchrun --nproc-per-node 2 train.py, -- python -m mypackage.train")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


def _not_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def machine_facts() -> dict:
    """Measured once here and handed to the child and the analysis (never re-derived): the
    CPU's bf16 is plan/hardware.py's, the one reader of the hardware."""
    from ..plan.hardware import cpu_native_bf16  # lazy: imports torch; `doctor --help` must not
    return {"cores": host.available_cores(), "bf16_native": cpu_native_bf16(),
            # the script inherits this environment: glibc told to keep freed memory already?
            "freed_memory_kept": all(os.environ.get(name, "").isdigit() and int(
                os.environ[name]) >= int(value) for name, value in KEEP_FREED_MEMORY.items())}


def run_doctor(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    try:
        check_command(command)
    except CommandError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    machine = machine_facts()
    config = {"steps": args.steps, "warmup": args.warmup, "stop": args.stop, **machine}
    try:
        end = run_measured(command, config, out / MEASUREMENTS)
    except OSError as e:
        print(f"{PROG}: error: {command[0]}: {e.strerror or e}", file=sys.stderr)
        return 2
    try:
        report = build_report(read_measurements(out / MEASUREMENTS), machine, command,
                              end.returncode, end.interrupted)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:  # the script's code wins
        print(f"{PROG}: error: the measurements in {out / MEASUREMENTS} could not be read "
              f"({e!r}); the script's exit code was {end.returncode}", file=sys.stderr)
        return end.returncode
    if args.data_estimate:
        _add_data_estimate(report, machine["cores"])
    write_file(out / "doctor.json", json.dumps(report, indent=2) + "\n")
    timeline = _plot(out, report, read_measurements(out / MEASUREMENTS))
    print("\n".join(report_lines(report, out, timeline)), file=sys.stderr)
    return end.returncode


def build_report(files: dict, machine: dict, command: list[str], returncode: int,
                 interrupted: bool) -> dict:
    reports = [analyse(p, machine) for p in processes(files)]
    return {"command": command, "exit_code": returncode, "interrupted": interrupted,
            "machine": machine, "processes": reports, "summary": summary(reports)}


def _add_data_estimate(report: dict, cores: int) -> None:
    """turbotrain's loader timed on a sample of the first input-bound process's ImageFolder."""
    # lazy: prepare, the pipelines and torch load only for an input-bound ImageFolder run
    from .doctor_data import turbotrain_estimate, wants_estimate
    for process in report["processes"]:
        if wants_estimate(process):
            process["turbotrain_data"] = turbotrain_estimate(process, cores)
            return


def report_lines(report: dict, out: Path, timeline: Path | None) -> list[str]:
    lines = [f"\n{PROG}: {' '.join(report['command'])}"]
    if report["exit_code"] != 0 or report["interrupted"]:
        why = "interrupted" if report["interrupted"] else f"exit code {report['exit_code']}"
        lines.append(f"the script ended early ({why}); what was measured until then:")
    if not report["processes"]:
        lines.append("nothing measured: no process of the command imported torch and ran a "
                     "model, a DataLoader or an optimizer")
    for process in report["processes"]:
        lines += process_lines(process, len(report["processes"]) > 1)
    if report["summary"]:
        s = report["summary"]
        lines.append(f"all {s['ranks']} ranks: {s['step_ms']['min']:.1f}-"
                     f"{s['step_ms']['max']:.1f} ms a step; the slowest, rank "
                     f"{s['slowest_rank']}, sets the pace: {s['verdict']}")
    lines.append(f"report: {out / 'doctor.json'}" + (f", {timeline}" if timeline else ""))
    return lines


def process_lines(p: dict, ranked: bool) -> list[str]:
    head = f"rank {p['rank']}: " if ranked and p["rank"] is not None else ""
    lines = []
    if p["timed_steps"]:
        rate = (f", {p['images_per_second']:,.0f} images/s" if p["images_per_second"] else "")
        lines.append(f"{head}{p['timed_steps']} timed steps, {p['step_ms']:.1f} ms a step"
                     f"{rate}")
        for key in SHARES:
            lines.append(f"  {SHARE_NAMES[key]:<22} {p['shares'][key]:>4.0%}  "
                         f"{p['ms'][key]:8.1f} ms")
        lines.append(f"verdict: {p['verdict']}")
    elif head:
        lines.append(f"{head}no timed steps")
    for note in p["notes"]:
        lines.append(f"  note: {note}")
    for rank, f in enumerate(p["findings"], start=1):
        where = f" ({f['site']})" if f.get("site") else ""
        expected = (f"expected {f['gain']:.2f}x" if f.get("kind") != "switch" else
                    f"at most {f['gain']:.2f}x (a change of loader, ranked after the fixes "
                    "to your script)")
        lines.append(f"{rank}. {f['title']}{where}: {expected}")
        lines += [f"   evidence: {e}" for e in f["evidence"]]
        lines.append(f"   change:   {f['change']}")
        lines.append(f"   estimate: {f['estimate']}")
    if p["timed_steps"] and not p["findings"]:
        lines.append("no finding: nothing on the doctor's list would gain 5 % here")
    if "turbotrain_data" in p:
        lines += estimate_lines(p["turbotrain_data"])
    return lines


def estimate_lines(estimate: dict) -> list[str]:
    if "error" in estimate:
        return [f"  turbotrain's loader on the same data: not measured ({estimate['error']})"]
    yours = (f" against your loader's {estimate['yours']:,.0f}" if estimate.get("yours")
             else "")
    return [f"turbotrain on the same data: its pytorch pipeline loads "
            f"{estimate['images_per_second']:,.0f} images/s ({estimate['image_size']} px, "
            f"batch {estimate['batch_size']}, all cores; `turbotrain bench` on "
            f"{estimate['sample']} of the images){yours}:",
            f"   turbotrain prepare-dataset {estimate['root']} PREPARED",
            f"   loader = turbotrain.Loader('PREPARED', batch_size={estimate['batch_size']}, "
            f"image_size={estimate['image_size']}, normalize=True)"]


def _plot(out: Path, report: dict, files: dict) -> Path | None:
    """timeline.png of the first training process's steps, as `train` draws its own."""
    # lazy: matplotlib and the timeline (torch) load only when there is a step to draw
    from ..records.profiling import StepTime
    from ..records.timeline import TIMELINE_NAME, StepTimeline
    trainers = processes(files)
    steps = [r for r in (trainers[0]["records"] if trainers else []) if r.get("kind") == "step"]
    if not steps:
        return None
    timeline = StepTimeline()
    timeline.add([StepTime(s["i"], s["wait"], max(0.0, s["dur"] - s["wait"])) for s in steps])
    warm = [s["i"] for s in steps if not s.get("warmup")]
    if warm:
        timeline.profiled = (warm[0], warm[-1])
    return timeline.plot(out / TIMELINE_NAME, title=f"turbotrain doctor: "
                                                   f"{' '.join(report['command'])[:80]}")
