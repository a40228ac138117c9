"""The GPU check script: its CPU dry run exercises every section at tiny sizes and writes the summary
(the multi-GPU line as 2 gloo processes); it runs in an environment shaped like the lent GPU machine's
image (no pydantic, no bitsandbytes, no matplotlib, ...); a deadline, a section budget or a SIGTERM
leaves the rows measured so far in the JSON; without a GPU the real run refuses clearly."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
CARRY = ROOT / ".gpu_carry" / "site"

# The project's dependencies that the lent GPU image lacks (pyproject's list minus torch, numpy,
# safetensors, tokenizers): an import of any of them fails there as it does here under the blocker.
NOT_ON_IMAGE = (
    "pydantic",
    "pydantic_core",
    "bitsandbytes",
    "matplotlib",
    "mlflow",
    "dagster",
    "dagster_graphql",
    "datasets",
    "gensim",
    "mwparserfromhell",
    "jieba",
    "scipy",
    "markdown_it",
    "yaml",
)

# Runs the script with those imports failing (a meta-path finder ahead of every other); bitsandbytes
# may still come from the carried copy when ALLOW_CARRY is set.
BLOCKED = """
import importlib.machinery, runpy, sys
BLOCK, CARRY, ALLOW_CARRY = set({block!r}), {carry!r}, {allow!r}
class Blocker:
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top == "bitsandbytes" and ALLOW_CARRY:
            spec = importlib.machinery.PathFinder.find_spec(name, path if "." in name else [CARRY])
            if spec is not None and (spec.origin or "").startswith(CARRY):
                return spec
        if top in BLOCK:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not on the GPU image)")
        return None
