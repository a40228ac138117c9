"""The GPU check script: its CPU dry run exercises every section at tiny sizes and writes the summary
(the multi-GPU line as 2 gloo processes); without a GPU the real run refuses clearly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_dry_run_writes_every_section(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = run("--dry-run", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert json.loads(proc.stdout) == summary  # the same JSON on stdout
    assert summary["dry_run"] is True
    assert summary["headline"]["errors"] == [], {k: summary[k].get("error") for k in summary["headline"]["errors"]}

    # the SDPA kernel is observed, not assumed
    assert summary["sdpa"]["observed"] == "flash_cpu" and summary["sdpa"]["available"]["flash"]

    # GPT-2-shaped model through the pipeline's own loop
    tr = summary["train"]
    assert tr["steps"] == 6 and tr["tokens_per_s"] > 0 and tr["device"] == "cpu"
    assert tr["params"] == sum(p.numel() for p in _dry_model().parameters())
    assert tr["mfu"] is None  # no peak for a CPU
    assert tr["observed_in_model"]["sdpa_ops"] == ["flash_cpu"]
    assert tr["config"]["sdpa_backend"] == "flash" and tr["config"]["attention"] == "fused"

    # the sweep doubles N for both implementations
    sw = summary["sweep"]
    for impl in ("reference", "fused"):
        ns = [r["n"] for r in sw[impl]["rows"]]
        assert ns == [64, 128, 256, 512], ns
        assert all(r["ms"] > 0 for r in sw[impl]["rows"])
    assert set(sw["speedup"]) == {"64", "128", "256", "512"}
    # peak memory is measured on the CPU too: the reference's (N, N) scores against the fused kernel's O(N)
    ref, fused = ({r["n"]: r["peak_mib"] for r in sw[impl]["rows"]} for impl in ("reference", "fused"))
    assert ref[512] >= 2 * 512 * 512 * 4 / 2**20 and sw["memory_ratio"]["512"] > 3
    assert fused[512] < 2 * fused[256] + 0.1  # linear in N, not quadratic
    assert [r["n"] for r in sw["window"]["rows"]] == [64, 128, 256, 512] and sw["matmul_tflops_measured"] > 0
    assert all(0 < r["fraction_of_matmul_peak"] for r in sw["fused"]["rows"])
    assert {f["impl"] for f in sw["fits"]} == {"reference", "fused", "window"}

    # bitsandbytes INT8 / NF4: about half and a quarter of the fp16 bytes, small error
    bnb = summary["bnb"]
    assert bnb["int8"]["weight_dtype"] == "int8"
    assert 0.45 < bnb["int8"]["bytes_ratio_vs_fp16"] < 0.55
    assert 0.2 < bnb["nf4"]["bytes_ratio_vs_fp16"] < 0.3
    assert bnb["int8"]["rel_error_vs_fp16"] < 0.02
    assert bnb["nf4"]["rel_error_vs_fp16"] < 0.2

    # the pipeline's own quantization path, generating at every precision (CUDA: GPT-2-medium sized)
    gen = summary["bnb_generate"]["variants"]
    assert set(gen) == {"fp32", "fp16", "bf16", "int8", "nf4"} and not [v for v, r in gen.items() if "error" in r]
    assert all(r["gen_tokens_per_s"] > 0 for r in gen.values()) and gen["fp32"]["logits_max_abs_diff"] == 0
    assert gen["nf4"]["weight_bytes_vs_fp16"] < gen["int8"]["weight_bytes_vs_fp16"] < 1  # (embeddings stay 16-bit: tiny model)
    assert summary["headline"]["gen_tokens_per_s"]["int8"] == gen["int8"]["gen_tokens_per_s"]

    # multi-GPU data parallelism, dry: 2 gloo processes under torchrun against 1, same batch per process
    ddp = summary["ddp"]
    assert (ddp["processes"], ddp["backend"], ddp["batch_size_per_process"]) == (2, "gloo", 4)
    assert ddp["tokens_per_s_1"] > 0 and ddp["tokens_per_s_n"] > 0
    assert ddp["scaling_efficiency"] == pytest.approx(ddp["speedup"] / 2)
    assert 0 < ddp["allreduce_share_of_step"] < 1 and ddp["params"] == tr["params"]
    assert summary["headline"]["ddp_processes"] == 2


def _dry_model():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_check
    finally:
        sys.path.pop(0)
    from components.core.models.transformer import Transformer, TransformerSettings

    return Transformer(TransformerSettings(**gpu_check.DRY["model"]), gpu_check.DRY["vocab_size"])


def test_full_config_is_gpt2_small():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_check
    finally:
        sys.path.pop(0)
    from components.core.models import meta_parameter_count
    from components.core.models.transformer import Transformer, TransformerSettings

    cfg = gpu_check.FULL
    settings = TransformerSettings(**cfg["model"])
    assert (settings.n_layer, settings.n_head, settings.n_embd, settings.block_size) == (12, 12, 768, 1024)
    assert settings.sdpa_backend == "flash" and cfg["dtype"] == "bfloat16" and cfg["compile"]
    assert 123e6 < meta_parameter_count(Transformer, settings, cfg["vocab_size"]) < 126e6


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_real_run_without_cuda_refuses_clearly(tmp_path):
    proc = run("--out", str(tmp_path / "x.json"))
    assert proc.returncode != 0
    assert "no CUDA GPU here" in proc.stderr and "--dry-run" in proc.stderr
    assert not (tmp_path / "x.json").exists()
