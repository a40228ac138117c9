"""What a precision is: the variants' names, dtypes and bits, the scheme names written into
config.json and the safetensors header, and `PrecisionSpec`, everything needed to rebuild a model
at a precision from its float architecture. The vocabulary of `export.precision`.
"""

from __future__ import annotations

import json
from typing import Any, Literal, get_args

import torch
from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigError

Variant = Literal["fp32", "fp16", "bf16", "int8", "nf4", "fp4"]
VARIANTS: tuple[Variant, ...] = get_args(Variant)
DtypeName = Literal["float32", "bfloat16", "float16"]
DTYPES: dict[DtypeName, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FLOAT_VARIANTS: dict[str, DtypeName] = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
QUANT_VARIANTS: tuple[Variant, ...] = ("int8", "nf4", "fp4")
# The scheme names written into config.json and the safetensors header.
SCHEMES: dict[str, str] = {
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "int8": "bitsandbytes-llm.int8",
    "nf4": "bitsandbytes-nf4",
    "fp4": "bitsandbytes-fp4",
}
VARIANT_OF_SCHEME = {v: k for k, v in SCHEMES.items()}
BITS: dict[str, float] = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8, "nf4": 4, "fp4": 4}
PRECISION_ATTR = "precision_spec"  # the PrecisionSpec a converted model carries


class PrecisionSpec(BaseModel):
    """Everything needed to rebuild a model at this precision from its float architecture (recorded
    in config.json under `quantization`, and in the safetensors header)."""

    model_config = ConfigDict(extra="forbid")

    variant: Variant
    scheme: str
    keep_dtype: DtypeName = "float32"  # dtype of every tensor that is not quantized
    compute_dtype: DtypeName = "float32"  # 4-bit matmul dtype
    int8_threshold: float = 6.0
    blocksize: int = 64
    double_quant: bool = True
    modules: list[str] = Field(default_factory=list)  # quantized Linear layers, qualified names
    recurrent_as_linear: list[str] = Field(default_factory=list)  # recurrent modules rewritten as LinearRecurrence
    kept_float: list[str] = Field(default_factory=list)  # what stays float, and why
    aliases: dict[str, str] = Field(default_factory=dict)  # tied tensor name -> the stored name
    # Embeddings tied to a quantized output head: embedding module -> head layer whose codes it reads
    # (its rows dequantized on lookup; the matrix is stored once, quantized).
    embeddings_from_head: dict[str, str] = Field(default_factory=dict)

    @property
    def quantized(self) -> bool:
        return self.variant in QUANT_VARIANTS


def scheme_variant(scheme: str, where: str) -> str:
    """The variant of a scheme name; an unknown one is a ConfigError naming where it was found."""
    if scheme not in VARIANT_OF_SCHEME:
        raise ConfigError(
            f"{where}: unknown quantization scheme {scheme!r}; known schemes: {', '.join(SCHEMES.values())}"
        )
    return VARIANT_OF_SCHEME[scheme]


def describe(spec: PrecisionSpec | None) -> dict[str, Any]:
    """A JSON-ready summary of a spec (for tables and config.json)."""
    return json.loads(spec.model_dump_json()) if spec is not None else {}
