"""A model at another precision: FP32, FP16, BF16, or its Linear layers as bitsandbytes layers.

Variants (one name each, used everywhere: settings, tables, export folders):

    fp32  float32 baseline            fp16 / bf16  every tensor cast to that dtype
    int8  LLM.int8() (`bnb.nn.Linear8bitLt`, has_fp16_weights=False): int8 weights, one float32
          scale per output row (SCB), outlier input columns above `int8_threshold` kept in 16 bit
    nf4 / fp4  `bnb.nn.Linear4bit`: two 4-bit codes per byte, one absmax per `blocksize` weights
          (itself quantized to 8 bit when `double_quant`), a 16-entry code book; the matmul runs in
          `compute_dtype`

What is quantized: every `nn.Linear` whose weight is not shared with another module. A tied output
head (the Transformer's `lm_head` *is* its token embedding) stays a float embedding, like the
embeddings, LayerNorms and biases, in `keep_dtype`, unless `quantize_embedding`: then the head is
quantized like any Linear layer and the embedding becomes a `HeadTiedEmbedding` that dequantizes
the rows it looks up from the head's codes (the matrix stored once, quantized; the [PAD] row zero). Recurrent layers
(`nn.LSTM`, `nn.RNN`, the
explicit LSTM) hold their matrices as raw parameters used by fused kernels or hand-written matmuls,
which bitsandbytes cannot replace; for the quantized variants they are first rewritten as
`LinearRecurrence` (the same equations with W_ih and W_hh as `nn.Linear` layers), so their matrices
are quantized too. A GRU, or any other module, stays float (and `kept_float` says so).

One code path for CPU and CUDA: the bitsandbytes layers are built on the CPU and quantized by
`.to(device)` (bitsandbytes ≥ 0.45 ships CPU kernels for both layer types). On CPUs with AVX512-BF16
bitsandbytes repacks 4-bit weights on their first forward pass into a CPU-only layout (and re-derives
the absmax scales when saving, lossily); that repacking is switched off here, so the stored tensors
are exactly the ones the layer computes with and a saved model reloads bit for bit (measured: no
speed difference on this project's layer sizes). bitsandbytes also `torch.compile`s its generic
CPU fallbacks (a 4-bit layer with an odd number of inputs, e.g. the LSTM's 113-wide embedding):
~20 s of compiling per shape on two cores, more than the whole study, so forward passes here run
inside `eager()` (torch.compiler.set_stance("force_eager")). bitsandbytes' native CPU dequantization
(0.50) gets a 4-bit matrix wrong when its rows are not whole 64-weight blocks (the default
Transformer is 144 wide): such layers and the tied embedding dequantize the same codes block by block
here (`bnb_layers.dequantize_4bit`, `bnb_layers.linear4bit_class`); the stored tensors are unchanged.

Serialization (`precision_state_dict`): bitsandbytes' own state-dict layout, i.e. what Hugging Face
`transformers` writes for bnb models — `<layer>.weight` (int8 / packed uint8), `<layer>.SCB`;
`<layer>.weight.absmax`, `.quant_map`, `.nested_absmax`, `.nested_quant_map` and
`.quant_state.bitsandbytes__nf4` (the non-tensor part of `QuantState.as_dict(packed=True)`, a JSON
blob stored as a uint8 tensor). No pickles anywhere. `apply_precision` rebuilds the layers from
those tensors (`Params4bit.from_prequantized`, `Int8Params` with CB/SCB) given the same
`PrecisionSpec`.
"""

from __future__ import annotations

import copy
import functools
import math
from typing import TYPE_CHECKING, TypeGuard

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ConfigError, PipelineInputError
from .bnb_layers import bnb, bnb_nn, bnb_param, dequantize_4bit, int8_scales, linear4bit_class
from .linear_recurrence import _set_submodule, rewrite_recurrent
from .precision_spec import (
    DTYPES,
    FLOAT_VARIANTS,
    PRECISION_ATTR,
    QUANT_VARIANTS,
    SCHEMES,
    VARIANTS,
    PrecisionSpec,
    Variant,
)

if TYPE_CHECKING:
    from bitsandbytes.nn.modules import Linear4bit, Linear8bitLt

__all__ = [
    "HeadTiedEmbedding",
    "apply_precision",
    "check_backend",
    "check_shapes",
    "eager",
    "expected_shapes",
    "is_quantized_layer",
    "precision_state_dict",
    "spec_of",
    "to_precision",
]


# --------------------------------------------------------------------------------------------------
# Forward passes and the backend probe


