"""Facts about the machine this process runs on that more than one layer needs."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# cgroup v2 and v1 files holding a container's memory limit and use.
_CGROUP_LIMITS = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                  ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                   "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def available_ram() -> int:
    """Bytes of RAM this process can still use: the kernel's MemAvailable, lowered to what is
    left of a container's cgroup limit (Docker, Kubernetes and Slurm set one; MemAvailable
    describes the whole host and would let a 16 GiB container plan for 500 GiB)."""
    available = _mem_available()
    for limit_file, usage_file in _CGROUP_LIMITS:
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit():  # "max" (v2) or a huge number (v1) means no limit
            available = min(available, max(0, int(limit) - usage))
        break
    return available


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def available_cores() -> int:
    """CPU cores this process may run on: its affinity, which taskset, cgroups and Slurm set
    (os.cpu_count() counts the whole machine). The one core count; train/plan's Machine divides
    it between the ranks of a node."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def ranks_on_this_node() -> int:
    """Processes of this job on this machine: torchrun's LOCAL_WORLD_SIZE, else 1."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


@dataclass(frozen=True)
class CpuInfo:
    model: str
    flags: frozenset[str]  # the first processor's feature flags (avx512_bf16, amx_tile, ...)
    read: bool  # False off Linux: /proc/cpuinfo could not be read, so `flags` says nothing


# ONEDNN_MAX_CPU_ISA caps the instructions oneDNN (torch's CPU convolutions and matmuls) uses:
# the flag prefixes it then leaves unused. Under AVX2 a bf16 step is emulated (slower than
# fp32), so the plan must see no bf16 there; it is also how an AVX-512 box stands in for an
# AVX2-only one (the test suite's fp32 training, issue 44).
_ONEDNN_UNUSED = {"AVX2": ("avx512", "amx"), "AVX2_VNNI": ("avx512", "amx"),
                  "AVX2_VNNI_2": ("avx512", "amx"), "AVX512_CORE": ("avx512_bf16", "amx"),
                  "AVX512_CORE_VNNI": ("avx512_bf16", "amx"), "AVX512_CORE_BF16": ("amx",),
                  "AVX512_CORE_FP16": ("amx",)}


def cpu_info(path: str = "/proc/cpuinfo", onednn_cap: str | None = None) -> CpuInfo:
    """The CPU's model name and the feature flags torch can use: the one reader of
    /proc/cpuinfo. The flags above `onednn_cap` (default: the ONEDNN_MAX_CPU_ISA variable)
    are left out."""
    try:
        text = Path(path).read_text()
    except OSError:
        text = ""
    model, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
        if model and flags:
            break
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA") if onednn_cap is None else onednn_cap
    unused = _ONEDNN_UNUSED.get((cap or "").upper(), ())
    flags = frozenset(f for f in flags if not f.startswith(unused)) if unused else flags
    return CpuInfo(model or "unknown", flags, bool(text))


def isa_name(flags: frozenset[str]) -> str:
    """The CPU's widest vector instructions, in words: they change what a decode and a training
    step cost (`train` picks bf16 only on avx512_bf16 or AMX: the suite took 21 min on an
    AVX2-only box against 8.5 on an AMX one, issue 44), so rates and suite times from two boxes
    that differ here do not compare. The one name: bench/common.py's machine block and the
    test header use it."""
    if "avx512f" in flags:
        extras = [name for flag, name in (("avx512_bf16", "bf16"), ("amx_tile", "AMX"))
                  if flag in flags]
        return " + ".join(["AVX-512", *extras])
    return "AVX2 without AVX-512" if "avx2" in flags else "no AVX2"


def total_ram() -> int | None:
    """Bytes of RAM the machine has (MemTotal), None off Linux."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
