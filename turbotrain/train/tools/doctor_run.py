"""Runs the user's command with the doctor's hook loaded at interpreter start, untouched
otherwise: a temporary folder holding sitecustomize.py and the hook's package is put first on
PYTHONPATH (the user's own entries kept after it, their own sitecustomize chained), for this
child and every Python process it starts (torchrun's ranks, spawned loader workers). The
folder is deleted when the doctor ends. The child's stdout and stderr are its own (inherited,
never piped); its exit code is the doctor's. Ctrl-C: the child runs in its own process group
and gets exactly one SIGINT from here (a second Ctrl-C sends SIGTERM, a third SIGKILL).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from turbotrain.files.safe_create import write_file

HOOK_PACKAGE = "turbotrain_doctor"  # its name in the temporary folder (no clash with ours)
HOOK_MODULES = ("doctor_hook.py", "doctor_patches.py", "doctor_probe.py")
MEASUREMENTS = "measurements"  # DIR/measurements/<pid>.jsonl

SITECUSTOMIZE = '''"""turbotrain doctor's hook; this folder is deleted when the doctor ends."""
import os as _os
import sys as _sys

try:
    from turbotrain_doctor import doctor_patches as _doctor
    _doctor.install()
except Exception as _error:  # the script runs unmeasured rather than not at all
    _sys.stderr.write(f"turbotrain doctor: the hook did not load: {_error!r}\\n")


def _chain_users_sitecustomize():
    import importlib.machinery
    import importlib.util
    here = _os.path.dirname(_os.path.abspath(__file__))
    rest = [p for p in _sys.path if _os.path.abspath(p or _os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        _sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_chain_users_sitecustomize()
'''


class CommandError(ValueError):
    """A command the doctor cannot run; its message is the one line to print."""


@dataclass(frozen=True)
class ChildEnd:
    returncode: int  # a shell's convention: 128 + N for a child ended by signal N
    interrupted: bool  # Ctrl-C (or SIGTERM) reached the doctor


def check_command(command: list[str]) -> None:
    """Bad input in one line: no command, a missing or non-Python script, an unknown program."""
    if not command:
        raise CommandError("no command: put the training command after --, e.g. "
                           "`turbotrain doctor -- python train.py`")
    program = command[0]
    if shutil.which(program) is None and not Path(program).is_file():
        raise CommandError(f"{program}: no such program or file")
    script = _script_of(command)
    if script is not None:
        _check_python(script)


def _script_of(command: list[str]) -> str | None:
    """The Python file the command runs: python's first argument that is not an option (none
    after -m/-c), a launcher's first *.py argument, or the program itself when it is a .py."""
    program, rest = command[0], command[1:]
    if Path(program).name.startswith("python"):
        for arg in rest:
            if arg in ("-m", "-c"):
                return None
            if not arg.startswith("-"):
                return arg
        return None
    if program.endswith(".py"):
        return program
    return next((arg for arg in rest if arg.endswith(".py")), None)


def _check_python(script: str) -> None:
    path = Path(script)
    if not path.is_file():
        raise CommandError(f"{script}: no such script")
    try:
        compile(path.read_bytes(), script, "exec")
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes (a binary file)
        where = f" (line {e.lineno}: {e.msg})" if isinstance(e, SyntaxError) else ""
        raise CommandError(f"{script} is not a Python script{where}: give the training "
                           "script, e.g. `turbotrain doctor -- python train.py`") from None


def hook_folder() -> Path:
    """A new temporary folder with sitecustomize.py and the hook's package."""
    folder = Path(tempfile.mkdtemp(prefix="turbotrain-doctor-"))
    package = folder / HOOK_PACKAGE
    package.mkdir()
    write_file(package / "__init__.py", "", overwrite=False)
    here = Path(__file__).parent
    for name in HOOK_MODULES:
        write_file(package / name, (here / name).read_bytes(), overwrite=False)
    write_file(folder / "sitecustomize.py", SITECUSTOMIZE, overwrite=False)
    return folder


def child_environment(hook: Path, config: dict, base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    users = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(hook) + (os.pathsep + users if users else "")
    env["TURBOTRAIN_DOCTOR"] = json.dumps(config)
    return env


def run_child(command: list[str], env: dict) -> ChildEnd:
    child = subprocess.Popen(command, env=env, start_new_session=True)
    interrupts = []

    def forward(signum, frame):
        interrupts.append(signum)
        # the signal itself the first time (the script's own clean-up), then SIGTERM, SIGKILL
        sent = (signum, signal.SIGTERM, signal.SIGKILL)[min(len(interrupts), 3) - 1]
        try:
            os.killpg(child.pid, sent)
        except ProcessLookupError:
            pass
    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return ChildEnd(128 - code if code < 0 else code, bool(interrupts))


def run_measured(command: list[str], config: dict, measurements: Path) -> ChildEnd:
    """The command's run with the hook; what it measured lands in `measurements`."""
    if measurements.is_dir():
        for old in measurements.glob("*.jsonl"):
            old.unlink()
    measurements.mkdir(parents=True, exist_ok=True)
    hook = hook_folder()
    try:
        env = child_environment(hook, {**config, "dir": str(measurements)})
        return run_child(command, env)
    finally:
        shutil.rmtree(hook, ignore_errors=True)


def read_measurements(measurements: Path) -> dict[str, list[dict]]:
    """file name -> its records, a "steps" line's rows as "step" records followed by a "faults"
    record (the page faults of those steps); a line cut short by a kill is dropped."""
    out = {}
    for path in sorted(measurements.glob("*.jsonl")):
        records = []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("kind") == "steps":
                steps = [{"kind": "step", **dict(zip(record["fields"], row))}
                         for row in record["rows"]]
                records += steps
                if "faults" in record:
                    records.append({"kind": "faults", "faults": record["faults"],
                                    "steps": len(steps),
                                    "warmup": any(s.get("warmup") for s in steps)})
            else:
                records.append(record)
        out[path.stem] = records
    return out

