"""The doctor's findings as pure rules (tools/doctor_findings.py): each on measurements that
have the mistake and on measurements that do not, with the gain its stated model gives."""
from __future__ import annotations

import pytest

from turbotrain.train.records.verdict import verdict_of
from turbotrain.train.tools.doctor_analysis import analyse, processes, summary
from turbotrain.train.tools.doctor_findings import (KEEP_FREED_MEMORY, Measured, findings_of,
                                                    ranked)


def step(**seconds) -> dict:
    s = {"dur": 0.100, "wait": 0.0, "copy": 0.0, "fwd": 0.03, "bwd": 0.05, "optim": 0.005,
         "batches": 1, "images": 32, "forwards": 1, "backwards": 1, "syncs": 0, "sync_s": 0.0}
    s.update(seconds)
    s["fwd_bwd"] = s["fwd"] + s["bwd"]
    s["other"] = max(0.0, s["dur"] - s["wait"] - s["copy"] - s["fwd_bwd"] - s["optim"])
    return s


def loader(**kw) -> dict:
    return {"num_workers": 2, "pin_memory": False, "batch_size": 32, "root": None,
            "site": "train.py:12", **kw}


def model(**kw) -> dict:
    return {"device": "cpu", "dtype": "float32", "conv": True, "channels_last": False,
            "autocast": False, "ddp": False, "cuda_available": False, "torch_threads": 1, **kw}


def measured(s=None, probe=None, **kw) -> Measured:
    defaults = dict(step=s or step(), loader=loader(), model=model(),
                    probe={"threads_now": 1, "batch": 32, "base": 0.08,
                           "threads": {"1": 0.08, "2": 0.045}, **(probe or {})},
                    load_seconds=0.02, decode_share=0.1, batch=None, syncs={},
                    gpu_seconds=None, cores=2, bf16_native=False)
    defaults.update(kw)
    return Measured(**defaults)


def ids(m: Measured) -> list[str]:
    return [f["id"] for f in findings_of(m)]


def test_num_workers_zero_is_found_with_its_gain_from_the_measured_load_time():
    # 60 ms of a 100 ms step waits for a 60 ms load in the loop; compute 35 ms at 1 thread
    s = step(dur=0.100, wait=0.060, fwd=0.015, bwd=0.020, optim=0.0)
    m = measured(s, loader=loader(num_workers=0), load_seconds=0.060,
                 probe={"threads": {"1": 0.035, "2": 0.02}})
    found = findings_of(m)
    assert found[0]["id"] == "num_workers"
    # 1 worker + 1 thread on 2 cores: max(35 + 5 ms rest, 60 ms / 1) = 60 ms -> 1.67x
    assert found[0]["settings"] == {"workers": 1, "threads": 1}
    assert found[0]["gain"] == pytest.approx(0.100 / 0.060, rel=1e-3)
    assert "num_workers=1" in found[0]["change"] and found[0]["site"] == "train.py:12"


def test_num_workers_not_found_when_the_loader_keeps_up_or_has_workers():
    assert "num_workers" not in ids(measured(step(wait=0.001), loader=loader(num_workers=0)))
    assert "num_workers" not in ids(measured(step(wait=0.06), loader=loader(num_workers=1)))
    assert "num_workers" not in ids(measured(step(wait=0.06), loader=loader(num_workers=0),
                                             cores=1))


def test_oversubscription_is_found_from_the_contention_the_probe_shows():
    # 2 workers + 2 threads on 2 cores: forward+backward 300 ms in the loop, 40 ms alone
    s = step(dur=0.320, wait=0.0, fwd=0.1, bwd=0.2, optim=0.01)
    m = measured(s, loader=loader(num_workers=2), load_seconds=0.01,
                 probe={"threads_now": 2, "threads": {"1": 0.04, "2": 0.025}})
    found = findings_of(m)
    assert found[0]["id"] == "oversubscribed"
    assert found[0]["settings"] == {"workers": 1, "threads": 1}
    # max(40 ms + 10 ms optimizer + 10 ms rest, 10 ms / 1 worker) = 60 ms
    assert found[0]["gain"] == pytest.approx(0.320 / 0.060, rel=1e-3)


