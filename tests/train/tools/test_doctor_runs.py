"""`turbotrain doctor -- COMMAND` on real scripts: bench/doctor_script.py (a plain loop whose
mistakes are flags), a Lightning Trainer.fit, torchrun with 2 CPU ranks, a script without a
DataLoader; the child's exit code, stdout and stderr passed through; Ctrl-C; bad input.
Each script is tiny (a few dozen steps of a small net, one torch thread a process)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from turbotrain.cli import main
from turbotrain.train.tools.doctor_findings import KEEP_FREED_MEMORY
from turbotrain.train.tools.doctor_run import read_measurements

pytestmark = pytest.mark.usefixtures("child_processes")

REPO = Path(__file__).resolve().parents[3]
SCRIPT = str(REPO / "bench" / "doctor_script.py")
SCRIPTS = Path(__file__).parent / "doctor_scripts"
PYTHON = sys.executable
TIMEOUT = 240


def doctor(out: Path, *command: str, flags=("--steps", "6", "--warmup", "2"), env=None,
           cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([PYTHON, "-m", "turbotrain", "doctor", "--out", str(out), *flags,
                           "--", *command], capture_output=True, text=True, env=env,
                          timeout=TIMEOUT, cwd=cwd)


def report_of(out: Path) -> dict:
    return json.loads((out / "doctor.json").read_text())


def ids(process: dict) -> list[str]:
    return [f["id"] for f in process["findings"]]


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory) -> Path:
    """An ImageFolder of 2 x 24 JPEGs of 320x320: a batch of 8 takes ~20 ms to decode."""
    root = tmp_path_factory.mktemp("jpegs")
    rng = np.random.default_rng(0)
    for c in range(2):
        (root / f"c{c}").mkdir()
        for i in range(24):
            pixels = rng.integers(0, 255, (320, 320, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"c{c}" / f"{i}.jpg", quality=90)
    return root


def pil_loop(jpegs: Path, *flags: str) -> list[str]:
    return [PYTHON, SCRIPT, "--data", f"pil:{jpegs}", "--image-size", "32", "--model", "mlp",
            "--batch-size", "8", "--steps", "14", "--warmup", "2", "--threads", "1", *flags]


def test_plain_loop_with_num_workers_zero_and_pil_decode(tmp_path, jpegs):
    done = doctor(tmp_path, *pil_loop(jpegs, "--workers", "0"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("RESULT ")  # the script's own stdout, untouched
    process = report_of(tmp_path)["processes"][0]
    assert process["verdict"] == "input-bound"
    assert process["decode_share"] > 0.5  # PIL's decode, timed in the fetch
    assert ids(process)[0] == "num_workers"
    line = next(n for n, text in enumerate(Path(SCRIPT).read_text().splitlines(), start=1)
                if "loader = DataLoader(" in text)
    assert process["findings"][0]["site"] == f"{SCRIPT}:{line}"  # the line that made it
    assert "verdict: input-bound" in done.stderr and "1. the DataLoader loads" in done.stderr
    assert (tmp_path / "timeline.png").stat().st_size > 0
    # what turbotrain would do with the same ImageFolder, measured on a sample of it
    data = process["turbotrain_data"]
    assert data["root"] == str(jpegs) and data["sample"] == 48 and data["yours"] > 0
    assert data["images_per_second"] > 0 and data["image_size"] == 32
    assert f"turbotrain prepare-dataset {jpegs} PREPARED" in done.stderr


def test_no_worker_finding_with_workers_that_fit_the_cores(tmp_path, jpegs):
    done = doctor(tmp_path, *pil_loop(jpegs, "--workers", "1"))
    assert done.returncode == 0, done.stderr
    process = report_of(tmp_path)["processes"][0]
    assert process["loaders"][0]["num_workers"] == 1
    assert not {"num_workers", "oversubscribed"} & set(ids(process))


def test_already_bf16_and_channels_last_are_not_advised(tmp_path):
    done = doctor(tmp_path, PYTHON, SCRIPT, "--threads", "1", "--bf16", "--channels-last",
                  "--steps", "12")
    assert done.returncode == 0, done.stderr
    process = report_of(tmp_path)["processes"][0]
    assert process["model"]["autocast"] and process["model"]["channels_last"]
    assert not {"bf16", "channels_last"} & set(ids(process))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_page_faults_each_step_are_found_and_not_where_freed_memory_is_kept(tmp_path):
    # an MLP whose activations, gradients and bf16 weight casts are blocks of 128 KiB-3 MiB:
    # with glibc's mmap threshold held at 64 KiB each is mapped and unmapped every step
    mlp = [PYTHON, SCRIPT, "--no-loader", "--model", "mlp", "--width", "64", "--batch-size",
           "128", "--samples", "1024", "--threads", "1", "--steps", "16", "--warmup", "4"]
    flags = ("--steps", "10", "--warmup", "4")
    faulting = doctor(tmp_path / "faults", *mlp, flags=flags,
                      env={"MALLOC_MMAP_THRESHOLD_": "65536"})
    assert faulting.returncode == 0, faulting.stderr
    process = report_of(tmp_path / "faults")["processes"][0]
    assert process["page_faults_per_step"] > 500
    found = next(f for f in process["findings"] if f["id"] == "page_faults")
    assert found["settings"] == {"env": KEEP_FREED_MEMORY}
    assert "MALLOC_MMAP_THRESHOLD_=33554432" in found["change"]
    kept = doctor(tmp_path / "kept", *mlp, flags=flags, env=KEEP_FREED_MEMORY)
    assert kept.returncode == 0, kept.stderr
    process = report_of(tmp_path / "kept")["processes"][0]
    assert process["page_faults_per_step"] < 50 and "page_faults" not in ids(process)


def test_exit_code_stdout_and_stderr_pass_through(tmp_path):
    done = doctor(tmp_path, PYTHON, SCRIPT, "--threads", "1", "--steps", "10",
                  "--exit-code", "3")
    assert done.returncode == 3
    assert done.stdout.startswith("RESULT ")
    assert "exit code 3" in done.stderr


def test_a_failing_script_returns_its_code_and_what_was_measured(tmp_path):
    done = doctor(tmp_path, PYTHON, SCRIPT, "--threads", "1", "--steps", "100",
                  "--fail-at", "7")
    assert done.returncode == 1
    assert "RuntimeError: planted failure at step 7" in done.stderr  # its traceback, as is
    assert "the script ended early (exit code 1)" in done.stderr
    process = report_of(tmp_path)["processes"][0]
    assert process["timed_steps"] >= 3 and process["verdict"] != "unknown"


def test_stop_ends_the_script_once_measured(tmp_path):
    done = doctor(tmp_path, PYTHON, SCRIPT, "--threads", "1", "--steps", "100000",
                  flags=("--steps", "4", "--warmup", "1", "--stop"))
    assert done.returncode == 0, done.stderr
    assert "RESULT" not in done.stdout  # it never reached its end
    process = report_of(tmp_path)["processes"][0]
    assert process["ended"] == "stopped" and process["timed_steps"] == 4


def test_the_hook_leaves_the_environment_as_it_was(tmp_path):
    users = tmp_path / "users_path"
    users.mkdir()
    (users / "sitecustomize.py").write_text("print('USER SITECUSTOMIZE RAN')\n")
    done = doctor(tmp_path / "out", PYTHON, str(SCRIPTS / "show_env.py"),
                  env={"PYTHONPATH": f"{REPO}{os.pathsep}{users}"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("USER SITECUSTOMIZE RAN\n")  # theirs chained after ours
    assert "to stderr" in done.stderr
    seen = json.loads(done.stdout.split("ENV ", 1)[1])
    hook, *theirs = seen["PYTHONPATH"].split(os.pathsep)
    assert seen["hooked"] and theirs == [str(REPO), str(users)]
    assert not Path(hook).exists()  # the hook's folder went with the doctor
    assert "turbotrain-doctor" in hook and str(REPO) not in hook


def test_a_script_without_a_dataloader_says_what_it_could_not_see(tmp_path):
    done = doctor(tmp_path, PYTHON, SCRIPT, "--threads", "1", "--no-loader", "--steps", "12")
    assert done.returncode == 0, done.stderr
    process = report_of(tmp_path)["processes"][0]
    assert process["timed_steps"] > 0 and process["loaders"] == []
    assert any("no torch DataLoader was iterated" in n for n in process["notes"])
    assert "note: no torch DataLoader" in done.stderr


def test_lightning_trainer_fit(tmp_path):
    done = doctor(tmp_path, PYTHON, str(SCRIPTS / "lightning_fit.py"))
    assert done.returncode == 0, done.stderr
    assert "fit done" in done.stdout
    process = report_of(tmp_path)["processes"][0]
    assert process["timed_steps"] == 6
    assert process["model"]["type"] == "Sequential"  # Tiny.net, called in training_step
    assert process["loaders"][0]["batch_size"] == 16
    # Lightning runs forward and backward inside optimizer.step's closure: booked apart, so
    # they are seen at all and the optimizer's share does not count them a second time (the
    # booked shares then add up to more than the step). Not a comparison of two timings: on a
    # loaded box the tiny model's optimizer step can outlast its forward+backward.
    shares = process["shares"]
    assert shares["fwd_bwd"] > 0
    assert shares["wait"] + shares["copy"] + shares["fwd_bwd"] + shares["optim"] <= 1.001


def test_torchrun_with_two_cpu_ranks(tmp_path):
    torchrun = str(Path(PYTHON).parent / "torchrun")
    done = doctor(tmp_path, torchrun, "--standalone", "--nproc-per-node", "2", SCRIPT,
                  "--threads", "1", "--steps", "14", "--accum", "2",
                  env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    report = report_of(tmp_path)
    assert sorted(p["rank"] for p in report["processes"]) == [0, 1]
    assert all(p["model"]["ddp"] and p["timed_steps"] == 6 for p in report["processes"])
    assert report["summary"]["ranks"] == 2
    assert "rank 0:" in done.stderr and "rank 1:" in done.stderr and "all 2 ranks" in done.stderr


def test_ctrl_c_stops_both_and_reports(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    doctor_process = subprocess.Popen(
        [PYTHON, "-m", "turbotrain", "doctor", "--out", str(tmp_path), "--steps", "100000",
         "--warmup", "1", "--", PYTHON, SCRIPT, "--threads", "1", "--steps", "10000000"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            files = read_measurements(tmp_path / "measurements")
            if sum(r.get("kind") == "step" for f in files.values() for r in f) > 4:
                break
            time.sleep(0.2)
        doctor_process.send_signal(signal.SIGINT)
        stdout, stderr = doctor_process.communicate(timeout=60)
    finally:
        doctor_process.kill()
    assert doctor_process.returncode == 130
    assert "the script ended early (interrupted)" in stderr
    assert report_of(tmp_path)["processes"][0]["timed_steps"] > 0


@pytest.mark.parametrize("command, says", [
    ([], "no command: put the training command after --"),
    ([PYTHON, "missing_train.py"], "missing_train.py: no such script"),
    (["no-such-program-here", "x"], "no-such-program-here: no such program or file"),
])
def test_bad_input_is_one_line(command, says, capsys, tmp_path):
    assert main(["doctor", "--out", str(tmp_path), "--", *command]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and err.startswith("turbotrain doctor: error:")


def test_a_script_that_is_not_python_is_one_line(capsys, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("these are my notes: not python {\n")
    assert main(["doctor", "--out", str(tmp_path), "--", PYTHON, str(notes)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "notes.txt is not a Python script (line 1" in err


# --------------------------------------------------------------------------- on a GPU

@pytest.mark.cuda
def test_gpu_findings_on_a_cuda_run(tmp_path):
    """.item() in the step and pageable copies on CUDA; the model left on the CPU."""
    done = doctor(tmp_path / "syncs", PYTHON, SCRIPT, "--device", "cuda", "--item",
                  "--batch-size", "256", "--steps", "40", flags=("--steps", "20"))
    assert done.returncode == 0, done.stderr
    process = report_of(tmp_path / "syncs")["processes"][0]
    assert process["gpu_busy_share"] is not None  # the CUDA events were read
    assert {"syncs", "pin_memory"} <= set(ids(process))
    done = doctor(tmp_path / "cpu", PYTHON, SCRIPT, "--device", "cpu", "--steps", "30")
    assert "cpu_model" in ids(report_of(tmp_path / "cpu")["processes"][0])
    done = doctor(tmp_path / "clean", PYTHON, SCRIPT, "--device", "cuda", "--pin-memory",
                  "--batch-size", "256", "--steps", "40", flags=("--steps", "20"))
    assert not {"syncs", "pin_memory", "cpu_model"} & set(
        ids(report_of(tmp_path / "clean")["processes"][0]))
    assert torch.cuda.is_available()
