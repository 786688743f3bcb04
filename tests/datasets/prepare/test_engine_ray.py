"""`prepare-dataset --engine ray` on a real local Ray cluster (`ray.init(num_cpus=2)`, one for
the session, in one xdist worker): the merged folder equals the one-process run byte for byte,
also after a Ray worker is SIGKILLed mid-part (Ray retries it) and after the driver is
SIGKILLed and run again (the done parts are skipped, and counted); a part done with other
settings is refused in one line.

The cluster's workers encode every image ray_slow.SECONDS slower, so a part lasts long enough
to be killed in the middle; the runs they are compared with are local and not slowed.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from turbotrain.datasets.prepare.convert import PrepareError, PrepareOptions, prepare_dataset
from turbotrain.datasets.synthetic import write_shapes_imagefolder

from ..cli_run import cli, one_line_error
from . import ray_slow
from ... import expect
from .test_merge import same_folders

ray = expect.module("ray")  # fails where TURBOTRAIN_EXPECT names ray (make test, CI)

from turbotrain.datasets.prepare.engine_ray import prepare_with_ray  # noqa: E402

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.timeout(180),
              pytest.mark.usefixtures("child_processes")]

SMALL_SHARDS = 30_000  # ~4 photos of 160x120 a shard: 11 train + 6 val shards
PARTS = 8
PARTIAL = re.compile(r"\.part-(\d{5})-of-\d{5}\.partial-.+-(\d+)")


def options(**kw) -> PrepareOptions:
    return PrepareOptions(**{"progress": False, "shard_size": SMALL_SHARDS, **kw})


@pytest.fixture(scope="session")
def ray_cluster():
    """One local cluster of 2 CPUs for every test here (its start is ~10-20 s of their time)."""
    ray.cloudpickle.register_pickle_by_value(ray_slow)  # the workers cannot import tests/
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"worker_process_setup_hook": ray_slow.slow_encoding})
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    return write_shapes_imagefolder(root, train_per_class=4, val_per_class=2, size=(160, 120))


@pytest.fixture(scope="module")
def local(photos, tmp_path_factory):
    """`prepare-dataset SOURCE OUT --shard-size S` in one process: what every engine run equals."""
    out = tmp_path_factory.mktemp("local") / "ds"
    prepare_dataset(photos, out, options(workers=2))
    return out


def test_engine_run_equals_the_local_run(ray_cluster, photos, local, tmp_path, monkeypatch):
    # SOURCE relative to the driver's folder, which the workers do not share (on a cluster
    # they start where `ray start` ran): the tasks are given its absolute path.
    monkeypatch.chdir(photos.parent)
    info, run = prepare_with_ray(photos.name, tmp_path / "ds", options(), parts=PARTS)
    assert (run.parts, run.skipped, run.ran) == (PARTS, 0, PARTS)
    same_folders(tmp_path / "ds", local)  # byte for byte: dataset.json and all 17 shards
    assert sum(s["num_samples"] for s in info["splits"].values()) == 60


def test_a_worker_killed_mid_part_is_retried_and_the_result_is_the_same(ray_cluster, photos,
                                                                        local, tmp_path):
    out = tmp_path / "ds"
    done: dict = {}
    driver = threading.Thread(target=lambda: done.update(
        result=_or_error(prepare_with_ray, photos, out, options(), parts=PARTS)), daemon=True)
    driver.start()
    victim = _wait_for(lambda: _running_parts(out), what="a part running on a Ray worker")
    part, pid = victim[0]
    os.kill(pid, signal.SIGKILL)  # the worker process itself, in the middle of its part
    driver.join(150)
    assert not driver.is_alive(), "the driver did not finish after the worker was killed"
    assert not isinstance(done["result"], BaseException), done["result"]
    info, run = done["result"]
    assert run.ran == PARTS  # part `part` was run again by Ray, on another worker
    same_folders(out, local)
    assert not any(PARTIAL.fullmatch(name) for name in os.listdir(out))


def test_a_killed_driver_run_again_skips_the_done_parts(ray_cluster, photos, local, tmp_path):
    out = tmp_path / "ds"
    script = ("import sys, ray\n"
              "from tests.datasets.prepare import ray_slow\n"
              "ray.cloudpickle.register_pickle_by_value(ray_slow)\n"
              "ray.init(address=sys.argv[1], log_to_driver=False, runtime_env="
              "{'worker_process_setup_hook': ray_slow.slow_encoding})\n"
              "from turbotrain.datasets.prepare.convert import PrepareOptions\n"
              "from turbotrain.datasets.prepare.engine_ray import prepare_with_ray\n"
              f"prepare_with_ray(sys.argv[2], sys.argv[3], PrepareOptions(progress=False, "
              f"shard_size={SMALL_SHARDS}), parts={PARTS})\n")
    repo = Path(__file__).resolve().parents[3]
    driver = subprocess.Popen([sys.executable, "-c", script, ray_cluster, str(photos), str(out)],
                              cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for(lambda: _manifests(out), what="a first part done", timeout=120)
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
    finally:
        driver.kill()
    # The dead driver's tasks end with it (Ray kills them) or finish: wait until none runs.
    _wait_for(lambda: not _running_parts(out), what="the dead driver's tasks to end")
    done_before = len(_manifests(out))
    assert 1 <= done_before < PARTS and not (out / "dataset.json").exists()
    info, run = prepare_with_ray(photos, out, options(), parts=PARTS)
    assert (run.skipped, run.ran) == (done_before, PARTS - done_before)
    same_folders(out, local)


def test_a_driver_sent_sigterm_says_so_in_one_line_and_a_rerun_finishes(ray_cluster, photos,
                                                                       local, tmp_path):
    """`kill` (Slurm's scancel, a preemption) of `prepare-dataset --engine ray`: ray.init put
    Ray's own SIGTERM handler in (a stack dump, exit status 15); the CLI's one line, 130."""
    out = tmp_path / "ds"
    # The CLI itself, its ray.init given the session's slowed workers (--shard-size is at
    # least 8 MiB on the command line: 2 parts, train's and val's).
    script = ("import functools, sys, ray\n"
              "from tests.datasets.prepare import ray_slow\n"
              "ray.cloudpickle.register_pickle_by_value(ray_slow)\n"
              "ray.init = functools.partial(ray.init, runtime_env="
              "{'worker_process_setup_hook': ray_slow.slow_encoding})\n"
              "from turbotrain.cli import main\n"
              "sys.exit(main(['prepare', *sys.argv[1:], '--shard-size', '8MiB', '--engine', "
              "'ray', '--parts', '2']))\n")
    repo = Path(__file__).resolve().parents[3]
    driver = subprocess.Popen([sys.executable, "-c", script, str(photos), str(out), "--address",
                               ray_cluster], cwd=repo, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: _running_parts(out), what="a part running on a Ray worker")
        driver.send_signal(signal.SIGTERM)
        stdout, stderr = driver.communicate(timeout=60)
    finally:
        driver.kill()
    assert driver.returncode == 130, stderr
    assert "Traceback" not in stderr and "SIGTERM received" not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == (
        f"prepare-dataset: interrupted; the parts done so far stay in {out}: run the same "
        f"command again to do the others and merge")
    _wait_for(lambda: not _running_parts(out), what="the cancelled tasks to end")
    info, run = prepare_with_ray(photos, out, options(shard_size=8 << 20), parts=2)
    assert run.skipped + run.ran == 2 and run.ran >= 1
    assert sum(s["num_samples"] for s in info["splits"].values()) == 60


def test_parts_done_by_hand_are_skipped_and_a_changed_shard_redone(ray_cluster, photos, local,
                                                                    tmp_path):
    """Parts already done with --part (by Slurm, say) are skipped by the engine once their task
    has checked their shards' sha256; the part whose shard changed (same size) is redone."""
    out = tmp_path / "ds"
    for k in range(PARTS):
        prepare_dataset(photos, out, options(workers=1, part=(k, PARTS)))
    victim = out / "train-00005-of-00011.beton"
    data = bytearray(victim.read_bytes())
    data[-30] ^= 0xFF
    victim.write_bytes(bytes(data))
    info, run = prepare_with_ray(photos, out, options(), parts=PARTS)
    assert (run.skipped, run.ran) == (PARTS - 1, 1)
    same_folders(out, local)


def test_a_part_done_with_other_settings_is_refused(ray_cluster, photos, tmp_path):
    out = tmp_path / "ds"
    prepare_dataset(photos, out, options(workers=1, quality=80, part=(3, PARTS)))
    with pytest.raises(PrepareError) as e:
        prepare_with_ray(photos, out, options(), parts=PARTS)
    line = str(e.value)
    assert "\n" not in line
    assert f"part 3/{PARTS} in {out} is done with other encoding.quality" in line
    assert "--overwrite" in line
    with pytest.raises(PrepareError, match="holds parts of a 8-part run; pass --parts 8"):
        prepare_with_ray(photos, out, options(), parts=4)


def test_cli_engine_ray_with_address(ray_cluster, tmp_path):
    """The real flags end to end, on the session's cluster: 6,000 raw 32x32 images, 3 shards
    of 8 MiB, as 3 Ray parts, merged; the same bytes as `--engine local`; then --check."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "src.npz", images=rng.integers(0, 255, (6000, 32, 32, 3), np.uint8),
             labels=rng.integers(0, 10, 6000))
    common = ["--shard-size", "8MiB", "--workers", "1"]
    assert cli("prepare", tmp_path / "src.npz", tmp_path / "local", *common).returncode == 0
    result = cli("prepare", tmp_path / "src.npz", tmp_path / "ray", *common, "--engine", "ray",
                 "--address", ray_cluster, timeout=150)
    assert result.returncode == 0, result.stderr
    assert "on Ray: 3 parts (0 already done, 3 run" in result.stdout
    same_folders(tmp_path / "ray", tmp_path / "local")
    line = one_line_error(cli("prepare", tmp_path / "src.npz", tmp_path / "x", "--parts", "2"))
    assert "--parts and --address are for --engine ray" in line
    line = one_line_error(cli("prepare", tmp_path / "src.npz", tmp_path / "x", "--engine", "ray"))
    assert "--engine ray needs --shard-size" in line


def test_without_ray_one_line_says_how_to_install_it(tmp_path):
    code = ("import sys; sys.modules['ray'] = None\n"  # as if the extra were not installed
            "from turbotrain.cli import main\n"
            "sys.exit(main(['prepare', sys.argv[1], sys.argv[2], '--shard-size', '8MiB', "
            "'--engine', 'ray']))")
    (tmp_path / "src").mkdir()
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "src"),
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert "pip install 'turbotrain[ray]'" in one_line_error(result)


def test_an_address_with_no_cluster_is_one_line_at_once(photos, tmp_path):
    """ray.init retries an address nothing listens at without end (warnings every few seconds,
    still at it after 10 min): the driver knocks first and says so in one line."""
    with socket.socket() as s:  # a port nothing listens at once it is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = cli("prepare", photos, tmp_path / "ds", "--shard-size", "8MiB", "--engine", "ray",
                 "--address", f"127.0.0.1:{port}", timeout=60)
    line = one_line_error(result)
    assert f"--address 127.0.0.1:{port}: no Ray cluster there (Connection refused)" in line
    assert not (tmp_path / "ds").exists()


def _or_error(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except BaseException as e:  # handed to the test's thread, which asserts on it
        return e


def _running_parts(out: Path) -> list[tuple[int, int]]:
    """(part, pid) of each part being written now: its hidden folder names its process."""
    found = []
    for name in os.listdir(out) if out.is_dir() else []:
        match = PARTIAL.fullmatch(name)
        if match and _alive(int(match[2])):
            found.append((int(match[1]), int(match[2])))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _manifests(out: Path) -> list[str]:
    folder = out / "parts"
    return sorted(n for n in os.listdir(folder) if n.endswith(".json")) if folder.is_dir() else []


def _wait_for(condition, *, what: str, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_bench_prepare_ray_smoke(ray_cluster, tmp_path):
    """bench/bench_prepare_ray.py end to end at 40 photos on the session's cluster (the real
    benchmark is 2,400 and 24,000 photos: `make bench`); its JSON is what report.py renders."""
    repo = Path(__file__).resolve().parents[3]
    result = subprocess.run([sys.executable, str(repo / "bench" / "bench_prepare_ray.py"),
                             "--images", "40", "--repeats", "1", "--json",
                             str(tmp_path / "r.json"), "--address", ray_cluster],
                            capture_output=True, text=True, timeout=170, cwd=repo)
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads((tmp_path / "r.json").read_text())
    [size] = data["sizes"]
    assert size["images"] == 40 and size["byte_identical"] is True
    assert size["ratio"] > 0 and size["driver_parts_per_second"] > 0 and size["parts"] == 1
    assert data["goals"][0]["ratio"] == size["ratio"] and "40 photos" in data["goals"][0]["what"]