def test_oversubscription_loads_at_the_workers_cpu_time_not_their_contended_wall_time():
    # the 2 workers took 200 ms of wall time a batch fighting 2 torch threads, but 50 ms of
    # CPU: with a core of its own, 1 worker loads a batch in 50 ms, not 200
    s = step(dur=0.120, wait=0.040, fwd=0.03, bwd=0.04, optim=0.0)
    probe = {"threads_now": 2, "threads": {"1": 0.04, "2": 0.03}}
    m = measured(s, loader=loader(num_workers=2), load_seconds=0.200, probe=probe,
                 load_cpu_seconds=0.050)
    found = {f["id"]: f for f in findings_of(m)}
    # max(40 ms + 10 ms rest, 50 ms / 1 worker) = 50 ms
    assert found["oversubscribed"]["gain"] == pytest.approx(0.120 / 0.050, rel=1e-3)
    # without the CPU time (an older record): the wall time, and no gain to report
    wall = measured(s, loader=loader(num_workers=2), load_seconds=0.200, probe=probe)
    assert "oversubscribed" not in ids(wall)


def test_no_oversubscription_when_workers_and_threads_fit_the_cores():
    m = measured(loader=loader(num_workers=1), probe={"threads_now": 1})
    assert "oversubscribed" not in ids(m)
    assert "oversubscribed" not in ids(measured(loader=loader(num_workers=4), cores=16,
                                                probe={"threads_now": 8}))


def test_pil_decode_is_found_only_when_input_bound_with_decode_hot():
    s = step(dur=0.100, wait=0.5 * 0.100)
    hot = measured(s, decode_share=0.8, loader=loader(num_workers=1, root="/data/train"))
    found = {f["id"]: f for f in findings_of(hot)}
    assert "prepare-dataset /data/train" in found["pil_decode"]["change"]
    assert found["pil_decode"]["gain"] == pytest.approx(2.0, rel=1e-3)
    assert "pil_decode" not in ids(measured(s, decode_share=0.2))
    assert "pil_decode" not in ids(measured(step(wait=0.01), decode_share=0.9))


def test_a_switch_of_loader_ranks_after_the_fixes_to_the_script():
    # input-bound on PIL decode in 2 workers + 2 threads on 2 cores: the switch to
    # turbotrain's loader (an upper bound, 2x) ranks after the script's own fix (1.25x)
    s = step(dur=0.100, wait=0.050, fwd=0.020, bwd=0.020, optim=0.0)
    m = measured(s, loader=loader(num_workers=2, root="/data/train"), load_seconds=0.080,
                 decode_share=0.9, probe={"threads_now": 2, "threads": {"1": 0.02, "2": 0.015}})
    found = findings_of(m)
    assert [f["id"] for f in found] == ["oversubscribed", "pil_decode"]
    assert [f["kind"] for f in found] == ["script", "switch"]
    assert found[0]["gain"] < found[1]["gain"]
    # script fixes among themselves (and switches among themselves) by gain
    made_up = [{"id": i, "kind": k, "gain": g} for i, k, g in
               (("a", "switch", 3.0), ("b", "script", 1.2), ("c", "script", 1.5),
                ("d", "switch", 1.1))]
    assert [f["id"] for f in ranked(made_up)] == ["c", "b", "a", "d"]


