"""What the benchmark scripts share, so each says only what it measures.

* `run_child`: a contender in a fresh process (no warm interpreter, thread pool or compiled
  state carried over), whose last stdout line is a JSON object (`print_result` writes it);
  the load average when it started is kept with the result, since the machine is shared.
* `interleaved` and `best`: every contender once per round, in turn, so that a busy
  neighbour hurts all alike, and the best round counting.
* `ratio_goal`, `command_line`, `write_results`: what every result file holds besides its
  numbers: its goals (bench/report.py reads them from the JSON, never from a copy of its
  own), the exact command, when it was measured and on which machine (`machine`: CPU, SIMD
  and bf16/AMX flags, cores, RAM, torch, Python, the load average at the script's start and
  at its end, the commit), and the JSON itself. The one place a result file is written.

Scripts import it as `common` (bench/ is the script's folder, hence first on sys.path).
"""
from __future__ import annotations

import datetime
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent


def load_average() -> float:
    return os.getloadavg()[0]


def print_result(result: dict) -> None:
    """A child's result: one JSON line, the last of its output (run_child reads it)."""
    print(json.dumps(result), flush=True)


def run_child(argv: list, *, timeout: float = 900, env: dict | None = None,
              cwd: Path | None = None) -> dict:
    """`python ARGV...` in a fresh process; the JSON object on its last stdout line plus
    "load" (the 1-minute load average when it started). A child that fails, times out or
    prints no JSON gives {"error": one line, "load": ...} instead."""
    load = load_average()
    command = [sys.executable, *map(str, argv)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=env, cwd=cwd)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s", "load": load}
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail}", "load": load}
    try:
        result = json.loads((done.stdout.strip().splitlines() or [""])[-1])
    except json.JSONDecodeError:
        return {"error": f"no result line: {done.stdout.strip()[-200:]!r}", "load": load}
    return {**result, "load": load}


def timed_command(command: list[str]) -> dict:
    """Runs `command` to its end (a fresh process: start-up counts); its seconds and the load."""
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return {"seconds": time.perf_counter() - started, "load": load_average()}


def rate_line(result: dict) -> str:
    """How `interleaved` shows a result by default: its images/s, or its error."""
    rate = result.get("images_per_second")
    shown = f"{rate:,.0f} images/s" if rate else result.get("error", "no result")
    return shown + (f"  (load {result['load']:.2f})" if "load" in result else "")


def interleaved(rounds: int, contenders: dict[str, Callable[[], dict]],
                show: Callable[[dict], str] = rate_line, *,
                alternate: bool = False) -> dict[str, list[dict]]:
    """Runs every contender once per round, in turn, printing each result as it comes;
    returns each one's results, round by round. `alternate`: every other round in the
    reverse order, so a drift of the machine's speed within a round favours neither side."""
    runs: dict[str, list[dict]] = {name: [] for name in contenders}
    width = max((len(name) for name in contenders), default=0)
    for round_ in range(rounds):
        order = list(contenders.items())
        for name, run in (order[::-1] if alternate and round_ % 2 else order):
            runs[name].append(run())
            print(f"round {round_ + 1} {name:<{width}}  {show(runs[name][-1])}", flush=True)
    return runs


def best_run(runs: list[dict], metric: str = "images_per_second", *,
             lowest: bool = False) -> dict | None:
    """The run with the highest `metric` (the lowest, for times); None when none has one."""
    measured = [r for r in runs if r.get(metric) is not None]
    if not measured:
        return None
    return (min if lowest else max)(measured, key=lambda r: r[metric])


def best(runs: list[dict], metric: str = "images_per_second", *,
         lowest: bool = False) -> float | None:
    """best_run's value of `metric`."""
    run = best_run(runs, metric, lowest=lowest)
    return None if run is None else run[metric]


def paired_ratio(numerators: list[dict], denominators: list[dict],
                 metric: str = "images_per_second") -> float | None:
    """The median over rounds of one round's numerator / denominator: steadier than best /
    best when the machine's speed drifts between rounds (one fast round decides a best)."""
    ratios = sorted(a[metric] / b[metric] for a, b in zip(numerators, denominators)
                    if a.get(metric) is not None and b.get(metric))
    return statistics.median(ratios) if ratios else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def ratio_goal(what: str, measured: float | None, goal: float) -> dict:
    """A goal as a result file records it: `measured` (a ratio) must be at least `goal`;
    "met" is None when nothing was measured. report.py shows it in the goals table."""
    return {"what": what, "ratio": measured, "goal": goal,
            "met": None if measured is None else measured >= goal}


