"""What a model at some precision holds and computes: its weights' bytes per kind of tensor, its
logits, its summed cross-entropy (components/core/export/precision.py converts the models)."""

from __future__ import annotations

from typing import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from .bnb_layers import bnb_nn, int8_scales, quant_state
from .precision import eager, is_quantized_layer


def _layer_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors a (quantized or float) layer holds itself, quantization state included."""
    if is_quantized_layer(module):
        w = module.weight
        yield "weight", w.data
        if isinstance(module, bnb_nn().Linear8bitLt):
            scb = int8_scales(module)
            if scb is not None:
                yield "scale", scb
        else:
            qs = quant_state(w)
            yield "scale", qs.absmax
            yield "codebook", qs.code
            if qs.nested:
                yield "scale", qs.state2.absmax
                yield "codebook", qs.state2.code
                yield "scale", qs.offset
        if module.bias is not None:
            yield "bias", module.bias.data
        return
    for p in module.parameters(recurse=False):
        yield "param", p.data
    for name, b in module.named_buffers(recurse=False):
        if name not in module._non_persistent_buffers_set:
            yield "buffer", b


def weight_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes the model's weights take in memory, each storage counted once (a tied matrix, a code
    book shared between layers): total; within the quantized layers (codes + scales + code books +
    biases) and what those layers would take in FP16; their codes, scales and code books apart;
    parameters quantized and kept float."""
    seen: set[tuple[int, int, torch.dtype]] = set()
    out = {
        "total": 0,
        "quantized_layers": 0,
        "quantized_layers_fp16": 0,
        "quantized_params": 0,
        "float_params": 0,
        "codes": 0,
        "scales": 0,
        "codebooks": 0,
    }
    for module in model.modules():
        q = is_quantized_layer(module)
        if q:
            n = module.in_features * module.out_features + (module.out_features if module.bias is not None else 0)
            out["quantized_layers_fp16"] += 2 * n
            out["quantized_params"] += module.in_features * module.out_features
        for kind, t in _layer_tensors(module):
            key = (t.data_ptr(), t.numel(), t.dtype)
            if key in seen:
                continue
            seen.add(key)
            nbytes = t.numel() * t.element_size()
            out["total"] += nbytes
            if q:
                out["quantized_layers"] += nbytes
                if kind == "weight":
                    out["codes"] += nbytes
                elif kind == "scale":
                    out["scales"] += nbytes
                elif kind == "codebook":
                    out["codebooks"] += nbytes
            if not q or kind == "bias":
                out["float_params"] += t.numel()
    return out


@torch.no_grad()
def logits_of(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """float32 logits of `idx` (B, T) through the model contract `model(idx) -> (logits, loss)`."""
    with eager():
        return model(idx)[0].float()


def cross_entropy_sum(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> tuple[float, int]:
    """(sum of the cross-entropy over real targets, their count), computed in float32."""
    loss = F.cross_entropy(
        logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=ignore_index, reduction="sum"
    )
    return float(loss), int((targets != ignore_index).sum())