def test_bf16_channels_last_and_batch_come_from_the_probe():
    s = step(dur=0.100, wait=0.0, fwd=0.04, bwd=0.04)
    m = measured(s, probe={"bf16": 0.02, "channels_last": 0.06,
                           "larger_batch": {"batch": 512, "seconds": 0.4},
                           "fits_batch": 100000, "activation_bytes": 2 ** 20})
    found = {f["id"]: f for f in findings_of(m)}
    assert found["bf16"]["gain"] == pytest.approx(0.100 / (0.020 + 0.020), rel=1e-3)
    assert found["channels_last"]["gain"] == pytest.approx(0.100 / (0.020 + 0.060), rel=1e-3)
    # 16x the images: fwd+bwd 80 ms x 0.4/0.08 = 400 ms, + 20 ms once -> 420 ms / 16
    assert found["batch_size"]["gain"] == pytest.approx(0.100 / (0.420 / 16), rel=1e-3)
    assert found["batch_size"]["settings"] == {"batch_size": 512}
    assert [f["id"] for f in findings_of(m)][0] == "batch_size"  # ranked by gain


def test_no_probe_finding_where_the_probe_saw_no_gain_or_did_not_run():
    m = measured(probe={"bf16": 0.09, "channels_last": {"error": "x"},
                        "larger_batch": {"batch": 64, "seconds": 0.16}, "fits_batch": 64,
                        "activation_bytes": 1})
    assert not {"bf16", "channels_last", "batch_size"} & set(ids(m))


def test_page_faults_cost_their_count_times_the_probed_cost_of_one():
    # 2,000 faults of 20 us each: 40 ms of a 100 ms step
    found = {f["id"]: f for f in findings_of(measured(step(faults=2000),
                                                       probe={"fault_seconds": 20e-6}))}
    assert found["page_faults"]["gain"] == pytest.approx(0.100 / 0.060, rel=1e-3)
    assert found["page_faults"]["settings"] == {"env": KEEP_FREED_MEMORY}
    # never below the wait for data: the faults are the training process's own work
    waiting = step(dur=0.100, wait=0.080, fwd=0.005, bwd=0.005, faults=4000)
    found = {f["id"]: f for f in findings_of(measured(waiting, probe={"fault_seconds": 20e-6}))}
    assert found["page_faults"]["gain"] == pytest.approx(0.100 / 0.080, rel=1e-3)


def test_page_faults_where_glibc_keeps_freed_memory_already_advise_another_allocator():
    found = {f["id"]: f for f in findings_of(measured(step(faults=2000), freed_memory_kept=True,
                                                       probe={"fault_seconds": 20e-6}))}
    assert "MALLOC_" not in found["page_faults"]["change"]
    assert "jemalloc" in found["page_faults"]["change"]
    assert found["page_faults"]["settings"] == {}  # nothing a program could apply


def test_no_page_fault_finding_without_faults_or_their_probed_cost():
    assert "page_faults" not in ids(measured(step(faults=0), probe={"fault_seconds": 20e-6}))
    assert "page_faults" not in ids(measured(step(faults=2000)))
    assert "page_faults" not in ids(measured(step(), probe={"fault_seconds": 20e-6}))
    # 100 faults of 1.3 us: 0.13 % of the step, under MIN_GAIN
    assert "page_faults" not in ids(measured(step(faults=100), probe={"fault_seconds": 1.3e-6}))


def test_gpu_findings_need_the_gpu_case():
    cuda = model(device="cuda:0", cuda_available=True)
    s = step(dur=0.100, copy=0.03, syncs=3, sync_s=0.04)
    m = measured(s, model=cuda, gpu_seconds=0.05, loader=loader(pin_memory=False),
                 probe={"copy_pageable": 0.003, "copy_pinned": 0.001})
    found = {f["id"]: f for f in findings_of(m)}
    assert found["pin_memory"]["gain"] == pytest.approx(0.100 / (0.070 + 0.010), rel=1e-3)
    assert found["syncs"]["gain"] == pytest.approx(0.100 / 0.060, rel=1e-3)
    on_cpu = measured(step(), model=model(cuda_available=True),
                      probe={"on_cuda": 0.008, "copy_pinned": 0.001})
    assert "cpu_model" in ids(on_cpu)
    # the same numbers on a CPU-only run, or with pinned memory: none of them
    assert not {"pin_memory", "syncs", "cpu_model"} & set(ids(measured(s)))
    assert "pin_memory" not in ids(measured(s, model=cuda, loader=loader(pin_memory=True),
                                            probe={"copy_pageable": 3, "copy_pinned": 1}))


