"""`make bench`: every benchmark, one after another at its full default settings, then
BENCHMARKS.md rendered from bench/results/*.json and bench/NOTES.md (bench/report.py).

    .venv/bin/python bench/run_all.py                         # the whole suite (see below)
    .venv/bin/python bench/run_all.py --only pipelines time_to_accuracy
    .venv/bin/python bench/run_all.py --render-only           # rebuild BENCHMARKS.md only

The benchmarks, their order and the arguments run here are bench/registry.py's; the same list
orders BENCHMARKS.md. Each script runs as its own process (none shares a warm interpreter or a
loaded library with the next), its output streamed here, and writes bench/results/NAME.json
with the machine it ran on (tracked in git beside BENCHMARKS.md, so that a later --render-only
or --only run anywhere keeps every other section). One that is missing, needs a GPU this
machine lacks, fails or times out does not stop the rest: its status goes into
bench/results/run_all.json, and BENCHMARKS.md says so. Run it on a quiet machine: the
benchmarks time wall-clock work on every core. The whole run took 70.6 min on the quiet 2-core
dev box (`time make bench`, 2026-12-06, data cached): bench_kernel.py 18.0 min (its busy-thread
probes run the slow contenders, SPDL and the Python decode path, at a few percent of their
speed), bench_levers.py 16.8, bench_doctor.py 6.7, none of the rest over 4; plus a few minutes
the first time, when bench_pipelines.py and bench_order.py (2 GiB) generate their cached data.
Each script's own seconds go into run_all.json.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
sys.path.insert(0, str(ROOT))

import common  # noqa: E402  (bench/common.py, beside this file)
import report  # noqa: E402
from registry import BY_NAME, Benchmark  # noqa: E402

ERROR_TAIL_LINES = 3  # of a failed script's output, kept for the report


def cuda_device() -> str | None:
    """The GPU's name, or None; asked in a child so this process never initialises CUDA."""
    code = ("import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() "
            "else '')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or None


def run_one(benchmark: Benchmark, gpu: str | None, timeout: float) -> dict:
    """Runs one script, streaming its output; returns its status entry."""
    status = {"script": f"bench/{benchmark.script}", "command": benchmark.command}
    if not (ROOT / benchmark.script).is_file():
        return {**status, "status": "absent"}
    if benchmark.needs_cuda and gpu is None:
        return {**status, "status": "skipped", "error": "needs a CUDA GPU; this machine has none"}
    print(f"\n== {benchmark.command}", flush=True)
    status["started"] = datetime.datetime.now().isoformat(timespec="seconds")
    started = time.perf_counter()
    tail: collections.deque[str] = collections.deque(maxlen=ERROR_TAIL_LINES)
    process = subprocess.Popen([sys.executable, str(ROOT / benchmark.script), *benchmark.args],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, bufsize=1)
    timed_out = threading.Event()

    def kill() -> None:  # a watchdog, so a script that hangs silently is stopped too
        timed_out.set()
        process.kill()
    watchdog = threading.Timer(timeout, kill)
    watchdog.start()
    try:
        for line in process.stdout:
            print(line, end="", flush=True)
            if line.strip():
                tail.append(line.strip())
        returncode = process.wait()
    finally:
        watchdog.cancel()
    status["seconds"] = time.perf_counter() - started
    if timed_out.is_set():
        return {**status, "status": "failed", "error": f"timed out after {timeout:.0f} s"}
    if returncode != 0:
        return {**status, "status": "failed", "returncode": returncode,
                "error": f"exit {returncode}: " + " / ".join(tail)}
    return {**status, "status": "ok"}


def record(results: Path, gpu: str | None, statuses: dict[str, dict]) -> None:
    """Merges this run's statuses into run_all.json (an --only run keeps the others')."""
    path = results / report.RUN_ALL_NAME
    try:
        previous = json.loads(path.read_text()).get("benchmarks", {})
    except (OSError, json.JSONDecodeError):
        previous = {}
    results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": {**common.machine(), "gpu": gpu},
                                "benchmarks": {**previous, **statuses}}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--only", nargs="+", choices=list(BY_NAME), metavar="NAME",
                        help=f"run these only: {', '.join(BY_NAME)}")
    parser.add_argument("--render-only", action="store_true",
                        help="run nothing; rebuild BENCHMARKS.md from bench/results/*.json "
                             "and bench/NOTES.md")
    # 1 h: ~10x the longest script on a quiet dev box (time_to_accuracy, ~5 min), so only a hung
    # script meets it, even on a busy machine.
    parser.add_argument("--timeout", type=float, default=3600,
                        help="seconds per script before it is killed (default 3600)")
    parser.add_argument("--results", type=Path, default=report.RESULTS_DIR,
                        help="where the JSON is read from (the scripts always write "
                             "bench/results/; default: that)")
    parser.add_argument("--output", type=Path, default=report.OUTPUT,
                        help="the document (default: BENCHMARKS.md at the repo root)")
    parser.add_argument("--notes", type=Path, default=report.NOTES,
                        help="the hand-kept notes the document includes (default: "
                             "bench/NOTES.md)")
    args = parser.parse_args(argv)

    statuses: dict[str, dict] = {}
    if not args.render_only:
        gpu = cuda_device()
        names = args.only or list(BY_NAME)
        for name in names:
            statuses[name] = run_one(BY_NAME[name], gpu, args.timeout)
            statuses[name]["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
            print(f"== {name}: {statuses[name]['status']}"
                  + (f" ({statuses[name]['error']})" if statuses[name].get("error") else ""),
                  flush=True)
        record(args.results, gpu, statuses)
    output = report.render(args.results, args.output, args.notes)
    print(f"\nwrote {output}")
    failed = [n for n, s in statuses.items() if s["status"] == "failed"]
    if failed:
        print(f"failed: {', '.join(failed)} (see {output.name})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
