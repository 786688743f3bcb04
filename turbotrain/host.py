"""Facts about the machine this process runs on that more than one layer needs."""
from __future__ import annotations

import os
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