@functools.cache
def eager():
    """Context for forward passes of converted models: torch.compile'd functions run eagerly (see the
    module docstring)."""
    return torch.compiler.set_stance("force_eager")


_PROBED: dict[tuple[str, str], str | None] = {}


def check_backend(variant: str, device: torch.device | str) -> None:
    """Refuse, clearly, a bitsandbytes build that cannot run `variant` on `device`: quantize and run a
    64×64 layer there once (cached) and turn any failure into a ConfigError naming the setting."""
    if variant not in QUANT_VARIANTS:
        return
    device = torch.device(device)
    key = (variant, device.type)
    if key not in _PROBED:
        lib = bnb()
        try:
            with torch.random.fork_rng(devices=[]), eager():
                torch.manual_seed(0)
                layer = _quantized_linear(variant, nn.Linear(64, 64), _probe_spec(variant), device)
                with torch.no_grad():
                    out = layer(torch.randn(2, 64, device=device))
            if not torch.isfinite(out).all():
                raise RuntimeError("non-finite output from a 64x64 test layer")
            _PROBED[key] = None
        except Exception as e:
            _PROBED[key] = f"bitsandbytes {getattr(lib, '__version__', '?')}: {type(e).__name__}: {e}"
    if _PROBED[key]:
        raise ConfigError(
            f"variants: {variant!r} needs bitsandbytes' {'8-bit' if variant == 'int8' else '4-bit'} kernels on "
            f"{device.type}, which this build cannot run ({_PROBED[key]}). Install a bitsandbytes build with the "
            f"{device.type} backend, run on another device, or remove {variant!r} from `variants`"
        )


def _probe_spec(variant: Variant) -> PrecisionSpec:
    return PrecisionSpec(variant=variant, scheme=SCHEMES[variant])


# --------------------------------------------------------------------------------------------------
# Building quantized layers


def _quantized_linear(
    variant: str,
    linear: nn.Linear | None,
    spec: PrecisionSpec,
    device: torch.device,
    *,
    shape: tuple[int, ...] | None = None,
    bias: torch.Tensor | None = None,
    tensors: dict[str, torch.Tensor] | None = None,
) -> nn.Module:
    """A bitsandbytes layer on `device`: quantized from `linear`'s float weights, or (tensors given)
    rebuilt from stored quantized tensors (keys relative to the layer: weight, SCB, weight.absmax, …)."""
    lib = bnb_nn()
    if shape is None:
        if linear is None:
            raise ValueError("a quantized layer needs the float layer it replaces, or its shape")
        shape = tuple(linear.weight.shape)
    out_f, in_f = shape
    has_bias = (bias is not None) if linear is None else (linear.bias is not None)
    if linear is not None and linear.bias is not None:
        bias = linear.bias.detach().clone()
    if variant == "int8":
        layer = lib.Linear8bitLt(in_f, out_f, bias=has_bias, has_fp16_weights=False, threshold=spec.int8_threshold)
        if tensors is None:
            layer.weight = bnb_param(lib.Int8Params, _float_weight(linear), requires_grad=False, has_fp16_weights=False)
        else:
            cb = tensors["weight"]
            layer.weight = bnb_param(
                lib.Int8Params, cb, requires_grad=False, has_fp16_weights=False, CB=cb, SCB=tensors["SCB"]
            )
    else:
        layer = linear4bit_class()(
            in_f,
            out_f,
            bias=has_bias,
            compute_dtype=DTYPES[spec.compute_dtype],
            compress_statistics=spec.double_quant,
            quant_type=variant,
            quant_storage=torch.uint8,
        )
        if tensors is None:
            layer.weight = bnb_param(
                lib.Params4bit,
                _float_weight(linear),
                requires_grad=False,
                blocksize=spec.blocksize,
                compress_statistics=spec.double_quant,
                quant_type=variant,
                quant_storage=torch.uint8,
                module=layer,
            )
        else:
            stats = {k[len("weight.") :]: v for k, v in tensors.items() if k.startswith("weight.")}
            layer.weight = lib.Params4bit.from_prequantized(
                data=tensors["weight"], quantized_stats=stats, requires_grad=False, device="cpu", module=layer
            )
        # Keep the stored layout (see the module docstring): no CPU-only repacking on first forward.
        layer.support_avx512bf16_for_cpu = False
    if has_bias:
        assert bias is not None  # given, or copied from `linear` above
        layer.bias = nn.Parameter(bias.to(DTYPES[spec.keep_dtype]), requires_grad=False)
    return layer.to(device)  # quantizes (float weights) or moves (stored tensors)


