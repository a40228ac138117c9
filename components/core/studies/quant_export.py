"""The quantization study's files: each variant written as an export folder, rebuilt from that
folder alone and checked against the exported model, with its load times (`export_and_verify`);
and the "parameters × bytes per parameter" arithmetic checked against the weights files actually
written (`weights_arithmetic`). The variants themselves are built and measured by
`studies.quantization.quantize_and_measure`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..data import Blocks, TokenBlocks
from ..errors import ConfigError
from ..export.folder import ExportInfo, export_model, load_export, load_weights, read_header
from ..export.generation import generate, load_benchmark
from ..export.measure import logits_of
from ..export.precision_spec import BITS, QUANT_VARIANTS, VARIANTS
from .quant_measure import _fmt_bytes, _max_abs_diff, check_variants, eval_blocks, evaluate

if TYPE_CHECKING:  # drawn only when plotted: matplotlib is imported by the plot functions
    from matplotlib.figure import Figure

    from .quant_settings import QuantizationSettings


# --------------------------------------------------------------------------------------------------
# Export folders, their reload check and load times


class ExportSettings(BaseModel):
    """Which variants become export folders, their generation defaults, and the reload/load-time checks."""

    model_config = ConfigDict(extra="forbid")

    variants: list[str] = Field(
        default=list(VARIANTS), description=f"Variants to export as folders, of {', '.join(VARIANTS)}."
    )
    max_new_tokens: int = Field(default=64, ge=1, description="generation_config.json: new tokens per generation.")
    temperature: float = Field(
        default=0.8, ge=0.0, description="generation_config.json: softmax temperature (0 = greedy)."
    )
    top_k: Optional[int] = Field(
        default=50, ge=1, description="generation_config.json: sample among the k most likely tokens (None = all)."
    )
    load_repeats: int = Field(
        default=5, ge=1, description="Timed loads per file (safetensors vs torch.load); the median is reported."
    )
    sample_prompt: str = Field(default="The", description="Prompt of the sample generated from each reloaded folder.")
    sample_tokens: int = Field(default=30, ge=1, description="New tokens of that sample.")
    sample_seed: int = Field(default=0, description="Seed of that sample.")

    @field_validator("variants")
    @classmethod
    def _variants(cls, v: list[str]) -> list[str]:
        return check_variants(v)


@dataclass
class ExportReport:
    exports: dict[str, ExportInfo]  # variant -> the folder written
    rows: list[dict]  # per variant: sizes, reload check, load times
    samples: dict[str, str]  # variant -> text generated from the reloaded folder
    metrics: dict[str, float]
    markdown: str

    @property
    def all_reloads_pass(self) -> bool:
        return all(r["reload_ok"] for r in self.rows)


def export_and_verify(
    weights: Mapping[str, str | Path],
    out_root: str | Path,
    *,
    tokenizer_path: str | Path,
    tokenizer_sha256: str,
    model_config: dict,
    train_settings: dict,
    provenance: dict,
    val_data: Blocks,
    eval_settings: QuantizationSettings,
    settings: ExportSettings,
    study_val_loss: dict[str, float] | None = None,
    device: str | torch.device = "cpu",
) -> ExportReport:
    """For each variant (its weights file from `quantize_and_measure`): write the export folder
    `out_root/<variant>`, rebuild the model from that folder alone, and check it reproduces the
    exported model — logits bit for bit for the float variants; for the quantized ones the same
    evaluation (validation loss on the study's blocks, logits difference reported) — then time the
    safetensors load against torch.load and generate a sample from the folder."""
    dev = torch.device(device)
    out_root = Path(out_root)
    missing = [v for v in settings.variants if v not in weights]
    if missing:
        raise ConfigError(
            f"variants {missing} were not built by quantized_models (it built {sorted(weights)}); add them to its "
            f"variants or drop them here"
        )
    generation = {
        "max_new_tokens": settings.max_new_tokens,
        "temperature": settings.temperature,
        "top_k": settings.top_k,
    }
    exports, rows, samples = {}, [], {}
    for variant in settings.variants:
        model = load_weights(weights[variant], dev)
        blocks = eval_blocks(model, val_data, eval_settings.eval_batches * eval_settings.batch_size)
        fixed = torch.from_numpy(blocks.x[: eval_settings.logit_blocks].astype(np.int64)).to(dev)
        info = export_model(
            model,
            variant,
            out_root / variant,
            tokenizer_path=tokenizer_path,
            config=model_config,
            train_settings=train_settings,
            provenance=provenance,
            tokenizer_sha256=tokenizer_sha256,
            generation=generation,
        )
        loaded = load_export(info.path, dev)
        reloaded = loaded[0]
        reload = _reload_figures(
            variant, model, reloaded, fixed, blocks, eval_settings.batch_size, dev, (study_val_loss or {}).get(variant)
        )
        times = load_benchmark(info.path / "model.safetensors", repeats=settings.load_repeats, device=dev)
        gen = generate(
            info.path,
            settings.sample_prompt,
            max_new_tokens=settings.sample_tokens,
            seed=settings.sample_seed,
            loaded=loaded,
        )
        samples[variant] = settings.sample_prompt + gen.text
        exports[variant] = info
        rows.append(
            {
                "variant": variant,
                "scheme": info.scheme,
                "folder_bytes": sum(f["bytes"] for f in info.files.values()),
                "weights_bytes": info.weights_bytes,
                "header_bytes": info.header_bytes,
                **reload,
                **_load_time_figures(times),
                "sample_tokens_per_s": gen.new_tokens / max(gen.seconds, 1e-9),
            }
        )
    metrics = _export_metrics(rows)
    return ExportReport(
        exports=exports, rows=rows, samples=samples, metrics=metrics, markdown=export_markdown(rows, samples)
    )


def _reload_figures(
    variant: str,
    model: torch.nn.Module,
    reloaded: torch.nn.Module,
    fixed: torch.Tensor,
    blocks: TokenBlocks,
    batch_size: int,
    dev: torch.device,
    study: float | None,
) -> dict[str, Any]:
    """The model rebuilt from the folder against the exported one: the logits on the fixed batch
    (bit for bit for a float variant), the validation loss of both (the same, for a quantized one),
    beside the loss the study measured (`study`), and whether the reload passes its criterion."""
    a, b = logits_of(model, fixed), logits_of(reloaded, fixed)
    bit_exact = bool(torch.equal(a, b))
    ev_a = evaluate(model, blocks, batch_size, dev)
    ev_b = evaluate(reloaded, blocks, batch_size, dev)
    same_eval = abs(ev_a["val_loss"] - ev_b["val_loss"]) <= 1e-6 * max(1.0, abs(ev_a["val_loss"]))
    quantized = variant in QUANT_VARIANTS
    return {
        "reload_logits_max_abs_diff": _max_abs_diff(b, a),
        "reload_bit_exact": bit_exact,
        "exported_val_loss": ev_a["val_loss"],
        "reloaded_val_loss": ev_b["val_loss"],
        "study_val_loss": study,
        "study_val_loss_rel_diff": abs(ev_b["val_loss"] - study) / abs(study) if study else None,
        "reload_ok": bool(same_eval if quantized else bit_exact),
        "criterion": "same validation loss" if quantized else "bit-exact logits",
    }


def _load_time_figures(times: dict[str, float]) -> dict[str, float]:
    """`load_benchmark`'s seconds as milliseconds (onto the GPU too where it timed that), and the
    memory-mapped safetensors load's speed-up over torch.load."""
    return {
        "safetensors_mmap_ms": 1e3 * times["safetensors_mmap_s"],
        "safetensors_load_file_ms": 1e3 * times["safetensors_load_file_s"],
        "torch_load_ms": 1e3 * times["torch_load_s"],
        "torch_load_mmap_ms": 1e3 * times["torch_load_mmap_s"],
        **(
            {
                "safetensors_to_gpu_ms": 1e3 * times["safetensors_to_gpu_s"],
                "torch_load_to_gpu_ms": 1e3 * times["torch_load_to_gpu_s"],
            }
            if "safetensors_to_gpu_s" in times
            else {}
        ),
        "load_speedup_vs_torch_load": times["speedup_mmap_vs_torch_load"],
    }


def _export_metrics(rows: list[dict]) -> dict[str, float]:
    """Per variant: the weights file's bytes, the reload's logit difference and verdict, the load times."""
    metrics: dict[str, float] = {}
    for r in rows:
        for k in (
            "weights_bytes",
            "reload_logits_max_abs_diff",
            "safetensors_mmap_ms",
            "torch_load_ms",
            "load_speedup_vs_torch_load",
        ):
            metrics[f"export/{r['variant']}/{k}"] = float(r[k])
        metrics[f"export/{r['variant']}/reload_ok"] = float(r["reload_ok"])
    return metrics


def export_markdown(rows: list[dict], samples: dict[str, str]) -> str:
    lines = [
        "| variant | folder | model.safetensors | reload | max abs Δlogit | val loss (exported / reloaded) | "
        "safetensors mmap | torch.load | speed-up |",
        "|" + "---|" * 9,
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {_fmt_bytes(r['folder_bytes'])} | {_fmt_bytes(r['weights_bytes'])} | "
            f"{'ok' if r['reload_ok'] else 'FAILED'} ({r['criterion']}) "
            f"| {r['reload_logits_max_abs_diff']:.3g} | {r['exported_val_loss']:.5f} / {r['reloaded_val_loss']:.5f} "
            f"| {r['safetensors_mmap_ms']:.2f} ms | {r['torch_load_ms']:.2f} ms | "
            f"{r['load_speedup_vs_torch_load']:.1f}× |"
        )
    lines += ["", "Samples generated from each reloaded folder:", ""]
    lines += [f"- **{v}**: {t[:300]!r}" for v, t in samples.items()]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Weights arithmetic


REFERENCE_SIZES: dict[str, float] = {
    "GPT-2 small": 124e6,
    "1.3B": 1.3e9,
    "7B": 7e9,
    "13B": 13e9,
    "70B": 70e9,
}
PRECISION_BYTES = {"FP32": 4.0, "FP16": 2.0, "INT8": 1.0, "INT4": 0.5}
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def file_accounting(path: str | Path) -> dict[str, Any]:
    """Split a weights file written by `save_weights` into what the arithmetic predicts and the rest:
    codes of the quantized layers, their scales (SCB, absmax, nested absmax), code books and packed
    quantization state, float tensors, and the header — from the safetensors header alone (plus the
    small packed-state tensors, read for the layers' shapes)."""
    import json

    from safetensors import safe_open

    path = Path(path)
    header, header_bytes = read_header(path)
    meta = header.get("__metadata__", {}) or {}
    spec = json.loads(meta.get("quantization", "{}"))
    variant = meta.get("variant", "")
    modules = set(spec.get("modules", []))
    parts = {"codes": 0, "scales": 0, "codebooks": 0, "float": 0}
    q_params = f_params = 0
    float_bytes_per_param: dict[str, int] = {}
    states: list[str] = []
    for k, v in header.items():
        if k == "__metadata__":
            continue
        nbytes = v["data_offsets"][1] - v["data_offsets"][0]
        numel = int(np.prod(v["shape"])) if v["shape"] else 1
        layer = next((m for m in modules if k.startswith(m + ".")), None)
        leaf = k[len(layer) + 1 :] if layer else ""
        if layer and leaf == "weight":
            parts["codes"] += nbytes
            if variant == "int8":
                q_params += numel
        elif layer and leaf in ("SCB", "weight.absmax", "weight.nested_absmax"):
            parts["scales"] += nbytes
        elif layer and leaf != "bias":
            parts["codebooks"] += nbytes
            if "quant_state" in leaf:
                states.append(k)
        else:
            parts["float"] += nbytes
            f_params += numel
            float_bytes_per_param[v["dtype"]] = float_bytes_per_param.get(v["dtype"], 0) + numel
    if states:
        with safe_open(str(path), framework="pt") as f:
            for k in states:
                shape = json.loads(bytes(f.get_tensor(k).tolist()).decode())["shape"]
                q_params += int(np.prod(shape))
    bits = BITS.get(variant, 32)
    predicted = q_params * bits / 8 + sum(n * DTYPE_BYTES.get(dt, 4) for dt, n in float_bytes_per_param.items())
    size = path.stat().st_size
    return {
        "variant": variant,
        "file_bytes": size,
        "header_bytes": header_bytes,
        **{f"{k}_bytes": v for k, v in parts.items()},
        "quantized_params": q_params,
        "float_params": f_params,
        "params": q_params + f_params,
        "predicted_bytes": predicted,
        "overhead_bytes": size - predicted,
        "overhead_pct": 100.0 * (size - predicted) / predicted if predicted else 0.0,
        # What the overhead does not explain (0 up to half a byte of 4-bit padding): the check on the arithmetic.
        "unexplained_bytes": size - predicted - parts["scales"] - parts["codebooks"] - header_bytes,
        "bits_per_quantized_param": 8 * (parts["codes"] + parts["scales"]) / q_params if q_params else float(bits),
        "bits_per_quantized_param_all": 8 * (parts["codes"] + parts["scales"] + parts["codebooks"]) / q_params
        if q_params
        else float(bits),
        "float_dtypes": ", ".join(sorted(float_bytes_per_param)),
    }


@dataclass
class ArithmeticResult:
    reference_rows: list[dict]
    measured_rows: list[dict]
    metrics: dict[str, float]
    figure: Figure
    markdown: str


def weights_arithmetic(
    files: Mapping[str, Mapping[str, str | Path]], params: dict[str, int], reference: dict[str, float] | None = None
) -> ArithmeticResult:
    """Parameters × bytes per parameter at FP32/FP16/INT8/INT4 for this project's models (`params`:
    name → count) and reference sizes up to 70B, next to the measured bytes of our files (`files`:
    model → variant → .safetensors path), overheads included; measured INT8/NF4 bits per parameter
    (scales included) are carried over to the reference sizes."""
    reference = dict(REFERENCE_SIZES if reference is None else reference)
    measured = []
    for model, by_variant in files.items():
        for _variant, path in by_variant.items():
            acc = file_accounting(path)
            measured.append({"model": model, **acc})
    measured_bits = {}
    for m in measured:
        if m["variant"] in ("int8", "nf4", "fp4") and m["variant"] not in measured_bits:
            measured_bits[m["variant"]] = m["bits_per_quantized_param"]
    ref_rows = []
    for name, n in [*((f"{k} (ours)", v) for k, v in params.items()), *reference.items()]:
        row: dict[str, Any] = {"model": name, "params": int(n)}
        for prec, b in PRECISION_BYTES.items():
            row[f"{prec}_GB"] = n * b / 1e9
        for v, bits in measured_bits.items():
            row[f"{v}_measured_bits_GB"] = n * bits / 8 / 1e9
        ref_rows.append(row)
    metrics: dict[str, float] = {}
    for r in ref_rows:
        key = r["model"].replace(" (ours)", "").replace(" ", "_")
        for prec in PRECISION_BYTES:
            metrics[f"arith/{key}/{prec}_GB"] = r[f"{prec}_GB"]
    for m in measured:
        metrics[f"arith/{m['model']}/{m['variant']}/overhead_pct"] = m["overhead_pct"]
        metrics[f"arith/{m['model']}/{m['variant']}/bits_per_quantized_param"] = m["bits_per_quantized_param"]
        metrics[f"arith/{m['model']}/{m['variant']}/file_bytes"] = float(m["file_bytes"])
    return ArithmeticResult(
        reference_rows=ref_rows,
        measured_rows=measured,
        metrics=metrics,
        figure=plot_arithmetic(ref_rows),
        markdown=arithmetic_markdown(ref_rows, measured, measured_bits),
    )


def arithmetic_markdown(ref_rows: list[dict], measured: list[dict], bits: dict[str, float]) -> str:
    lines = [
        "| model | parameters | FP32 | FP16 | INT8 | INT4 |"
        + "".join(f" {v} at measured {b:.3f} bits |" for v, b in bits.items()),
        "|" + "---|" * (6 + len(bits)),
    ]
    for r in ref_rows:
        cells = [f"{r[f'{p}_GB']:.4g} GB" for p in PRECISION_BYTES] + [
            f"{r[f'{v}_measured_bits_GB']:.4g} GB" for v in bits
        ]
        lines.append(f"| {r['model']} | {r['params']:,} | " + " | ".join(cells) + " |")
    seventy = next((r for r in ref_rows if r["model"] == "70B"), None)
    if seventy:
        lines += [
            "",
            f"70B parameters × 2 bytes = {seventy['FP16_GB']:.0f} GB in FP16 (the article's \"70B ≈ 140 GB\"); "
            f"INT8 {seventy['INT8_GB']:.0f} GB, INT4 {seventy['INT4_GB']:.0f} GB before scales"
            + (
                f", {seventy['nf4_measured_bits_GB']:.1f} GB at NF4's measured {bits['nf4']:.3f} bits per weight"
                if "nf4" in bits
                else ""
            )
            + ".",
        ]
    lines += [
        "",
        "Our files: predicted (quantized params × bits/8 + float params × their dtype's bytes) against the bytes on "
        "disk.",
        "",
        "| model | variant | params (quantized / float) | predicted | on disk | overhead | of which scales | code "
        "books + state | header | unexplained | bits per quantized weight (+code books) |",
        "|" + "---|" * 11,
    ]
    for m in measured:
        lines.append(
            f"| {m['model']} | {m['variant']} | {m['quantized_params']:,} / {m['float_params']:,} "
            f"({m['float_dtypes']}) | {m['predicted_bytes']:,.0f} | {m['file_bytes']:,} "
            f"| {m['overhead_bytes']:+,.0f} ({m['overhead_pct']:+.1f} %) | {m['scales_bytes']:,} | "
            f"{m['codebooks_bytes']:,} | {m['header_bytes']:,} | {m['unexplained_bytes']:g} "
            f"| {m['bits_per_quantized_param']:.3f} ({m['bits_per_quantized_param_all']:.3f}) |"
        )
    return "\n".join(lines)


def plot_arithmetic(ref_rows: list[dict]) -> Figure:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4))
    ax = fig.subplots()
    names = [r["model"] for r in ref_rows]
    x = np.arange(len(names))
    width = 0.8 / len(PRECISION_BYTES)
    for i, p in enumerate(PRECISION_BYTES):
        ax.bar(x + (i - (len(PRECISION_BYTES) - 1) / 2) * width, [r[f"{p}_GB"] for r in ref_rows], width, label=p)
    ax.set_yscale("log")
    ax.set_xticks(x, names, rotation=20, fontsize=8)
    ax.set_ylabel("GB of weights")
    ax.set_title("parameters × bytes per parameter")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
