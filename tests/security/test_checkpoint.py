"""`train --out RUN --resume` on a checkpoint.pt or config.yaml nobody vouches for: it never runs
code, never hangs, never goes past a memory cap, never writes outside RUN, and fails with one
line naming the file (exit code 2) instead of a traceback."""
from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from turbotrain.train.errors import TrainError
from turbotrain.train.records import checkpoint as ckpt

from .confined import changed, outside, tree_state
from .train_child import FAST, run_train

WEIGHTS_ONLY = "(checkpoints are loaded with weights_only=True)"


class Payload:
    """What a hostile checkpoint holds: unpickling it calls `call(*args)`."""

    def __init__(self, call, *args):
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args


# Each case's child has its own timeout; this one also covers a fixture's run.
# One pytest worker runs this whole module (make test: --dist loadgroup), so its module-scoped
# fixture runs once, not once per worker: finished_run trains a run.
pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("checkpoint"),
              pytest.mark.usefixtures("child_processes")]

# ---------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def finished_run(tiny_dataset, tmp_path_factory):
    """A real 3-step run (stopped mid-epoch: 3 of 6 steps) with its checkpoint and config.yaml."""
    root = tmp_path_factory.mktemp("finished")
    ran = run_train("--data", tiny_dataset, "--out", root / "run", "--epochs", 1,
                    "--batch-size", 16, "--max-steps", 3, "--ema", *FAST, cwd=root, timeout=120)
    assert ran.returncode == 0, ran.stderr[-3000:]
    return root / "run"


class Case:
    """One test's copy of the finished run, in `work`."""

    def __init__(self, finished_run: Path, dataset: Path, tmp_path: Path):
        self.work = tmp_path / "work"
        self.run_dir = self.work / "run"
        self.dataset = dataset
        shutil.copytree(finished_run, self.run_dir)
        self.checkpoint = ckpt.checkpoint_path(self.run_dir)
        self.marker = self.work / "MARKER"

    def state(self) -> dict:
        return torch.load(self.checkpoint, weights_only=True)

    def resume(self, *args, timeout: float = 60):
        """Runs `train --out RUN --resume ARGS`; returns (Ran, paths changed outside RUN)."""
        before = tree_state(self.work) | tree_state(self.dataset)
        ran = run_train("--out", self.run_dir, "--resume", *args, "--device", "cpu",
                        cwd=self.work, timeout=timeout)
        after = tree_state(self.work) | tree_state(self.dataset)
        return ran, outside(changed(before, after), self.run_dir)


@pytest.fixture
def case(finished_run, tiny_dataset, tmp_path) -> Case:
    return Case(finished_run, tiny_dataset, tmp_path)


def _refused(case: Case, *args) -> str:
    """Resumes, expecting a one-line refusal that names RUN/checkpoint.pt and touches nothing."""
    ran, touched = case.resume(*args)
    line = ran.error_line("train: error: ")
    assert not touched, touched
    assert not case.marker.exists()
    return line


# ---------------------------------------------------------------------------- CLI

def test_a_checkpoint_that_runs_a_command_is_refused_and_the_command_never_runs(case):
    state = case.state()
    state["rng"]["numpy"] = Payload(os.system, f"touch {case.marker}")
    torch.save(state, case.checkpoint)
    line = _refused(case)
    assert line == (f"train: error: --resume: {case.checkpoint} asks to run code (os.system) "
                    f"when loaded; refusing it {WEIGHTS_ONLY}")