def _float_weight(linear: nn.Linear | None) -> torch.Tensor:
    """A float32 copy of the weight a layer is quantized from."""
    if linear is None:
        raise ValueError("a quantized layer is quantized from its float layer or rebuilt from stored tensors")
    return linear.weight.detach().float().clone()


class HeadTiedEmbedding(nn.Module):
    """A token embedding whose matrix is a quantized output head's weight (weight tying, quantized):
    a lookup dequantizes the rows it needs (INT8: codes × row scale / 127; 4-bit: the whole matrix
    through `dequantize_4bit`, then the rows). It holds no tensor of its own; the head
    is referenced, not registered, so the state dict stores the matrix once, as the head's codes."""

    _head: nn.Module

    def __init__(self, head: nn.Module, padding_idx: int | None, dtype: torch.dtype):
        super().__init__()
        object.__setattr__(self, "_head", head)  # not a submodule: stored and counted once, as the head
        self.padding_idx, self.dtype = padding_idx, dtype

    def matrix(self) -> torch.Tensor:
        """The dequantized (V, C) matrix."""
        head = self._head
        if isinstance(head, bnb_nn().Linear8bitLt):
            scb = int8_scales(head)
            assert scb is not None  # a quantized int8 layer holds its scales
            return (head.weight.data.float() * (scb.float().unsqueeze(1) / 127.0)).to(self.dtype)
        with eager():
            return dequantize_4bit(head.weight).to(self.dtype)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        head = self._head
        if isinstance(head, bnb_nn().Linear8bitLt):
            scb = int8_scales(head)
            assert scb is not None  # a quantized int8 layer holds its scales
            x = head.weight.data[idx].float() * (scb[idx].float().unsqueeze(-1) / 127.0)
        else:
            x = F.embedding(idx, self.matrix().float())
        if self.padding_idx is not None:  # the [PAD] row stays exactly zero, as in the float model
            x = x.masked_fill((idx == self.padding_idx).unsqueeze(-1), 0.0)
        return x.to(self.dtype)


def _tie_embeddings_to_heads(model: nn.Module, pairs: dict[str, str], dtype: torch.dtype) -> None:
    """Replace each embedding of `pairs` (embedding module -> quantized head) by a HeadTiedEmbedding."""
    for emb_name, head_name in pairs.items():
        emb = model.get_submodule(emb_name)
        _set_submodule(
            model, emb_name, HeadTiedEmbedding(model.get_submodule(head_name), getattr(emb, "padding_idx", None), dtype)
        )


def is_quantized_layer(module: nn.Module) -> TypeGuard[Linear8bitLt | Linear4bit]:
    if not any("bitsandbytes" in c.__module__ for c in type(module).__mro__):
        return False
    lib = bnb_nn()
    return isinstance(module, (lib.Linear8bitLt, lib.Linear4bit))


def _tied_linears(model: nn.Module) -> dict[str, str]:
    """Linear layers whose weight is also registered elsewhere (weight tying): name -> the other owner."""
    owners: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name)
    tied = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            others = [n for n in owners.get(id(m.weight), []) if n != f"{name}.weight"]
            if name and others:
                tied[name] = others[0]
    return tied


