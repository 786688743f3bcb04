"""turbotrain/host.py: the CPU's flags as torch can use them, and the ISA's one name."""
from __future__ import annotations

from turbotrain.host import cpu_info, isa_name


def test_a_onednn_isa_cap_hides_the_instructions_above_it(tmp_path):
    """Under ONEDNN_MAX_CPU_ISA=AVX2 oneDNN emulates bf16, so the plan must not see native
    bf16 (and an AVX-512 box then stands in for an AVX2-only one); a cap at AVX512_CORE keeps
    AVX-512 but not its bf16; no cap or an unknown one keeps every flag."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: Some Xeon\nflags\t\t: sse avx2 avx512f avx512_bf16 "
                       "avx512_vnni amx_tile amx_bf16\n")
    assert isa_name(cpu_info(str(cpuinfo), "AVX2").flags) == "AVX2 without AVX-512"
    assert cpu_info(str(cpuinfo), "avx2").flags == {"sse", "avx2"}
    assert isa_name(cpu_info(str(cpuinfo), "AVX512_CORE").flags) == "AVX-512"
    assert isa_name(cpu_info(str(cpuinfo), "AVX512_CORE_BF16").flags) == "AVX-512 + bf16"
    assert isa_name(cpu_info(str(cpuinfo), "").flags) == "AVX-512 + bf16 + AMX"
    assert isa_name(cpu_info(str(cpuinfo), "NO_SUCH_ISA").flags) == "AVX-512 + bf16 + AMX"
    assert cpu_info(str(cpuinfo), "").model == "Some Xeon"
