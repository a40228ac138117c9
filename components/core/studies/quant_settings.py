"""Quantization's settings and limits (`QuantizationSettings`, the INT8/NF4 size and perplexity limits):
a leaf module, imported by the study (`quantization`) and the export (`quant_export`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..device import DeviceSetting
from ..export.precision_spec import VARIANTS, DtypeName
from .quant_measure import check_variants

BASELINE = "fp32"
INT8_SIZE_LIMIT = 0.55  # INT8 codes + scales ≤ 0.55 × the same layers in FP16
NF4_SIZE_LIMIT = 0.30
INT8_PPL_LIMIT_PCT = 1.0  # perplexity increase over FP32, percent
NF4_PPL_LIMIT_PCT = 5.0
INT8_MODEL_LIMIT = 0.60  # the whole INT8 model in memory ≤ 0.60 × the whole FP16 model (the article: about half)
NF4_MODEL_LIMIT = 0.35  # the whole NF4 model ≤ 0.35 × FP16 (the article: about a quarter)
BLOCKSIZES = (64, 128, 256, 512, 1024, 2048, 4096)


class QuantizationSettings(BaseModel):
    """Which precisions, and how each is measured."""

    model_config = ConfigDict(extra="forbid")

    # list[str], checked against the one `Variant` Literal: Dagster's config schema has no list-of-Literal type.
    variants: list[str] = Field(
        default=list(VARIANTS),
        description=f"Precisions to build and measure, of {', '.join(VARIANTS)}; fp32 (the baseline) must be among "
        f"them.",
    )
    compute_dtype: DtypeName = Field(
        default="float32", description="dtype the 4-bit layers (nf4, fp4) compute their matmuls in."
    )
    keep_dtype: DtypeName = Field(
        default="float16",
        description="dtype of what the quantized variants keep unquantized (norms, biases; the embedding when not "
        "quantized).",
    )
    quantize_embedding: bool = Field(
        default=True,
        description="Quantize the output head tied to the token embedding too (the embedding reads its rows from the "
        "head's codes).",
    )
    int8_threshold: float = Field(
        default=6.0,
        ge=0.0,
        description="LLM.int8 outlier threshold: input columns with a value above it are multiplied in 16 bit (0 = all "
        "int8).",
    )
    blocksize: int = Field(
        default=64, description="Weights per absmax block of the 4-bit variants (64 … 4096, a power of two)."
    )
    double_quant: bool = Field(
        default=True, description="Quantize the 4-bit absmax scales to 8 bit too (QLoRA's double quantization)."
    )
    eval_batches: int = Field(
        default=8, ge=1, description="Validation batches evaluated per variant (the first blocks, deterministic)."
    )
    batch_size: int = Field(default=8, ge=1, description="Blocks per evaluation batch.")
    logit_blocks: int = Field(
        default=2, ge=1, description="Blocks of the fixed batch whose logits are compared with FP32."
    )
    prompt_tokens: int = Field(
        default=16, ge=1, description="Prompt length for the generation timing (from the first validation block)."
    )
    gen_tokens: int = Field(
        default=32, ge=1, description="New tokens generated per timed generation (greedy, batch 1)."
    )
    repeats: int = Field(default=3, ge=1, description="Timed generations per variant; the median is reported.")
    device: DeviceSetting = Field(default="auto", description="Where to run: 'auto' = CUDA if present, else the CPU.")

    @field_validator("variants")
    @classmethod
    def _variants(cls, v: list[str]) -> list[str]:
        check_variants(v)
        if BASELINE not in v:
            raise ValueError(f"variants must include {BASELINE!r}: every change is measured against it (got {v})")
        return [BASELINE, *[x for x in v if x != BASELINE]]

    @field_validator("blocksize")
    @classmethod
    def _blocksize(cls, v: int) -> int:
        if v not in BLOCKSIZES:
            raise ValueError(f"blocksize must be one of {BLOCKSIZES}, got {v}")
        return v

    def precision_kwargs(self) -> dict[str, Any]:
        return {
            "keep_dtype": self.keep_dtype,
            "compute_dtype": self.compute_dtype,
            "int8_threshold": self.int8_threshold,
            "blocksize": self.blocksize,
            "double_quant": self.double_quant,
            "quantize_embedding": self.quantize_embedding,
        }
