"""BENCHMARKS.md from bench/results/*.json and the hand-kept bench/NOTES.md (rendered, never
measured).

    .venv/bin/python bench/report.py [--results bench/results] [--output BENCHMARKS.md]

`bench/run_all.py` calls `render` after running the suite (and alone with --render-only). The
document is a function of tracked files only, so rendering it again anywhere changes nothing
but what changed in them:

* bench/results/NAME.json: each benchmark's numbers, its command, when and on which machine it
  measured them (bench/common.py write_results);
* bench/results/run_all.json: what the last `make bench` could not run (absent, skipped, failed);
* bench/NOTES.md: what people wrote about the results, beyond what the JSON holds. It is never
  written here, so a render cannot erase it; each `## NAME` goes into that section.

It opens with the Machines table (every machine that measured a section, once, as a letter the
sections cite), the Goals table (every goal next to its measured ratio) and the Contenders
table (bench/registry.py CONTENDERS); then one section per benchmark of bench/registry.py, in
its order: its command, when and on which machine, its tables (bench/sections.py), its notes.
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from registry import BENCHMARKS, BY_NAME, CONTENDERS, Benchmark  # noqa: E402
from sections import RENDERERS, Body, Goal, Where, md_table, met_text  # noqa: E402

RESULTS_DIR = ROOT / "results"
OUTPUT = REPO / "BENCHMARKS.md"
NOTES = ROOT / "NOTES.md"
RUN_ALL_NAME = "run_all.json"  # per-script status of the last suite run, written by run_all.py
NOT_RECORDED = "not recorded"


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def measured_at(data: dict, path: Path) -> datetime.datetime:
    """When a result was measured: what it records; for a file from before results recorded
    it, the file's time."""
    if data.get("measured"):
        return datetime.datetime.fromisoformat(data["measured"])
    return datetime.datetime.fromtimestamp(path.stat().st_mtime)


def status_note(status: dict | None, measured: datetime.datetime | None) -> str | None:
    """What the section says about a script run_all could not run to the end, if anything."""
    if not status or status.get("status") == "ok":
        return None
    kind = status.get("status")
    if kind == "absent":
        return f"Not run: {status.get('script')} does not exist yet."
    if kind == "skipped":
        return f"Not run: {status.get('error')}."
    note = f"The last run **failed** ({status.get('error', 'no detail')})"
    if measured is None:
        return note + "."
    started = status.get("started")
    if started and measured >= datetime.datetime.fromisoformat(started):
        return note + "; it still wrote the results below."  # e.g. gpu_check: a failed check
    return note + "; the results below are from an earlier run."


# -- the hand-kept notes --------------------------------------------------------------------------
@dataclass(frozen=True)
class Note:
    about: str | None  # "YYYY-MM-DD HH:MM": the results it was written about, if it says
    text: str


NOTE_HEADING = re.compile(r"## (?P<name>\w+)(?: \(about the results of "
                          r"(?P<about>\d{4}-\d\d-\d\d \d\d:\d\d)\))?\s*$")


