"""Models at other precisions (FP16, BF16, bitsandbytes INT8 / NF4 / FP4) and self-contained
Hugging Face-style export folders (model.safetensors, config.json, tokenizer.json,
generation_config.json) that reload and generate without the pipeline.

    q = to_precision(model, "nf4")                        # a copy, Linear layers → bitsandbytes
    info = export_model(q, "nf4", "out/nf4", tokenizer_path=..., config=..., train_settings=..., provenance=...)
    model, tokenizer, config = load_export("out/nf4")     # checks hashes, shapes, scheme, backend
    print(generate("out/nf4", "The history of").text)
"""

from .folder import ExportInfo, export_model, load_export, read_header, tensor_shapes
from .generation import Generation, cache_kind, generate, generate_tokens, load_benchmark
from .linear_recurrence import LinearRecurrence
from .measure import logits_of, weight_bytes
from .precision import check_backend, eager, is_quantized_layer, precision_state_dict, spec_of, to_precision
from .precision_spec import BITS, DTYPES, FLOAT_VARIANTS, QUANT_VARIANTS, SCHEMES, VARIANTS, PrecisionSpec, Variant

__all__ = [
    "BITS",
    "DTYPES",
    "FLOAT_VARIANTS",
    "QUANT_VARIANTS",
    "SCHEMES",
    "VARIANTS",
    "ExportInfo",
    "Generation",
    "LinearRecurrence",
    "PrecisionSpec",
    "Variant",
    "cache_kind",
    "check_backend",
    "eager",
    "export_model",
    "generate",
    "generate_tokens",
    "is_quantized_layer",
    "load_benchmark",
    "load_export",
    "logits_of",
    "precision_state_dict",
    "read_header",
    "spec_of",
    "tensor_shapes",
    "to_precision",
    "weight_bytes",
]
