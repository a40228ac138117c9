"""benchmarks/result_file.emit: every benchmark result records the machine it was measured on (CPU
model and kind, the ISA flags, `auto`'s dtype, torch's thread count), written whole or not at all."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from result_file import ISA_FLAGS, cpu_identity, emit  # noqa: E402

from components.core.device import cpu_has_native_bf16  # noqa: E402

AMX_CPU = (
    "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8488C\n"
    "flags\t\t: fpu avx2 avx512f avx512_vnni avx512_bf16 avx_vnni amx_bf16 amx_tile amx_int8\n"
)
NO_AMX_CPU = (
    "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8375C\n"
    "flags\t\t: fpu avx2 avx512f avx512_vnni avx512_bf16 avx_vnni\n"
)


def test_emit_records_the_machine(tmp_path, capsys):
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # what the benchmark set is what is recorded
        out = emit({"benchmark": "x", "value": 1.5}, tmp_path / "r" / "x.json")
    finally:
        torch.set_num_threads(threads)
    saved = json.loads((tmp_path / "r" / "x.json").read_text())
    assert saved == out == json.loads(capsys.readouterr().out)
    assert not list((tmp_path / "r").glob(".*partial"))
    m = saved["machine"]
    assert saved["value"] == 1.5 and m["torch_threads"] == 1
    # the CPU as /proc/cpuinfo names it, and its flags as the kernel reports them
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next(line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name"))
    flags = set(next(line.split(":", 1)[1] for line in cpuinfo.splitlines() if line.startswith("flags")).split())
    assert m["cpu_model"] == model
    assert m["isa"] == {f: f in flags for f in ISA_FLAGS}
    # `auto` picks bf16 exactly where the CPU multiplies it natively (AMX), else float32
    assert m["auto_dtype_cpu"] == ("bfloat16" if cpu_has_native_bf16() else "float32")
    assert m["cpu_kind"].startswith("AMX") == m["isa"]["amx_bf16"]


def test_a_benchmarks_own_machine_fields_are_kept(tmp_path):
    out = emit({"machine": {"cpus": 99, "platform": "p"}}, None)
    assert out["machine"]["cpus"] == 99 and out["machine"]["platform"] == "p" and "cpu_model" in out["machine"]


def test_cpu_kinds_are_told_apart():
    amx, no_amx = cpu_identity(AMX_CPU), cpu_identity(NO_AMX_CPU)
    assert amx["cpu_model"].endswith("8488C") and amx["isa"]["amx_bf16"] and amx["cpu_kind"].startswith("AMX-BF16")
    assert no_amx["isa"]["avx512_bf16"] and not no_amx["isa"]["amx_bf16"] and no_amx["isa"]["avx_vnni"]
    assert no_amx["cpu_kind"].startswith("AVX512-BF16 without AMX")
    unknown = cpu_identity("")
    assert unknown["isa"] is None and unknown["cpu_kind"].startswith("unknown")