def read_notes(path: Path = NOTES) -> dict[str, Note]:
    """bench/NOTES.md as {benchmark name: its note}. Text before the first `## NAME` is the
    file's own preamble; a heading that names no benchmark is an error listing the names."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    notes: dict[str, Note] = {}
    name, about, lines = None, None, []

    def close() -> None:
        if name is not None:
            notes[name] = Note(about, "\n".join(lines).strip())
    for line in text.splitlines():
        if line.startswith("## "):
            close()
            heading = NOTE_HEADING.match(line)
            if heading is None or heading["name"] not in BY_NAME:
                raise ValueError(f"{path}: {line!r} names no benchmark; write '## NAME' or "
                                 "'## NAME (about the results of YYYY-MM-DD HH:MM)', NAME one "
                                 f"of: {', '.join(BY_NAME)}")
            name, about, lines = heading["name"], heading["about"], []
        elif name is not None:
            lines.append(line)
    close()
    return notes


def note_lines(note: Note | None, measured: datetime.datetime | None) -> list[str]:
    if note is None or not note.text:
        return []
    shown = None if measured is None else f"{measured:%Y-%m-%d %H:%M}"
    if note.about is None:
        lead = "*Notes (bench/NOTES.md):*"
    elif note.about == shown:
        lead = "*Notes on these results (bench/NOTES.md):*"
    else:
        lead = f"*Notes on the results of {note.about}, not the ones above (bench/NOTES.md):*"
    return [lead, "", note.text, ""]


# -- machines -------------------------------------------------------------------------------------
MACHINE_FIELDS = (("cpu", "CPU"), ("cores", "cores"), ("simd", "SIMD"), ("gpu", "GPU"),
                  ("torch", "torch"), ("python", "Python"), ("platform", "platform"))


class Machines:
    """Every machine that measured a section, once, as a letter in order of first use. Two
    records are one machine when they agree on every field but the load."""

    def __init__(self) -> None:
        self.letters: dict[tuple, str] = {}
        self.records: dict[str, dict] = {}
        self.sections: dict[str, list[str]] = {}

    def cite(self, machine: dict | None, section: str) -> str:
        """The sentence a section says about its machine."""
        if not machine:
            return "the machine was not recorded"
        key = tuple((k, machine.get(k)) for k, _ in MACHINE_FIELDS) + (("note",
                                                                       machine.get("note")),)
        letter = self.letters.setdefault(key, chr(ord("A") + len(self.letters)))
        self.records[letter] = machine
        self.sections.setdefault(letter, []).append(section)
        load = machine.get("load_average")
        return (f"on machine {letter} ({short_machine(machine)}"
                + (f"; load average {load}" if load else "") + ")")

    def table(self) -> list[str]:
        if not self.records:
            return ["No section recorded its machine.", ""]
        rows = [[letter, *[_field(record, key) for key, _ in MACHINE_FIELDS],
                 ", ".join(self.sections[letter])] for letter, record in self.records.items()]
        lines = md_table(["machine", *[title for _, title in MACHINE_FIELDS], "measured"], rows)
        notes = [f"- {letter}: {record['note']}" for letter, record in self.records.items()
                 if record.get("note")]
        return lines + (notes + [""] if notes else [])


def _field(machine: dict, key: str):
    if key not in machine:
        return NOT_RECORDED
    return machine[key] if machine[key] is not None else "none"


def short_machine(machine: dict) -> str:
    """`AMD EPYC, 2 cores, AVX-512 + bf16, no GPU`: what a section says; what was not
    recorded is left out (the Machines table says so)."""
    parts = [machine.get("cpu"), f"{machine['cores']} cores" if machine.get("cores") else None,
             machine.get("simd")]
    if "gpu" in machine:
        parts.append(machine["gpu"] or "no GPU")
    shown = ", ".join(str(p) for p in parts if p)
    return shown or NOT_RECORDED


# -- the document ---------------------------------------------------------------------------------
def render_section(bench: Benchmark, results: Path, where: Where, status: dict | None,
                   notes: dict[str, Note], machines: Machines) -> tuple[list[str], list[Goal]]:
    path = results / f"{bench.name}.json"
    data = _load(path)
    measured = None if data is None else measured_at(data, path)
    lines = [f"## {bench.title}", ""]
    note = status_note(status, measured)
    if note:
        lines += [note, ""]
    # The command that made the results shown: the JSON's own (a script run alone with its
    # own flags after `make bench`), else the one run_all ran, else the registry's.
    command = (data or {}).get("command") or (status or {}).get("command") or bench.command
    lines += ["```", command, "```", ""]
    if data is None:
        missing = f"{bench.results_file} is missing"
        lines += [f"**No GPU table was measured** ({missing}): it needs a CUDA GPU." if
                  bench.needs_cuda else f"No results ({missing}).", ""]
        goals = [Goal(bench.name, bench.title, "-", "-", None)]
    else:
        lines += [f"Results of {measured:%Y-%m-%d %H:%M}, "
                  f"{machines.cite(data.get('machine'), bench.name)}.", ""]
        if data.get("recovered"):  # a result file rebuilt from the document it was shown in
            lines += [f"Recovered {data['recovered']}.", ""]
        body: Body = RENDERERS[bench.name](data, where)
        for goal in body.goals:
            goal.benchmark = bench.name
        lines += body.lines
        goals = body.goals
    return lines + note_lines(notes.get(bench.name), measured), goals


def render(results: Path = RESULTS_DIR, output: Path = OUTPUT, notes: Path = NOTES) -> Path:
    """Writes `output` from the JSON in `results` and the notes file (plots go next to the
    JSON); returns it."""
    results, output = Path(results), Path(output)
    where = Where(results, output)
    statuses = (_load(results / RUN_ALL_NAME) or {}).get("benchmarks", {})
    hand_kept = read_notes(notes)
    machines = Machines()
    sections, goals = [], []
    for bench in BENCHMARKS:
        status = statuses.get(bench.name)
        if (status is None and not (results / f"{bench.name}.json").is_file()
                and not (ROOT / bench.script).is_file()):
            continue  # neither the script nor its results exist yet: nothing to say
        lines, section_goals = render_section(bench, results, where, status, hand_kept,
                                              machines)
        sections.append(lines)
        goals += section_goals

    doc = ["# Benchmarks", "",
           "Rendered by `python bench/run_all.py` (`make bench`) from `bench/results/*.json` "
           "and the hand-written `bench/NOTES.md`; `python bench/run_all.py --render-only` "
           "rebuilds this file from them. Both are committed with it. Each section says when "
           "and on which machine it was measured: the sections were not all measured on one "
           "machine, so compare the ratios within a section, each measured side by side in "
           "one run, rather than rates across sections.", ""]
    doc += ["## Machines", ""] + machines.table()
    doc += ["## Goals", ""]
    doc += md_table(["benchmark", "comparison", "goal", "measured", ""],
                    [[g.benchmark, g.what, g.goal, g.measured, met_text(g.met)] for g in goals])
    doc += ["## Contenders", "",
            "One name each, in every table: a name of ours is the turbotrain pipeline of that "
            "name (as `--pipeline` takes it) or a variant of it; `plain_LIBRARY` is that "
            "library used directly, without turbotrain.", ""]
    doc += md_table(["name", "whose", "what"],
                    [[f"`{name}`", c.whose, c.what] for name, c in CONTENDERS.items()])
    for lines in sections:
        doc += lines
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("\n".join(doc).rstrip() + "\n")
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--results", type=Path, default=RESULTS_DIR)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--notes", type=Path, default=NOTES)
    args = parser.parse_args(argv)
    print(f"wrote {render(args.results, args.output, args.notes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