@pytest.mark.parametrize("damage", ["truncated", "garbage", "deflated"])
def test_a_damaged_checkpoint_is_one_line(case, damage):
    data = case.checkpoint.read_bytes()
    if damage == "truncated":
        case.checkpoint.write_bytes(data[:len(data) // 2])
    elif damage == "garbage":
        case.checkpoint.write_bytes(os.urandom(4096))
    else:  # the same entries, deflated: how a zip bomb stays small (torch would inflate it)
        with zipfile.ZipFile(case.checkpoint) as z:
            entries = [(info.filename, z.read(info)) for info in z.infolist()]
        with zipfile.ZipFile(case.checkpoint, "w", zipfile.ZIP_DEFLATED) as z:
            for name, content in entries:
                z.writestr(name, content)
    line = _refused(case)
    assert line.startswith(f"train: error: --resume: {case.checkpoint} is damaged or not a "
                           "turbotrain checkpoint ("), line


def test_a_foreign_torch_checkpoint_is_one_line(case):
    # A valid torch zip from another trainer: the KeyError of old.
    torch.save({"state_dict": case.state()["model"], "epoch": 3}, case.checkpoint)
    line = _refused(case)
    assert line == (f"train: error: --resume: {case.checkpoint} is damaged or not a turbotrain "
                    "checkpoint (no 'format_version' entry)")


@pytest.mark.parametrize("damage, reason", [
    ("counters", "TypeError: Counters.__init__() got an unexpected keyword argument 'bogus'"),
    ("momentum", "ValueError: optimizer momentum_buffer of shape"),
    ("rng", "ValueError: numpy RNG key of shape (3,)"),
    ("peak_lr", "ValueError: optimizer parameter group without a peak LR (initial_lr 'x')"),
    ("timing", "TypeError: timing 'steps' is 'x'"),
])
def test_a_checkpoint_with_the_right_keys_but_wrong_values_is_one_line(case, damage, reason):
    state = case.state()
    if damage == "counters":
        state["counters"] = {"bogus": 1}
    elif damage == "momentum":
        first = next(iter(state["optimizer"]["state"].values()))
        first["momentum_buffer"] = torch.zeros(7, 7, 7)
    elif damage == "peak_lr":  # what the LR schedule scales (schedule.PEAK_LR)
        state["optimizer"]["param_groups"][0]["initial_lr"] = "x"
    elif damage == "timing":  # the step-timing ledger (ledger.py)
        state["timing"]["steps"] = "x"
    else:
        state["rng"]["numpy"]["state"]["key"] = torch.tensor([1, 2, 3])
    torch.save(state, case.checkpoint)
    ran, touched = case.resume()
    line = ran.error_line("train: error: ")
    # Restoring happens after config.yaml is written back into RUN; nothing outside changes.
    assert not touched, touched
    prefix = (f"train: error: --resume: {case.checkpoint} is damaged or not a turbotrain "
              "checkpoint (")
    assert line.startswith(prefix), line
    assert line[len(prefix):].startswith(reason), line


def test_a_checkpoint_that_is_a_named_pipe_does_not_hang(case):
    case.checkpoint.unlink()
    os.mkfifo(case.checkpoint)
    line = _refused(case)
    assert line == (f"train: error: --resume: {case.checkpoint} is a named pipe, not a regular "
                    "file; refusing to read it")


def test_a_config_yaml_that_is_a_named_pipe_does_not_hang(case):
    config = case.run_dir / "config.yaml"
    config.unlink()
    os.mkfifo(config)
    line = _refused(case)
    assert line == f"train: error: config {config} is a named pipe, not a regular file"


def test_a_checkpoint_from_before_the_numpy_rng_became_a_tensor_still_resumes(case):
    # Older checkpoints hold np.random.get_state(): a uint32 ndarray, loaded through the narrow
    # numpy allow-list. The run continues from step 3 to step 5.
    state = case.state()
    state["rng"]["numpy"] = np.random.get_state()
    torch.save(state, case.checkpoint)
    with pytest.raises(Exception, match="numpy"):
        torch.load(case.checkpoint, weights_only=True)  # it does need numpy's globals
    ran, touched = case.resume("--max-steps", 5)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert not touched, touched
    assert "resuming" in ran.stdout and "done: 5 steps" in ran.stdout, ran.stdout


# ---------------------------------------------------------------------------- in process

def _save(tmp_path: Path, obj) -> Path:
    path = ckpt.checkpoint_path(tmp_path)
    torch.save(obj, path)
    return path


@pytest.mark.parametrize("payload, name", [
    (lambda marker: Payload(os.system, f"touch {marker}"), "os.system"),
    (lambda marker: Payload(eval, f"__import__('os').system('touch {marker}')"), "eval"),
    (lambda marker: Payload(shutil.copyfile, __file__, str(marker)), "shutil.copyfile"),
])
def test_any_global_outside_the_allow_list_is_refused(tmp_path, payload, name):
    marker = tmp_path / "MARKER"
    path = _save(tmp_path, {"format_version": 1, "model": payload(marker)})
    with pytest.raises(TrainError) as exc:
        ckpt.load_checkpoint(tmp_path)
    assert str(exc.value) == (f"--resume: {path} asks to run code ({name}) when loaded; "
                              f"refusing it {WEIGHTS_ONLY}")
    assert not marker.exists()


def test_a_class_of_our_own_is_code_too(tmp_path):
    path = _save(tmp_path, {"format_version": 1, "model": ckpt.StopRequest()})
    with pytest.raises(TrainError, match=r"asks to run code "
                                         r"\(turbotrain\.train\.records\.checkpoint\.StopRequest\)"):
        ckpt.load_checkpoint(tmp_path)
    assert path.is_file()


@pytest.mark.parametrize("obj, reason", [
    ([1, 2], "it holds a list, not a dict"),
    ({"format_version": 1}, "no 'model' entry"),
    ({"format_version": "1"}, "'format_version' is a str, not a int"),
])
def test_the_structure_is_checked(tmp_path, obj, reason):
    path = _save(tmp_path, obj)
    with pytest.raises(TrainError) as exc:
        ckpt.load_checkpoint(tmp_path)
    assert str(exc.value) == (f"--resume: {path} is damaged or not a turbotrain checkpoint "
                              f"({reason})")


def test_a_wrong_type_under_a_known_key(tmp_path):
    state = {key: {} for key in ("model", "optimizer", "scheduler", "scaler", "rng", "pipeline",
                                 "counters", "config")}
    path = _save(tmp_path, {**state, "format_version": 1, "loss_window": [0.0]})
    with pytest.raises(TrainError) as exc:
        ckpt.load_checkpoint(tmp_path)
    assert str(exc.value).endswith("('loss_window' is a list, not a Tensor)")
    _save(tmp_path, {**state, "format_version": 1, "loss_window": torch.zeros(())})
    assert "ema" not in ckpt.load_checkpoint(tmp_path)  # "ema" and "world_size" are optional
    assert path.is_file()


def test_a_newer_format_names_its_version(tmp_path):
    _save(tmp_path, {"format_version": 7})
    with pytest.raises(TrainError, match="has checkpoint format 7, this trainer reads 1"):
        ckpt.load_checkpoint(tmp_path)


def test_a_raw_pickle_is_not_a_checkpoint(tmp_path):
    # torch.save has written zips since 1.6; the legacy format (a bare pickle) is refused before
    # any unpickler sees it.
    import pickle
    marker = tmp_path / "MARKER"
    ckpt.checkpoint_path(tmp_path).write_bytes(
        pickle.dumps({"model": Payload(os.system, f"touch {marker}")}))
    with pytest.raises(TrainError, match="is damaged or not a turbotrain checkpoint "
                                         r"\(not a torch.save zip file"):
        ckpt.load_checkpoint(tmp_path)
    assert not marker.exists()


def test_new_checkpoints_need_no_numpy_globals(tmp_path):
    """capture_rng's state saves and loads with weights_only=True and no allow-list at all,
    and restores the same random streams."""
    ckpt.seed_everything(3)
    saved = ckpt.capture_rng()
    path = tmp_path / "rng.pt"
    torch.save(saved, path)
    loaded = torch.load(path, weights_only=True)
    first = (np.random.rand(), np.random.randn(), torch.rand(1).item())
    ckpt.restore_rng(loaded)
    assert (np.random.rand(), np.random.randn(), torch.rand(1).item()) == first


def test_config_yaml_errors_name_the_file(tmp_path):
    from turbotrain.train.config.config_files import load_yaml
    path = tmp_path / "config.yaml"
    os.mkfifo(path)
    with pytest.raises(TrainError, match=f"^config {path} is a named pipe, not a regular file$"):
        load_yaml(path)
    path.unlink()
    # A billion-laughs value: aliases nest lists 10^9 items deep in a few hundred bytes. It is
    # refused at once: str() of it would never end.
    levels = ["&a [x, x, x, x, x, x, x, x, x, x]"]
    for level in "bcdefghi":
        alias = "*" + chr(ord(level) - 1)
        levels.append(f"&{level} [{', '.join([alias] * 10)}]")
    path.write_text(f"data: [{', '.join(levels)}]\n")
    with pytest.raises(TrainError, match=f"^config {path}: data must be a single value, "
                                         "not a list$"):
        load_yaml(path)