sys.meta_path.insert(0, Blocker())
sys.argv = [{script!r}, *sys.argv[1:]]
runpy.run_path({script!r}, run_name="__main__")
"""


def run(
    *args: str, blocked: bool = False, allow_carry: bool = False, timeout: int = 300
) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), *args]
    if blocked:
        code = BLOCKED.format(block=NOT_ON_IMAGE, carry=str(CARRY), allow=allow_carry, script=str(SCRIPT))
        cmd = [sys.executable, "-c", code, *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_dry_run_writes_every_section(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = run("--dry-run", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert json.loads(proc.stdout) == summary  # the same JSON on stdout
    assert summary["dry_run"] is True and "stopped" not in summary
    assert summary["headline"]["errors"] == [], {k: summary[k].get("error") for k in summary["headline"]["errors"]}
    assert summary["headline"]["skipped"] == ["flex"]  # CUDA only
    # the log beside the JSON holds what the run printed
    log = (tmp_path / "gpu_check.log").read_text()
    assert "preflight:" in log and "train: {'step': 6" in log and "done in" in log

    # the SDPA kernel is observed, not assumed
    assert summary["sdpa"]["observed"] == "flash_cpu" and summary["sdpa"]["available"]["flash"]

    # GPT-2-shaped model through the pipeline's own optimizer step, a row per log interval
    tr = summary["train"]
    assert tr["steps"] == 6 and tr["tokens_per_s"] > 0 and tr["device"] == "cpu"
    assert [r["step"] for r in tr["rows"]] == [2, 4, 6] and all(r["tokens_per_s"] > 0 for r in tr["rows"])
    assert tr["params"] == sum(p.numel() for p in _dry_model().parameters())
    assert tr["mfu_datasheet_peak"] is None and tr["mfu_measured_peak"] is None  # no peak for a CPU
    assert tr["observed_in_model"]["sdpa_ops"] == ["flash_cpu"]
    assert tr["config"]["sdpa_backend"] == "flash" and tr["config"]["attention"] == "fused"
    assert summary["matmul_peak"]["tflops"] > 0

    # the sweep doubles N for every implementation
    sw = summary["sweep"]
    for impl in ("reference", "fused", "window"):
        assert [r["n"] for r in sw[impl]["rows"]] == [64, 128, 256, 512], impl
        assert all(r["ms"] > 0 for r in sw[impl]["rows"])
    assert set(sw["speedup"]) == {"64", "128", "256", "512"}
    # peak memory is measured on the CPU too: the reference's (N, N) scores against the fused kernel's O(N)
    ref, fused = ({r["n"]: r["peak_mib"] for r in sw[impl]["rows"]} for impl in ("reference", "fused"))
    assert ref[512] >= 2 * 512 * 512 * 4 / 2**20 and sw["memory_ratio"]["512"] > 3
    assert fused[512] < 2 * fused[256] + 0.1  # linear in N, not quadratic
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
    gen = summary["bnb_generate"]
    assert set(gen["variants"]) == {"fp32", "fp16", "bf16", "int8", "nf4"} and not [
        v for v, r in gen["variants"].items() if "error" in r
    ]
    assert (
        all(r["gen_tokens_per_s"] > 0 for r in gen["variants"].values())
        and gen["variants"]["fp32"]["logits_max_abs_diff"] == 0
    )
    assert gen["variants"]["nf4"]["weight_bytes_vs_fp16"] < gen["variants"]["int8"]["weight_bytes_vs_fp16"] < 1
    assert gen["quantized_keep_dtype"] == gen["quantized_compute_dtype"] == "float32"  # dry run; float16 on CUDA
    assert summary["headline"]["gen_tokens_per_s"]["int8"] == gen["variants"]["int8"]["gen_tokens_per_s"]

    # multi-GPU data parallelism, dry: 2 gloo processes under torchrun against 1, same batch per process
    ddp = summary["ddp"]
    assert (ddp["processes"], ddp["backend"], ddp["batch_size_per_process"]) == (2, "gloo", 4)
    assert ddp["tokens_per_s_1"] > 0 and ddp["tokens_per_s_n"] > 0
    assert ddp["scaling_efficiency"] == pytest.approx(ddp["speedup"] / 2)
    assert 0 < ddp["allreduce_share_of_step"] < 1 and ddp["params"] == tr["params"]
    assert summary["headline"]["ddp_processes"] == 2


@pytest.mark.slow
def test_runs_without_what_the_gpu_image_lacks(tmp_path):
    """No pydantic, bitsandbytes, matplotlib, mlflow, dagster...: the core's settings come from the
    stand-in, the bitsandbytes sections say why they are skipped, everything else measures."""
    out = tmp_path / "gpu_check.json"
    proc = run("--dry-run", "--out", str(out), "--skip", "ddp", blocked=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(out.read_text())
    assert s["preflight"]["pydantic"].startswith("absent") and s["preflight"]["bitsandbytes"].startswith("unavailable")
    assert s["headline"]["errors"] == [], {k: s[k].get("error") for k in s["headline"]["errors"]}
    assert s["headline"]["skipped"] == ["bnb", "flex", "ddp"]
    assert "scripts/gpu_carry.sh" in s["bnb"]["skipped"] and "gpu_carry.sh" in s["bnb_generate"]["int8_nf4_skipped"]
    assert set(s["bnb_generate"]["variants"]) == {"fp32", "fp16", "bf16"}
    assert s["train"]["steps"] == 6 and s["train"]["config"]["n_layer"] == 2
    assert [r["n"] for r in s["sweep"]["fused"]["rows"]] == [64, 128, 256, 512]


@pytest.mark.slow
@pytest.mark.skipif(
    not (CARRY / "bitsandbytes").is_dir(), reason="no carried bitsandbytes here (bash scripts/gpu_carry.sh makes it)"
)
def test_carried_pruned_bitsandbytes_imports_and_quantizes(tmp_path):
    """The pruned copy that travels to the GPU (CPU and CUDA 13 libraries only) is the one imported,
    and its INT8 / NF4 layers run on the CPU."""
    libs = sorted(p.name for p in (CARRY / "bitsandbytes").glob("libbitsandbytes_*.so"))
    assert libs == ["libbitsandbytes_cpu.so", "libbitsandbytes_cuda130.so"]
    assert sum(p.stat().st_size for p in CARRY.rglob("*") if p.is_file()) < 16 * 2**20
    out = tmp_path / "gpu_check.json"
    proc = run("--dry-run", "--out", str(out), "--only", "bnb", blocked=True, allow_carry=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(out.read_text())
    assert s["preflight"]["bitsandbytes_from"].startswith(str(CARRY))
    assert s["bnb"]["int8"]["weight_dtype"] == "int8" and 0.2 < s["bnb"]["nf4"]["bytes_ratio_vs_fp16"] < 0.3


@pytest.mark.slow
def test_deadline_stops_a_section_and_skips_what_no_longer_fits(tmp_path):
    """Train would run 100000 steps: the deadline's budget stops it with its rows saved, and the
    sweep after it is skipped before it starts, saying how much time was left."""
    out = tmp_path / "gpu_check.json"
    t0 = time.monotonic()
    proc = run("--dry-run", "--out", str(out), "--only", "train,sweep", "--steps", "100000", "--deadline-s", "25")
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(out.read_text())
    assert s["train"]["stopped"].startswith("section budget: stopped after") and 2 <= s["train"]["steps"] < 100000
    assert s["train"]["rows"] and s["train"]["rows"][-1]["step"] <= s["train"]["steps"]
    assert "left of the 25 s deadline" in s["sweep"]["skipped"]
    assert s["elapsed_s"] < 25 + 2 and wall < 25 + 45  # + the interpreter's start and exit (a loaded machine)


@pytest.mark.slow
def test_sigterm_writes_the_rows_measured_so_far(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), "--only", "train", "--steps", "100000"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        rows, t0 = [], time.monotonic()
        while len(rows) < 2 and time.monotonic() - t0 < 120:  # rows appear in the file as they are measured
            time.sleep(0.5)
            if out.exists():
                rows = json.loads(out.read_text()).get("train", {}).get("rows", [])
        assert len(rows) >= 2, "no training rows written while the run was going"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    s = json.loads(out.read_text())
    assert s["stopped"].startswith("SIGTERM") and s["train"]["error"] == "interrupted by SIGTERM"
    assert len(s["train"]["rows"]) >= len(rows)
    assert "stopped: SIGTERM" in (tmp_path / "gpu_check.log").read_text()


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
    # the budgets fit the deadline: the sections that must run (all but flex and ddp) fit 7 minutes with room
    assert sum(v for k, v in cfg["budgets"].items() if k not in ("flex", "ddp")) < 420 - 60
    assert len(cfg["flex"]["ns"]) <= 3 and cfg["quant_dtype"] == "float16"


def test_pydantic_stand_in_builds_the_same_settings():
    """scripts/pydantic_lite.py (used only where pydantic is absent) gives the settings pydantic gives,
    and refuses what pydantic refuses, naming the field."""
    code = f"""
