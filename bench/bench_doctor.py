"""Is `turbotrain doctor`'s advice right? It runs the doctor on bench/doctor_script.py with one
planted mistake at a time, applies the top finding's change (its `settings`, as the script's
flags), and compares the predicted speedup with the measured one; then the hook's overhead.

    .venv/bin/python bench/bench_doctor.py [--rounds 5] [--steps 40] [--quick]

The cases (each script is otherwise clean: bf16 autocast where the CPU has it natively, so
that only the planted mistake is left to find):
  pil_workers0    ImageFolder of JPEGs, per-sample PIL decode, num_workers=0
  oversubscribed  the same data (batch 128) with as many workers as cores and as many
                  torch threads
  batch_8         batch 8 of in-memory tensors where 128 fits
  fp32_on_bf16    fp32 on a CPU with native bf16 (skipped on a CPU without it)
  page_faults     the batch-512 MLP with glibc mapping every block above 64 KiB afresh
                  (MALLOC_MMAP_THRESHOLD_=65536: what glibc's default does in some processes)
Every other case runs with glibc keeping its freed memory (CLEAN_ENV), as `turbotrain train`
does for itself: with glibc's defaults this VM's processes drew 59,000 to 304,000 page faults
per 100 steps of the batch-8 MLP, from one process to the next, at 1.3 us each (a 1.7 ms step
ran at 2.0-5.6 ms), which swamped the planted mistakes and their measured speedups.
Goal: the top finding is the expected one in every case and its predicted speedup is within
+-30 % of the measured (images/s of the script's own clock, --rounds runs each, before and
after, interleaved: the median of the rounds' ratios). Overhead: blocks of steps with the
hook's timing on and off in turn inside one process, --rounds processes (see overhead());
goal <= 2 %.
Writes bench/results/doctor.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
RESULTS = ROOT / "results" / "doctor.json"
SCRIPT = ROOT / "doctor_script.py"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(ROOT))

import common  # noqa: E402
from turbotrain.train.tools.doctor_findings import KEEP_FREED_MEMORY  # noqa: E402

GOAL_ERROR = 0.30  # predicted within +-30 % of measured
GOAL_OVERHEAD = 0.02
# a finding's settings -> the script's flags that apply them
FLAGS = {"workers": "--workers", "threads": "--threads", "batch_size": "--batch-size",
         "bf16": "--bf16", "channels_last": "--channels-last", "pin_memory": "--pin-memory",
         "no_sync": "--no-sync", "device": "--device"}
CLEAN_ENV = KEEP_FREED_MEMORY  # glibc keeps freed blocks for reuse (see the module's doc)


def cases(jpegs: Path, cores: int, bf16: bool, quick: bool) -> list[dict]:
    # native bf16 and channels_last (the conv net's) used, so only the planted mistake is left
    clean = ["--bf16"] if bf16 else []
    conv = [*clean, "--channels-last"]
    pil = ["--data", f"pil:{jpegs}", "--image-size", "64", "--batch-size", "32"]
    rows = [
        {"name": "pil_workers0", "expected": "num_workers", "overhead_steps": 150,
         "args": [*pil, "--workers", "0", *conv]},
        # torch threads set from a cpu_count that sees more cores than the process may use (a
        # container on a large host): 4x the cores. Workers = threads = cores (the mistake of
        # an earlier version of this case) was no mistake on 2 cores: the PIL workers bound the
        # step, and the doctor rightly found nothing to gain from moving a core.
        {"name": "oversubscribed", "expected": "oversubscribed",
         "args": [*pil, "--workers", "1", "--threads", str(4 * cores), *conv]},
        # a ~2 ms step: 400 timed (40 would be 80 ms, within this box's spells of slowness)
        {"name": "batch_8", "expected": "batch_size", "steps": 400, "overhead_steps": 1000,
         "args": ["--no-loader", "--model", "mlp", "--width", "64", "--batch-size", "8",
                  "--samples", "4096", *clean]},
        {"name": "fp32_on_bf16", "expected": "bf16", "needs_bf16": True,
         "args": ["--no-loader", "--image-size", "48", "--width", "32", "--batch-size", "128",
                  "--channels-last"]},
        # batch 512: at 128 this MLP has a second real mistake, its batch (the doctor's 4x
        # larger batch, predicted 2.23x, measured 2.11x), which can rank first
        {"name": "page_faults", "expected": "page_faults", "steps": 200,
         "env": {"MALLOC_MMAP_THRESHOLD_": "65536"},
         "args": ["--no-loader", "--model", "mlp", "--width", "64", "--batch-size", "512",
                  "--samples", "4096", *clean]},
    ]
    for row in rows:
        row["env"] = row.get("env", CLEAN_ENV)
    if quick:
        for row in rows:
            row["args"] = [a if a not in ("64", "48") else "32" for a in row["args"]]
    return rows


def write_jpegs(folder: Path, per_class: int) -> Path:
    """An ImageFolder of 2 classes of 500x375 JPEGs (ImageNet's typical size)."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    for c in range(2):
        (folder / f"c{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            # smooth gradients + noise: a photo-like JPEG size, not incompressible noise
            base = np.linspace(0, 255, 500, dtype=np.float32)[None, :, None]
            pixels = (base + rng.normal(0, 20, (375, 500, 3))).clip(0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"c{c}" / f"{i}.jpg", quality=90)
    return folder


def script_rate(args: list[str], env: dict, steps: int, warmup: int) -> dict:
    """The script's own images/s, run without the doctor, `env` added to its environment."""
    return _rate(subprocess.run([sys.executable, str(SCRIPT), *args, "--steps", str(steps),
                                 "--warmup", str(warmup)], capture_output=True, text=True,
                                timeout=900, env={**os.environ, **env}))


def _rate(done: subprocess.CompletedProcess) -> dict:
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return {**json.loads(line[7:]), "load": common.load_average()}
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"exit {done.returncode}: {tail}"}


def doctor(args: list[str], env: dict, out: Path, *, doctor_steps: int, warmup: int,
           script_steps: int, stop: bool) -> tuple[dict, dict]:
    """(the doctor's report, the script's own result line) of one run under the doctor."""
    command = [sys.executable, "-m", "turbotrain", "doctor", "--out", str(out), "--steps",
               str(doctor_steps), "--warmup", str(warmup), *(["--stop"] if stop else []),
               "--", sys.executable, str(SCRIPT), *args, "--steps", str(script_steps),
               "--warmup", str(warmup)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900,
                          env={**os.environ, **env, "PYTHONPATH": str(REPO)})
    report = json.loads((out / "doctor.json").read_text()) if (out / "doctor.json").is_file() \
        else {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return report, _rate(done)


def applied(args: list[str], env: dict, settings: dict) -> tuple[list[str], dict] | None:
    """The script's flags and environment with the finding's settings applied (None: not a
    flag of it)."""
    out = list(args)
    for key, value in settings.items():
        if key == "env":
            env = {**env, **value}
            continue
        flag = FLAGS.get(key)
        if flag is None:
            return None
        if isinstance(value, bool):
            out = [a for a in out if a != flag] + ([flag] if value else [])
        elif flag in out:
            out[out.index(flag) + 1] = str(value)
        else:
            out += [flag, str(value)]
    return out, env


def run_case(case: dict, args: argparse.Namespace, work: Path) -> dict:
    row = {"case": case["name"], "expected": case["expected"], "args": case["args"]}
    timed = args.steps if args.quick else case.get("steps", args.steps)
    row["steps"] = timed
    report, _ = doctor(case["args"], case["env"], work / case["name"], doctor_steps=timed,
                       warmup=args.warmup, script_steps=timed + args.warmup + 2, stop=True)
    process = (report.get("processes") or [{}])[0]
    findings = process.get("findings") or []
    row["verdict"] = process.get("verdict")
    row["findings"] = [(f["id"], f["gain"]) for f in findings]
    if not findings:
        return {**row, "error": report.get("error") or "no finding"}
    top = findings[0]
    row.update(top=top["id"], change=top["change"], predicted=top["gain"],
               estimate=top["estimate"], right=top["id"] == case["expected"])
    fixed = applied(case["args"], case["env"], top["settings"])
    if fixed is None:
        return {**row, "error": f"the change {top['settings']} is not a flag of the script"}
    steps = timed + args.warmup
    runs = common.interleaved(args.rounds, {
        "before": lambda: script_rate(case["args"], case["env"], steps, args.warmup),
        "after": lambda: script_rate(*fixed, steps, args.warmup)}, alternate=True)
    before, after = common.best(runs["before"]), common.best(runs["after"])
    # images/s (a larger batch is compared per image, as the doctor predicts it), the median of
    # the rounds' after/before: the doctor measured one process, and processes of the batch-8
    # script run its 1.1 ms step 15 % apart here (6,200-7,800 images/s), so a best of the
    # "before" runs is a fast process, not the one the doctor saw
    measured = common.paired_ratio(runs["after"], runs["before"])
    if measured:
        row["measured"] = round(measured, 3)
        row["error_pct"] = round(100 * (row["predicted"] / row["measured"] - 1), 1)
        row["within_goal"] = abs(row["predicted"] / row["measured"] - 1) <= GOAL_ERROR
    row["images_per_second"] = {"before": before, "after": after}
    return row


def overhead(args: argparse.Namespace, case: dict, work: Path) -> dict:
    """The hook's cost on a step, measured inside one process: the script runs under the doctor
    with `--hook-ab BLOCK` (doctor_script.HookAB), which turns the hook's timing off and on
    every BLOCK steps; the cost is the median, over each "off" block against the "on" block
    before it and the one after it, of on/off - 1. Both neighbours, because a process drifts:
    the batch-8 MLP ran 10-15 % faster at its end than at its start, and "on" always came first,
    so pairs taken one way only put the drift into the cost (1.8 % one way, 0.2 % both ways,
    over the same 40 pairs).
    A process here runs the same script at one of two or three speeds (the batch-8 MLP: about
    1,500, 4,500 or 5,500 images/s, with the hook or without), so runs with and without the
    hook, compared whole, measured which speed each run drew more than the hook (4-7 %, either
    way, for a cost that timed alone is ~15 us of a 1.3 ms step). The patches' pass-through
    while off (a Python call each, ~8 a step) is on both sides. The script's images/s without
    the doctor and with it (best of the rounds) are kept beside it."""
    steps = (args.steps if args.quick else case.get("overhead_steps", args.steps)) + args.warmup
    # 25 pairs a run: 50-step blocks of that MLP (130 ms) varied 8 % block to block, so the
    # median of 50 ratios was still +-1.4 % around the cost; shorter blocks give more ratios
    block = max(2, (steps - args.warmup) // 50)
    without, with_hook, ratios = [], [], []
    for round_ in range(args.rounds):
        plain = script_rate(case["args"], case["env"], steps, args.warmup)
        _, hooked = doctor([*case["args"], "--hook-ab", str(block)], case["env"],
                           work / f"overhead{round_}",
                           doctor_steps=10 * steps, warmup=args.warmup, script_steps=steps,
                           stop=False)
        without.append(plain.get("images_per_second"))
        with_hook.append(hooked.get("images_per_second"))
        blocks = hooked.get("hook_ab") or {}
        ratios += neighbour_ratios(blocks.get("on", []), blocks.get("off", []))
        print(f"  overhead round {round_ + 1}: without the doctor {without[-1]}, under it "
              f"{with_hook[-1]} images/s; {len(ratios)} on/off ratios so far", flush=True)
    if not ratios:
        return {"case": case["name"], "error": "no run finished"}
    cost = statistics.median(ratios) - 1
    return {"case": case["name"], "steps": steps - args.warmup, "block": block,
            "pairs": len(ratios), "without": without, "with_hook": with_hook,
            "overhead_pct": round(100 * cost, 2), "within_goal": cost <= GOAL_OVERHEAD}


def neighbour_ratios(on: list[float], off: list[float]) -> list[float]:
    """Each "off" block's time against the "on" blocks on both sides of it (on came first)."""
    return ([a / b for a, b in zip(on, off)]
            + [a / b for a, b in zip(on[1:], off)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40, help="timed steps of each run")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--images", type=int, default=256, help="JPEGs per class")
    parser.add_argument("--only", nargs="*", default=None, help="case names")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: tiny sizes, 1 round (numbers mean nothing); its "
                             "results go to a temporary file, never bench/results")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.warmup, args.images = 1, 6, 2, 32
    from turbotrain.train.tools.doctor import machine_facts
    machine = machine_facts()
    work = Path(tempfile.mkdtemp(prefix="bench-doctor-"))
    try:
        jpegs = write_jpegs(work / "jpegs", args.images)
        rows = []
        for case in cases(jpegs, machine["cores"], machine["bf16_native"], args.quick):
            if args.only and case["name"] not in args.only:
                continue
            if case.get("needs_bf16") and not machine["bf16_native"]:
                rows.append({"case": case["name"], "expected": case["expected"],
                             "skipped": "needs a CPU with native bf16"})
                continue
            print(f"== {case['name']}", flush=True)
            row = run_case(case, args, work)
            rows.append(row)
            print(f"   top finding {row.get('top')} (expected {row['expected']}): predicted "
                  f"{row.get('predicted')}x, measured {row.get('measured')}x "
                  f"{row.get('error', '')}", flush=True)
        base = cases(jpegs, machine["cores"], machine["bf16_native"], args.quick)
        hook = [overhead(args, base[0], work), overhead(args, base[2], work)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    done = [r for r in rows if "skipped" not in r]
    results = Path(tempfile.gettempdir()) / "bench_doctor.quick.json" if args.quick \
        else RESULTS
    result = {
        "command": common.command_line(__file__, argv), "quick": args.quick,
        "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup,
        "cores": machine["cores"], "cpu_native_bf16": machine["bf16_native"],
        "cases": rows, "overhead": hook}
    result["goals"] = goals(result)
    common.write_results(results, result)
    print(f"wrote {results}")
    return 0


def goals(result: dict) -> list[dict]:
    """The three goals as the Goals table shows them (worded: none is a single ratio)."""
    done = [c for c in result["cases"] if "skipped" not in c]
    errors = [abs(c["error_pct"]) for c in done if c.get("error_pct") is not None]
    overheads = [h["overhead_pct"] for h in result["overhead"]
                 if h.get("overhead_pct") is not None]
    return [
        common.worded_goal("the top finding is the planted mistake, every case", "all",
                           f"{sum(bool(c.get('right')) for c in done)}/{len(done)}",
                           all(c.get("right") for c in done) if done else None),
        common.worded_goal("predicted speedup vs measured, the worst case",
                           f"within {GOAL_ERROR:.0%}",
                           f"{max(errors):.0f}%" if errors else None,
                           (len(errors) == len(done) and max(errors) <= 100 * GOAL_ERROR)
                           if errors else None),
        common.worded_goal("the hook's overhead on a step", f"<= {GOAL_OVERHEAD:.0%}",
                           f"{max(overheads):.1f}%" if overheads else None,
                           max(overheads) <= 100 * GOAL_OVERHEAD if overheads else None)]


def markdown(result: dict) -> str:
    def best(rates: list) -> str | None:
        return common.rate(max(filter(None, rates), default=None))
    return common.markdown(
        f"`turbotrain doctor` on bench/doctor_script.py with one planted mistake each "
        f"({result.get('cores')} cores, native bf16: {result.get('cpu_native_bf16')}); the top "
        f"finding's change applied; speedup of the script's own images/s, the median of "
        f"{result.get('rounds')} rounds' after/before.",
        common.md_table(["planted mistake", "timed steps", "expected finding", "top finding",
                         "predicted", "measured", "predicted vs measured"],
                        [[c["case"], c.get("steps", result.get("steps")),
                          f"`{c.get('expected')}`",
                          c.get("top") or c.get("skipped") or c.get("error"),
                          common.times(c.get("predicted")), common.times(c.get("measured")),
                          None if c.get("error_pct") is None else f"{c['error_pct']:+.0f}%"]
                         for c in result.get("cases", [])]),
        common.md_table(["hook overhead on", "timed steps", "off blocks x their on neighbours",
                         "overhead",
                         "images/s without the doctor (best)", "under it (best)"],
                        [[h.get("case"), h.get("steps"), h.get("pairs"),
                          None if h.get("overhead_pct") is None else f"{h['overhead_pct']:.1f}%",
                          best(h.get("without", [])), best(h.get("with_hook", []))]
                         for h in result.get("overhead", [])]))


if __name__ == "__main__":
    sys.exit(main())
