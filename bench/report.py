"""BENCHMARKS.md from bench/results/*.json and the hand-kept bench/NOTES.md (`bench/run_all.py`,
alone with `--render-only`). Each benchmark's script renders its own table (bench/registry.py);
this file orders and joins them after the Machines, Goals and Contenders tables. A benchmark
without a result file says "not measured": a figure comes only from the file its script wrote.
"""
from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from common import md_table, times, verdict  # noqa: E402
from registry import BENCHMARKS, BY_NAME, CONTENDERS, Benchmark  # noqa: E402

RESULTS_DIR = ROOT / "results"
OUTPUT = REPO / "BENCHMARKS.md"
NOTES = ROOT / "NOTES.md"
RUN_ALL_NAME = "run_all.json"  # per-script status of the last suite run, written by run_all.py
# What makes two result files one machine (the load and the commit vary from run to run).
MACHINE_COLUMNS = {"cpu": "CPU", "cores": "cores", "simd": "SIMD", "flags": "flags",
                   "ram_gib": "RAM (GiB)", "gpu": "GPU", "torch": "torch", "python": "Python",
                   "platform": "platform"}  # key in the JSON: title
NOTE_HEADING = re.compile(r"## (?P<name>\w+)(?: \(about the results of "
                          r"(?P<about>\d{4}-\d\d-\d\d \d\d:\d\d)\))?\s*$")


def load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def read_notes(path: Path = NOTES) -> dict[str, tuple[str | None, str]]:
    """bench/NOTES.md as {benchmark: (the results time its heading names or None, text)}; text
    before the first `## NAME` is not rendered; a heading naming no benchmark is an error."""
    notes: dict[str, tuple[str | None, list[str]]] = {}
    for line in (path.read_text() if path.is_file() else "").splitlines():
        if line.startswith("## "):
            heading = NOTE_HEADING.match(line)
            if heading is None or heading["name"] not in BY_NAME:
                raise ValueError(f"{path}: {line!r} names no benchmark; write '## NAME' or "
                                 "'## NAME (about the results of YYYY-MM-DD HH:MM)', NAME one "
                                 f"of: {', '.join(BY_NAME)}")
            notes[heading["name"]] = (heading["about"], [])
        elif notes:
            notes[next(reversed(notes))][1].append(line)
    return {name: (about, "\n".join(text).strip()) for name, (about, text) in notes.items()}


def note_lines(note: tuple[str | None, str] | None, measured: str | None) -> list[str]:
    about, text = note or (None, "")
    lead = ("*Notes (bench/NOTES.md):*" if about is None else
            "*Notes on these results (bench/NOTES.md):*" if about == measured else
            f"*Notes on the results of {about}, "
            f"{'not the ones above' if measured else 'no longer shown'} (bench/NOTES.md):*")
    return [lead, "", text, ""] if text else []


def status_lines(status: dict | None, data: dict | None) -> list[str]:
    """What a section says about a script the last run_all could not run to its end."""
    kind = (status or {}).get("status")
    if kind in (None, "ok"):
        return []
    if kind in ("absent", "skipped"):
        return [f"Not run by the last `make bench`: {status.get('error') or 'no such script'}.", ""]
    wrote = data is not None and data.get("measured", "") >= status.get("started", "~")
    return [f"The last run **failed** ({status.get('error', 'no detail')})"
            + ("; it still wrote the results below." if wrote else "."), ""]


def goal_row(name: str, g: dict) -> list:
    """A goal's row: a ratio_goal, a time limit (goal_seconds), a worded_goal or gpu_check's."""
    if "goal_seconds" in g:
        return [name, g["what"], f"< {g['goal_seconds']:g} s", f"{g['seconds']:.2f} s",
                verdict(g["met"])]
    if "ratio" in g:
        return [name, g["what"], f">= {g['goal']:g}x", times(g["ratio"]), verdict(g["met"])]
    if "goal_text" in g:
        return [name, g["what"], g["goal_text"], g["measured"], verdict(g["met"])]
    return [name, g["goal"], "-", g.get("measured"), g.get("verdict")]


def machine_key(machine: dict) -> tuple:
    return tuple("not recorded" if k not in machine else "none" if machine[k] in (None, []) else
                 ", ".join(machine[k]) if isinstance(machine[k], list) else str(machine[k])
                 for k in MACHINE_COLUMNS)


def section(bench: Benchmark, data: dict | None, status: dict | None, note, letter) -> list[str]:
    """A benchmark's section; `letter(machine)` names the machine that measured it."""
    lines = [f"## {bench.title}", "", "```", (data or {}).get("command") or bench.command, "```",
             "", *status_lines(status, data)]
    if data is None:
        why = "it needs a CUDA GPU; " if bench.needs_cuda else ""
        return lines + [f"**Not measured** ({why}no {RESULTS_DIR.relative_to(REPO)}/{bench.name}"
                        f".json written by bench/{bench.script}).", "", *note_lines(note, None)]
    machine = data.get("machine") or {}
    measured = data.get("measured", "")[:16].replace("T", " ")
    table = importlib.import_module(Path(bench.script).stem).markdown(data)
    return lines + [f"Measured {measured} on machine {letter(machine)}, commit "
                    f"{machine.get('commit', 'not recorded')}; load average (1, 5, 15 min) "
                    f"{machine.get('load_before', 'not recorded')} at the start, "
                    f"{machine.get('load_after', machine.get('load_average', 'not recorded'))} "
                    "at the end.", "", table.rstrip(), "", *note_lines(note, measured)]


def render(results: Path = RESULTS_DIR, output: Path = OUTPUT, notes: Path = NOTES) -> Path:
    """Writes `output` from the JSON in `results` and the notes file; returns it."""
    statuses = (load(results / RUN_ALL_NAME) or {}).get("benchmarks", {})
    hand_kept = read_notes(notes)
    machines: dict[tuple, list] = {}  # key: [letter, *key, the sections it measured]
    sections, goals = [], []
    for bench in BENCHMARKS:
        def letter(machine: dict) -> str:
            key = machine_key(machine)
            row = machines.setdefault(key, [chr(ord("A") + len(machines)), *key, []])
            row[-1].append(bench.name)
            return row[0]
        data = load(results / f"{bench.name}.json")
        sections += section(bench, data, statuses.get(bench.name), hand_kept.get(bench.name),
                            letter)
        goals += ([goal_row(bench.name, g) for g in data.get("goals", [])] if data else
                  [[bench.name, "-", "-", "-", "not measured"]])
    doc = ["# Benchmarks", "",
           "Rendered by `python bench/run_all.py` (`make bench`) from `bench/results/*.json`, "
           "each written by its benchmark's script with the machine it ran on, and the "
           "hand-written `bench/NOTES.md`; `python bench/run_all.py --render-only` rebuilds "
           "this file from them. A section without its script's result file says *not "
           "measured*.", "", "## Machines", "",
           *md_table(["machine", *MACHINE_COLUMNS.values(), "sections"],
                     [[*row[:-1], ", ".join(row[-1])] for row in machines.values()]),
           "## Goals", "", *md_table(["benchmark", "comparison", "goal", "measured", ""], goals),
           "## Contenders", "",
           "One name each, in every table: a name of ours is the turbotrain pipeline of that "
           "name (as `--pipeline` takes it) or a variant of it; `plain_LIBRARY` is that "
           "library used directly, without turbotrain.", "",
           *md_table(["name", "whose", "what"],
                     [[f"`{name}`", c.whose, c.what] for name, c in CONTENDERS.items()]),
           *sections]
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("\n".join(doc).rstrip() + "\n")
    return output