import json, sys
sys.path.insert(0, {str(ROOT / 'scripts')!r}); sys.path.insert(0, {str(ROOT)!r})
import pydantic_lite; sys.modules["pydantic"] = pydantic_lite
from components.core.models.transformer import TransformerSettings
from components.core.train_settings import TrainSettings
out = {{"t": TransformerSettings(n_layer=2, n_head=2, n_embd=64, sdpa_backend="flash").model_dump(),
       "s": TrainSettings(max_steps=3, device="cpu", dtype="float32").model_dump(), "errors": []}}
for kw in ({{"n_embd": 10, "n_head": 3}}, {{"attention": "bogus"}}, {{"n_layer": 0}}, {{"nope": 1}}):
    try:
        TransformerSettings(**kw)
    except ValueError as e:
        out["errors"].append(str(e))
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lite = json.loads(proc.stdout)
    from components.core.models.transformer import TransformerSettings
    from components.core.train_settings import TrainSettings

    assert lite["t"] == TransformerSettings(n_layer=2, n_head=2, n_embd=64, sdpa_backend="flash").model_dump()
    assert lite["s"] == TrainSettings(max_steps=3, device="cpu", dtype="float32").model_dump()
    assert len(lite["errors"]) == 4
    assert (
        "divisible" in lite["errors"][0]
        and "bogus" in lite["errors"][1]
        and "n_layer" in lite["errors"][2]
        and "nope" in lite["errors"][3]
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_real_run_without_cuda_refuses_clearly(tmp_path):
    proc = run("--out", str(tmp_path / "x.json"))
    assert proc.returncode != 0
    assert "no CUDA GPU here" in proc.stderr and "--dry-run" in proc.stderr
    assert not (tmp_path / "x.json").exists()
