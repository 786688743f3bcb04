"""A remote dataset's server is input like any other: every byte read from it is bounded by the
bytes asked for and held to a deadline (object_store.Store, read_limits.py). Each case runs
the real `train --data http://127.0.0.1:PORT/ds` in a confined child against the misbehaving
server of http_server.py (started and stopped here, on 127.0.0.1 only); then a seeded fuzz of
what the server sends, in one confined child."""
from __future__ import annotations

from pathlib import Path

import pytest

from turbotrain.datasets.synthetic import write_random_raw_dataset

from .confined import changed, outside, run_json_script, tree_state
from .http_server import serve
from .model_child import child_env, run_cli
from .train_child import FAST

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("child_processes")]

FUZZ_SCRIPT = Path(__file__).with_name("fuzz_remote.py")
FUZZ_CASES = 150  # ~30 s on the 2-core box; a slow or silent case costs ~1 s of deadline
# A few seconds of deadline: the old reader kept going for 300 s a request (the child's
# timeout below would call that a hang).
SHORT_DEADLINE = {"TURBOTRAIN_REMOTE_TIMEOUT": "2"}
CHILD_TIMEOUT = 60


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_random_raw_dataset(tmp_path_factory.mktemp("remote") / "ds", shards=2,
                                    per_shard=20, val=8)


def train_from(server, work: Path, **env):
    work.mkdir(exist_ok=True)
    before = tree_state(work)
    ran = run_cli("train", "--data", server.url, "--out", work / "run", "--cache-dir",
                  work / "cache", "--epochs", 1, "--batch-size", 8, *FAST, cwd=work,
                  timeout=CHILD_TIMEOUT, env=child_env(**env))
    # Only the cache (its journal and locks) may have changed: no run starts on bad data.
    assert not outside(changed(before, tree_state(work)), work / "cache")
    return ran


def test_an_endless_body_is_cut_at_the_bytes_asked_for(dataset, tmp_path):
    with serve(dataset) as server:
        server.behave["dataset.json"] = "endless"  # Content-Length 1 TiB, zeros forever
        ran = train_from(server, tmp_path / "work")
    line = ran.error_line("train: error: ")
    assert line.startswith(f"train: error: {server.url}/dataset.json: the server sent more than "
                           f"the {(dataset / 'dataset.json').stat().st_size:,} bytes asked for")


def test_a_slow_download_gives_up_by_its_deadline_naming_the_url(dataset, tmp_path):
    with serve(dataset) as server:
        for shard in ("train-00000-of-00002.beton", "train-00001-of-00002.beton"):
            server.behave[shard] = "slow:download"  # headers fine, then a byte every 0.2 s
        ran = train_from(server, tmp_path / "work", **SHORT_DEADLINE)
    line = ran.error_line("train: error: ")
    assert line.startswith(f"train: error: {server.url}/train-0000")
    assert " gave up after " in line and "$TURBOTRAIN_REMOTE_MIN_RATE" in line
    # Its deadline: 2 s + the shard's size at 100 kB/s (~21 s for the 2 MiB shard), not 300 s
    # a request with every byte of progress resetting the tries.
    assert ran.seconds < 45, ran.seconds


def test_a_server_that_never_answers_gives_up_in_one_line(dataset, tmp_path):
    with serve(dataset) as server:
        server.behave["dataset.json"] = "silent"
        ran = train_from(server, tmp_path / "work", **SHORT_DEADLINE)
    line = ran.error_line("train: error: ")
    assert line.startswith(f"train: error: {server.url}/dataset.json: gave up after ")
    assert ran.seconds < 30, ran.seconds


@pytest.mark.parametrize("mode, says", [
    ("chunked", "the server's answer is malformed"),
    ("ignore-range", "the server does not answer range requests"),
    ("long", "the server sent other bytes than the range asked for"),
])
def test_a_lying_shard_header_is_one_line(dataset, tmp_path, mode, says):
    with serve(dataset) as server:
        server.behave["train-00000-of-00002.beton"] = mode
        ran = train_from(server, tmp_path / "work", **SHORT_DEADLINE)
    line = ran.error_line("train: error: ")
    assert line.startswith(f"train: error: {server.url}/train-00000-of-00002.beton: {says}")


def test_what_a_server_sends_fuzz(tmp_path):
    result = run_json_script(FUZZ_SCRIPT, tmp_path / "work", FUZZ_CASES, 20261201,
                             address_space=2 << 30, timeout=200, peak_rss=512 << 20)
    assert result["cases"] == FUZZ_CASES
    assert result["problems"] == []
    assert result["refused"] > FUZZ_CASES // 2  # the lies were noticed, not served
