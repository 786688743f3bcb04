"""`Machine`: what a plan needs to know about the hardware and the launch, as plain values.

hardware.detect_machine(env) fills one in for the machine this process runs on (the one reader
of the hardware); `PRESETS` describe machines we are not on (`turbotrain info --machine
8xh200`, the plan's tests), so a plan for them can be computed, printed and tested anywhere.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from turbotrain.pipeline.registry import optional_engines, pipeline_names


def _registered_pipelines() -> tuple[str, ...]:
    return tuple(pipeline_names())


@dataclass(frozen=True)
class GpuInfo:
    """One GPU, as the CUDA decisions see it; tests pass one for a GPU they do not have."""
    name: str
    capability: tuple[int, int]
    memory_bytes: int
    # Free memory measured by hardware.detect_machine() on this rank's GPU (the resident budget is a
    # share of it); None for the other GPUs and for presets: then planned as all free.
    free_bytes: int | None = None
    bf16: bool = True  # bf16 tensors work (natively from compute capability 8.0, else emulated)

    def __str__(self) -> str:
        major, minor = self.capability
        return (f"{self.name}, compute capability {major}.{minor}, "
                f"{self.memory_bytes / 2**30:.0f} GiB")

    @property
    def free(self) -> int:
        return self.memory_bytes if self.free_bytes is None else self.free_bytes


@dataclass(frozen=True)
class Machine:
    cores: int  # CPU cores this process may use (its affinity): shared by the node's ranks
    ram_bytes: int  # RAM still available (MemAvailable, within a container's cgroup limit)
    gpus: tuple[GpuInfo, ...] = ()  # this node's CUDA devices
    cpu_model: str = "unknown"
    cpu_flags: frozenset[str] = frozenset()  # /proc/cpuinfo's feature flags
    cpu_bf16: bool = False  # native bf16 math: avx512_bf16 or amx_bf16
    world_size: int = 1  # torchrun's WORLD_SIZE: ranks in the job
    local_world_size: int = 1  # ranks on this node (LOCAL_WORLD_SIZE)
    local_rank: int = 0  # this process's place on the node: its GPU
    # The registered pipelines and those whose optional package imports (registry.py). By
    # default a full install: every pipeline registered when the Machine is made, every
    # optional engine importable (what a preset assumes).
    pipelines: tuple[str, ...] = field(default_factory=_registered_pipelines)
    installed: frozenset[str] = field(default_factory=optional_engines)
    platform: str = "linux"
    name: str = "this machine"

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def cores_per_rank(self) -> int:
        return max(1, self.cores // max(1, self.local_world_size))

    @property
    def gpu(self) -> GpuInfo | None:
        """This rank's GPU (LOCAL_RANK's, as train sets it), None without CUDA."""
        return self.gpus[self.local_rank % len(self.gpus)] if self.gpus else None

    def describe(self) -> str:
        gpus = (f"{len(self.gpus)} x {self.gpus[0]}" if self.gpus and
                len(set(self.gpus)) == 1 else ", ".join(map(str, self.gpus)) or "no GPU")
        bf16 = "native bf16" if self.cpu_bf16 else "no native bf16"
        launch = ("one process" if self.world_size == 1 else
                  f"{self.world_size} ranks on {self.nodes} node(s), {self.local_world_size} "
                  "per node")
        return (f"{self.name}: {self.cores} cores ({bf16}), {self.ram_bytes / 2**30:.0f} GiB "
                f"RAM available, {gpus}; {launch}")

    @classmethod
    def preset(cls, name: str) -> Machine:
        try:
            return PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown machine {name!r}; choose one of: "
                             f"{', '.join(PRESETS)}") from None


GiB = 2**30
H200 = GpuInfo("NVIDIA H200", (9, 0), 141 * GiB)
A100 = GpuInfo("NVIDIA A100-SXM4-80GB", (8, 0), 80 * GiB)
V100 = GpuInfo("Tesla V100-SXM2-32GB", (7, 0), 32 * GiB)
_AVX512_BF16 = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni"})
_SAPPHIRE_RAPIDS = _AVX512_BF16 | {"amx_tile", "amx_bf16", "amx_int8"}
_cpu2 = Machine(cores=2, ram_bytes=6 * GiB, cpu_model="Intel Xeon (2 vCPU, AVX-512 bf16)",
                cpu_flags=_AVX512_BF16, cpu_bf16=True, installed=frozenset(), name="cpu2")
_h200 = Machine(cores=16, ram_bytes=120 * GiB, gpus=(H200,), cpu_model="16-core host",
                cpu_flags=_SAPPHIRE_RAPIDS, cpu_bf16=True, name="h200")
_node8 = replace(_h200, cores=128, ram_bytes=1800 * GiB, gpus=(H200,) * 8,
                 cpu_model="2 x 64-core host", name="8xh200")

# Machines to plan for without being on them (`turbotrain info --machine NAME`).
PRESETS: dict[str, Machine] = {
    "cpu2": _cpu2,  # the dev box: 2 cores with AVX-512 bf16, no GPU
    # The issue-32 box: 2 cores, AVX2 only (fp32), as a newcomer's laptop or small VM.
    "cpu2-avx2": replace(_cpu2, cpu_model="AMD EPYC (2 vCPU, AVX2)", cpu_flags=frozenset({"avx2"}),
                         cpu_bf16=False, name="cpu2-avx2"),
    "cpu16-avx2": Machine(cores=16, ram_bytes=60 * GiB, cpu_model="16-core AVX2 CPU",
                          cpu_flags=frozenset({"avx2"}), name="cpu16-avx2"),  # no native bf16
    "h200": _h200,  # 16 cores, one H200 (141 GB, compute capability 9.0)
    "v100": replace(_h200, gpus=(V100,), name="v100"),  # no bf16 tensor cores: fp16
    # One 8-GPU node: a plain `train` (one process, GPU 0) and torchrun with 8 ranks.
    "8xh200": _node8,
    "8xh200-torchrun": replace(_node8, world_size=8, local_world_size=8, name="8xh200-torchrun"),
    # Two such nodes under torchrun: 16 ranks.
    "2x8xh200": replace(_node8, world_size=16, local_world_size=8, name="2x8xh200"),
}