def test_ddp_accumulation_without_no_sync():
    s = step(dur=0.200, fwd=0.02, bwd=0.16, backwards=2, forwards=2)
    m = measured(s, model=model(ddp=True), probe={"base": 0.05})
    found = {f["id"]: f for f in findings_of(m)}
    # each backward 80 ms against 50 - 10 = 40 ms without DDP: 40 ms saved once
    assert found["ddp_no_sync"]["gain"] == pytest.approx(0.200 / 0.160, rel=1e-3)
    assert "ddp_no_sync" not in ids(measured(s, model=model(ddp=True), probe={"base": 0.05},
                                             syncs={"no_sync_used": True}))
    assert "ddp_no_sync" not in ids(measured(s, probe={"base": 0.05}))


def test_the_verdict_is_trains_rule():
    assert verdict_of(0.5, 0.4) == "input-bound"
    assert verdict_of(0.05, 0.5, copy=0.3) == "copy-bound"
    assert verdict_of(0.05, 0.5) == "host-bound"
    assert verdict_of(0.05, 0.9) == "compute-bound"
    assert verdict_of(0.0, 0.9, host_issue_fraction=0.9) == "host-bound"


def test_analyse_reads_records_of_a_process_and_its_workers():
    files = {
        "10": [{"kind": "start", "pid": 10, "ppid": 1, "rank": None},
               {"kind": "loader", "num_workers": 1, "pin_memory": False, "batch_size": 4,
                "root": None, "site": "t.py:3"},
               *[{"kind": "step", "i": i, "dur": 0.1, "wait": 0.05, "copy": 0, "fwd": 0.02,
                  "bwd": 0.02, "optim": 0.0, "batches": 1, "images": 4, "forwards": 1,
                  "backwards": 1, "syncs": 0, "sync_s": 0, "warmup": i < 2}
                 for i in range(1, 6)]],
        "11": [{"kind": "start", "pid": 11, "ppid": 10, "rank": None},
               {"kind": "fetch", "s": 0.08, "decode": 0.06, "n": 4, "cpu": 0.03},
               {"kind": "fetch", "s": 0.08, "decode": 0.06, "n": 4, "cpu": 0.05}],
        "12": [{"kind": "start", "pid": 12, "ppid": 1}],  # torchrun's launcher: nothing
    }
    found = processes(files)
    assert [p["start"]["pid"] for p in found] == [10]
    report = analyse(found[0], {"cores": 2, "bf16_native": False})
    assert report["timed_steps"] == 4 and report["verdict"] == "input-bound"
    assert report["shares"]["wait"] == pytest.approx(0.5)
    assert report["decode_share"] == pytest.approx(0.75)
    assert report["load_cpu_ms_per_batch"] == pytest.approx(40.0)  # the workers' CPU time
    assert any("not probed" in n for n in report["notes"])
    assert summary([report]) is None


def test_a_process_without_loader_or_optimizer_says_what_it_could_not_see():
    files = {"7": [{"kind": "start", "pid": 7, "ppid": 1},
                   {"kind": "model", "device": "cpu", "dtype": "float32"}]}
    report = analyse(processes(files)[0], {"cores": 2, "bf16_native": False})
    assert report["verdict"] == "unknown"
    assert any("no torch DataLoader" in n for n in report["notes"])
    assert any("no torch.optim optimizer" in n for n in report["notes"])


def test_the_script_keeps_freed_memory_when_both_glibc_settings_are_at_least_trains(
        monkeypatch):
    from turbotrain.train.tools.doctor import machine_facts
    for name, value in KEEP_FREED_MEMORY.items():
        monkeypatch.setenv(name, value)
    assert machine_facts()["freed_memory_kept"] is True
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")  # glibc's maps from 64 KiB up
    assert machine_facts()["freed_memory_kept"] is False
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    assert machine_facts()["freed_memory_kept"] is False