def worded_goal(what: str, goal: str, measured: str | None, met: bool | None) -> dict:
    """A goal that is no single ratio ("all cases", "within 30 %"), as a result file records
    it; "met" is None when nothing was measured."""
    return {"what": what, "goal_text": goal, "measured": measured,
            "met": None if measured is None else met}


def command_line(script: str, argv: list[str] | None) -> str:
    """The command a result file records: `python bench/SCRIPT ARGS` (no venv path), the
    same form run_all.py runs and BENCHMARKS.md shows."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", f"bench/{Path(script).name}", *args])


def gpu_name() -> str | None:
    """The first GPU's name: torch's, when this process has torch loaded (never imported
    here: a script's parent process may not need it), else the NVIDIA driver's."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    for information in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        try:
            lines = Path(information).read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith("Model:"):
                return line.partition(":")[2].strip()
    return None


# The CPU flags a rate depends on: vector width, bf16 math, AMX tiles (the machine block keeps
# these, not /proc/cpuinfo's ~100).
RATE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


def _load_text() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# The load average when the script started: every benchmark imports this module first thing, so
# this is its "before" (the machine block adds the one at writing as its "after").
LOAD_AT_START = _load_text()


def git_commit() -> str | None:
    """The commit the benchmark ran on, "+dirty" when the tree had uncommitted changes; None
    outside a git checkout."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True,
                                  text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None
    commit = git("rev-parse", "--short=12", "HEAD")
    if commit is None:
        return None
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def machine() -> dict:
    """The machine block every result file carries, recorded by the script that measured it
    (write_results): what changes a rate (CPU, its vector flags, cores, RAM, GPU, torch,
    Python), the load average when the script started and when it wrote its results, and the
    commit. BENCHMARKS.md names the machine in each section and lists each one once."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from turbotrain.host import available_cores, cpu_info, isa_name, total_ram  # no torch
    try:
        from importlib.metadata import version
        torch_version = version("torch")
    except Exception:  # noqa: BLE001 - absent or broken metadata: say unknown
        torch_version = "unknown"
    cpu = cpu_info()
    ram = total_ram()
    return {"cpu": cpu.model or platform.processor() or "unknown", "cores": available_cores(),
            "simd": isa_name(cpu.flags) if cpu.read else None,
            # as torch can use them: ONEDNN_MAX_CPU_ISA, when set, hides those above it
            "flags": [f for f in RATE_FLAGS if f in cpu.flags] if cpu.read else None,
            "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
            "ram_gib": None if ram is None else round(ram / 2**30, 1), "gpu": gpu_name(),
            "torch": torch_version, "python": platform.python_version(),
            "platform": platform.platform(), "commit": git_commit(),
            "load_before": LOAD_AT_START, "load_after": _load_text()}


def write_results(path: Path, result: dict) -> Path:
    """Writes a result file: `result` plus when it was measured and the machine (a result
    that brings its own, e.g. a test's, keeps it)."""
    stamped = {"measured": datetime.datetime.now().isoformat(timespec="seconds"),
               "machine": machine(), **result}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stamped, indent=2, default=str) + "\n")
    return path


# -- what every benchmark's markdown(result) formats its table with --------------------------------
def md_table(headers: list[str], rows: list[list]) -> list[str]:
    """A markdown table's lines, then a blank one; None shows as "-"."""
    def cell(value) -> str:
        return "-" if value is None else str(value).replace("|", "\\|")
    return ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|",
            *("| " + " | ".join(cell(v) for v in row) + " |" for row in rows), ""]


def markdown(*parts: str | list[str] | None) -> str:
    """A section's text from paragraphs (str: a blank line follows each) and md_table's lines;
    a part that is None (a paragraph or table this result has not) is left out."""
    return "\n".join(line for part in parts if part is not None
                     for line in ([part, ""] if isinstance(part, str) else part))


def verdict(met: bool | None) -> str:
    """A goal's last cell."""
    return {True: "met", False: "**not met**", None: "not measured"}[met]


def rate(value: float | None) -> str | None:
    return None if value is None else f"{value:,.0f}"


def times(value: float | None) -> str | None:
    return None if value is None else f"{value:.2f}x"


def percent(value: float | None) -> str | None:
    return None if value is None else f"{value:.2%}"


def decimal(value: float | None, places: int = 1) -> str | None:
    return None if value is None else f"{value:.{places}f}"


def run_error(runs: list[dict]) -> str:
    """What a contender without a rate shows: its last run's error."""
    errors = [r.get("error") for r in runs if r.get("error")]
    return f"failed: {errors[-1]}" if errors else "no result"


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display): for the plots a script draws beside
    its result file."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