def to_precision(
    model: nn.Module,
    variant: str,
    *,
    device: torch.device | str = "cpu",
    keep_dtype: str = "float32",
    compute_dtype: str = "float32",
    int8_threshold: float = 6.0,
    blocksize: int = 64,
    double_quant: bool = True,
    quantize_embedding: bool = False,
) -> nn.Module:
    """A copy of `model` at `variant`, in eval mode on `device`, carrying its `PrecisionSpec` as
    `model.precision_spec`. The caller's model is not touched. With `quantize_embedding`, an output
    head tied to the token embedding is quantized like the other Linear layers and the embedding
    reads its rows from the head's codes (`HeadTiedEmbedding`): the matrix stored once, quantized."""
    if variant not in VARIANTS:
        raise ConfigError(f"variant {variant!r} is unknown; use one of: {', '.join(VARIANTS)}")
    device = torch.device(device)
    m = copy.deepcopy(model).cpu().eval()
    for p in m.parameters():
        p.requires_grad_(False)
    if variant in FLOAT_VARIANTS:
        dtype_name = FLOAT_VARIANTS[variant]
        spec = PrecisionSpec(variant=variant, scheme=SCHEMES[variant], keep_dtype=dtype_name, compute_dtype=dtype_name)
        spec.kept_float = [f"every tensor in {dtype_name}"]
        spec.aliases = _aliases(m)
        m = m.to(DTYPES[dtype_name])
        setattr(m, PRECISION_ATTR, spec)
        return m.to(device)

    check_backend(variant, device)
    if keep_dtype not in DTYPES or compute_dtype not in DTYPES:
        raise ConfigError(
            f"keep_dtype={keep_dtype!r}, compute_dtype={compute_dtype!r}: use one of {', '.join(DTYPES)} for each"
        )
    spec = PrecisionSpec(
        variant=variant,
        scheme=SCHEMES[variant],
        keep_dtype=keep_dtype,
        compute_dtype=compute_dtype,
        int8_threshold=int8_threshold,
        blocksize=blocksize,
        double_quant=double_quant,
    )
    spec.recurrent_as_linear = rewrite_recurrent(m)
    tied = _tied_linears(m)
    heads = {}
    if quantize_embedding:  # a head tied to an nn.Embedding: quantize it, and let the embedding read its codes
        heads = {
            n: o.rsplit(".", 1)[0]
            for n, o in tied.items()
            if o.endswith(".weight") and isinstance(m.get_submodule(o.rsplit(".", 1)[0]), nn.Embedding)
        }
        tied = {n: o for n, o in tied.items() if n not in heads}
    linears = {n: mod for n, mod in m.named_modules() if isinstance(mod, nn.Linear) and n not in tied}
    targets = list(linears)
    # Quantize from the float32 weights; everything else goes to keep_dtype first (a bitsandbytes
    # parameter must never be cast: .to(dtype) would turn its integer codes into floats).
    originals = {n: copy.deepcopy(mod).float() for n, mod in linears.items()}
    m = m.to(DTYPES[keep_dtype])
    for name in targets:
        _set_submodule(m, name, _quantized_linear(variant, originals[name], spec, device))
    spec.modules = targets
    spec.embeddings_from_head = {emb: head for head, emb in heads.items()}
    _tie_embeddings_to_heads(m, spec.embeddings_from_head, DTYPES[keep_dtype])
    spec.kept_float = _kept_float(m, tied, spec)
    spec.aliases = _aliases(m)
    setattr(m, PRECISION_ATTR, spec)
    return m.to(device)


def _kept_float(model: nn.Module, tied: dict[str, str], spec: PrecisionSpec) -> list[str]:
    notes = [f"{n} (tied to {o.rsplit('.', 1)[0]}: stays a float embedding)" for n, o in tied.items()]
    quantized = set(spec.modules)
    kinds: dict[str, int] = {}
    for name, mod in model.named_modules():
        if name in quantized or any(name.startswith(q + ".") for q in quantized):
            continue
        own = [p for p in mod.parameters(recurse=False)]
        if own and not isinstance(mod, nn.Linear):
            kinds[type(mod).__name__] = kinds.get(type(mod).__name__, 0) + sum(p.numel() for p in own)
    notes += [f"{k} ({n} params)" for k, n in sorted(kinds.items())]
    if any(is_quantized_layer(m) and m.bias is not None for m in model.modules()):
        notes.append("biases of quantized layers")
    return [f"{n}, in {spec.keep_dtype}" for n in notes]


def _aliases(model: nn.Module) -> dict[str, str]:
    """Tied parameters: every extra name -> the first name (safetensors stores a tensor once)."""
    first: dict[int, str] = {}
    aliases = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    return aliases


def spec_of(model: nn.Module) -> PrecisionSpec | None:
    return getattr(model, PRECISION_ATTR, None)


# --------------------------------------------------------------------------------------------------
# Serialization


def precision_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor needed to rebuild `model` (bitsandbytes' state-dict layout; tied tensors once,
    see `PrecisionSpec.aliases`), as plain contiguous CPU tensors ready for safetensors."""
    spec = spec_of(model)
    aliases = spec.aliases if spec is not None else _aliases(model)
    out = {}
    for k, v in model.state_dict().items():
        if k in aliases or k.endswith("weight_format"):  # weight_format: a constant ("row") bnb re-derives
            continue
        out[k] = v.detach().as_subclass(torch.Tensor).contiguous().cpu()
    return out


def expected_shapes(skeleton: nn.Module, spec: PrecisionSpec) -> dict[str, tuple[int, ...] | None]:
    """Tensor name -> the shape the architecture implies (None: a quantization-state tensor whose
    shape depends on the block layout; its presence is still required)."""
    shapes: dict[str, tuple[int, ...] | None] = {}
    quantized = set(spec.modules)
    for k, v in skeleton.state_dict().items():
        if k in spec.aliases:
            continue
        layer, _, leaf = k.rpartition(".")
        if layer in spec.embeddings_from_head:  # stored once, as its head's codes
            continue
        if layer in quantized and leaf == "weight":
            out_f, in_f = v.shape
            if spec.variant == "int8":
                shapes[k] = (out_f, in_f)
                shapes[f"{layer}.SCB"] = (out_f,)
            else:
                shapes[k] = ((out_f * in_f + 1) // 2, 1)
                n_blocks = math.ceil(out_f * in_f / spec.blocksize)
                shapes[f"{k}.absmax"] = (n_blocks,)
                shapes[f"{k}.quant_map"] = (16,)
                if spec.double_quant:
                    shapes[f"{k}.nested_absmax"] = (math.ceil(n_blocks / 256),)
                    shapes[f"{k}.nested_quant_map"] = (256,)
                shapes[f"{k}.quant_state.bitsandbytes__{spec.variant}"] = None
        else:
            shapes[k] = tuple(v.shape)
    return shapes


def check_shapes(
    skeleton: nn.Module, spec: PrecisionSpec, stored: dict[str, tuple[int, ...]], where: str, config_note: str
) -> None:
    """Compare the stored tensors' shapes (from the safetensors header) with what the architecture implies."""
    expected = expected_shapes(skeleton, spec)
    problems = []
    for k, shape in expected.items():
        if k not in stored:
            problems.append(f"tensor {k!r} is missing")
        elif shape is not None and tuple(stored[k]) != shape:
            problems.append(f"tensor {k!r} has shape {list(stored[k])} but the architecture gives {list(shape)}")
    extra = sorted(set(stored) - set(expected))
    if extra:
        problems.append(f"unexpected tensors {extra[:5]}{' …' if len(extra) > 5 else ''}")
    if problems:
        raise PipelineInputError(
            f"{where} does not match {config_note}: {'; '.join(problems[:6])}{' …' if len(problems) > 6 else ''}. "
            "The weights belong to another model (or config.json was edited); re-export the model"
        )


def apply_precision(
    skeleton: nn.Module, spec: PrecisionSpec, tensors: dict[str, torch.Tensor], device: torch.device | str, where: str
) -> nn.Module:
    """Turn a freshly built float `skeleton` into the stored model: same rewrite and layer types as
    `to_precision`, filled with the stored tensors (nothing re-quantized). Returns it on `device`."""
    device = torch.device(device)
    m = skeleton.cpu().eval()
    for p in m.parameters():
        p.requires_grad_(False)
    full = dict(tensors)
    for alias, name in spec.aliases.items():
        if name in full:
            full[alias] = full[name]
    if not spec.quantized:
        m = m.to(DTYPES[spec.keep_dtype])
        try:
            m.load_state_dict(full, strict=True)
        except RuntimeError as e:
            raise PipelineInputError(f"{where}: the tensors do not fit the architecture ({e})") from e
        setattr(m, PRECISION_ATTR, spec)
        return m.to(device)

    check_backend(spec.variant, device)
    rewrite_recurrent(m, spec.recurrent_as_linear)
    m = m.to(DTYPES[spec.keep_dtype])
    quantized = set(spec.modules)
    for name in spec.modules:
        try:
            lin = m.get_submodule(name)
        except AttributeError:
            lin = None
        if not isinstance(lin, nn.Linear):
            raise PipelineInputError(f"{where}: quantized layer {name!r} is not a Linear layer of this architecture")
        own = {k[len(name) + 1 :]: v for k, v in full.items() if k.startswith(name + ".")}
        layer = _quantized_linear(
            spec.variant,
            None,
            spec,
            torch.device("cpu"),
            shape=tuple(lin.weight.shape),
            bias=own.get("bias"),
            tensors=own,
        )
        _set_submodule(m, name, layer)
    _tie_embeddings_to_heads(m, spec.embeddings_from_head, DTYPES[spec.keep_dtype])
    rest = {
        k: v
        for k, v in full.items()
        if k.rpartition(".")[0] not in quantized and not any(k.startswith(q + ".weight.") for q in quantized)
    }
    missing, unexpected = m.load_state_dict(rest, strict=False)
    missing = [k for k in missing if k.rpartition(".")[0] not in quantized and not k.endswith("weight_format")]
    if missing or unexpected:
        raise PipelineInputError(
            f"{where}: tensors missing {missing[:5]} / unexpected {unexpected[:5]} for this architecture"
        )
    setattr(m, PRECISION_ATTR, spec)
    return m.to(device)
