"""A GPT-style Transformer language model (nanoGPT-like), with the switches the ablations need.

token ids → token embedding ([PAD] row zero) + positional encoding → n_layer × Block → LayerNorm → logits.
Block = causal self-attention and a 4× GELU feed-forward network, each wrapped in a residual
connection with LayerNorm before (pre-norm, GPT-2) or after (post-norm, the original Transformer).

Everything selectable lives in `TransformerSettings` (flat, pydantic): positional encoding
(sinusoidal / learned / rope / none), attention implementation (fused SDPA / reference), norm
placement, residual connections on/off, √d score scaling on/off, weight tying, FFN width.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..artifacts import write_json
from ..data import IGNORE_INDEX, PAD_ID, TokenBlocks
from ..errors import ConfigError, PipelineInputError
from ..training import (
    WEIGHTS_FILE, TrainResult, TrainSettings, autocast_context, resolve_device, resolve_dtype, seed_everything, train,
)
from .attention import ATTENTION_IMPLS, SDPA_BACKENDS, CausalSelfAttention, detect_sdpa_backend
from .positional import POSITIONAL_ENCODINGS, build_positional

_CHOICES = {
    "pos_encoding": POSITIONAL_ENCODINGS,
    "attention": ATTENTION_IMPLS,
    "norm": ("pre", "post"),
    "sdpa_backend": ("auto", *SDPA_BACKENDS),
}


class TransformerSettings(BaseModel):
    """The Transformer's shape and switches (vocabulary size comes from the tokenizer at build time)."""

    model_config = ConfigDict(extra="forbid")

    n_layer: int = Field(4, ge=1, description="Number of Transformer blocks.")
    n_head: int = Field(4, ge=1, description="Attention heads per block; n_embd must be divisible by it.")
    n_embd: int = Field(128, ge=1, description="Model width (embedding and residual stream size).")
    block_size: int = Field(64, ge=1, description="Context length in tokens (rows of the learned positional table).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on embeddings, attention weights and residual branches.")
    bias: bool = Field(False, description="Biases in Linear and LayerNorm layers (GPT-2: True; nanoGPT's default False is a bit faster and no worse).")
    pos_encoding: Literal["sinusoidal", "learned", "rope", "none"] = Field(
        "rope",
        description="Positional encoding: rope (rotary; the default: it trains fastest here), learned (GPT-2), "
        "sinusoidal, or none (the ablation).",
    )
    attention: Literal["fused", "reference"] = Field(
        "fused", description="fused: torch SDPA (FlashAttention-class kernels); reference: explicit QKᵀ→mask→softmax→×V."
    )
    norm: Literal["pre", "post"] = Field("pre", description="LayerNorm before each sublayer (pre, GPT-2) or after the residual add (post, original Transformer).")
    residual: bool = Field(True, description="Residual connections around attention and FFN (False is the ablation).")
    scale_scores: bool = Field(True, description="Scale attention scores by 1/sqrt(d_head) (False is the ablation).")
    tie_weights: bool = Field(True, description="Share the token embedding matrix with the output head.")
    ffn_mult: int = Field(4, ge=1, description="FFN hidden width as a multiple of n_embd.")
    sdpa_backend: Literal["auto", "flash", "efficient", "cudnn", "math"] = Field(
        "auto", description="SDPA kernel pinned on CUDA via torch.nn.attention.sdpa_kernel; auto lets torch choose. Ignored on CPU."
    )
    rope_base: float = Field(10000.0, gt=0, description="Base of the rotary / sinusoidal wavelengths.")
    param_budget: Optional[int] = Field(
        None, ge=1, description="If set, n_embd is chosen (a multiple of n_head) so the model's parameter count is closest to this."
    )

    @field_validator("pos_encoding", "attention", "norm", "sdpa_backend", mode="before")
    @classmethod
    def _known_name(cls, v, info):
        # Literal would reject these too; this message names the field and lists the valid names.
        choices = _CHOICES[info.field_name]
        if v not in choices:
            raise ValueError(f"{info.field_name}={v!r} is unknown; use one of: {', '.join(choices)}")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        if self.param_budget is None and self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd={self.n_embd} must be divisible by n_head={self.n_head} (each head gets n_embd/n_head channels)"
            )
        if self.param_budget is None and self.pos_encoding == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError(
                f"pos_encoding='rope' needs an even head size, but n_embd/n_head = {self.n_embd}/{self.n_head} is odd"
            )
        return self

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


class MLP(nn.Module):
    """Position-wise feed-forward network: C → ffn_mult·C → GELU → C."""

    def __init__(self, cfg: TransformerSettings):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, cfg.ffn_mult * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(cfg.ffn_mult * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))  # (B, T, C)


class Block(nn.Module):
    """Attention then FFN, each with a residual connection and a LayerNorm (pre or post)."""

    def __init__(self, cfg: TransformerSettings):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(
            cfg.n_embd, cfg.n_head, dropout=cfg.dropout, bias=cfg.bias, impl=cfg.attention,
            scale_scores=cfg.scale_scores, sdpa_backend=cfg.sdpa_backend,
        )
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)
        self.pre_norm, self.residual = cfg.norm == "pre", cfg.residual

    def forward(self, x: torch.Tensor, rope=None, **attn_kw) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.pre_norm:
            # Pre-norm keeps an un-normalised residual "highway" from input to output: gradients
            # reach the early layers undiminished, which is why deep stacks train without warm-up tricks.
            a, w = self.attn(self.ln_1(x), rope, **attn_kw)  # (B, T, C)
            x = x + a if self.residual else a
            m = self.mlp(self.ln_2(x))  # (B, T, C)
            x = x + m if self.residual else m
        else:
            a, w = self.attn(x, rope, **attn_kw)  # (B, T, C)
            x = self.ln_1(x + a if self.residual else a)
            m = self.mlp(x)  # (B, T, C)
            x = self.ln_2(x + m if self.residual else m)
        return x, w


class Transformer(nn.Module):
    """Decoder-only Transformer LM. forward(idx, targets=None) -> (logits, loss)."""

    def __init__(self, config: TransformerSettings, vocab_size: int):
        super().__init__()
        if vocab_size < 2:
            raise ConfigError(f"vocab_size={vocab_size} is too small; the tokenizer must hold [PAD] and at least one token")
        if config.param_budget is not None:
            config = size_for_budget(config, vocab_size)
        self.config, self.vocab_size = config, vocab_size
        self.model_kind = "transformer"  # recorded in checkpoints; a resume refuses another kind
        C = config.n_embd

        # padding_idx keeps the [PAD] row at zero: its lookup gets no gradient.
        self.wte = nn.Embedding(vocab_size, C, padding_idx=PAD_ID)
        self.pos, self.rope = build_positional(config.pos_encoding, C, config.n_head, config.block_size, config.rope_base)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        # Pre-norm leaves the residual stream un-normalised, so it needs a final LayerNorm; post-norm ends on one.
        self.ln_f = nn.LayerNorm(C, bias=config.bias) if config.norm == "pre" else nn.Identity()
        self.lm_head = nn.Linear(C, vocab_size, bias=False)
        if config.tie_weights:
            # One matrix both embeds tokens and scores them as outputs (Press & Wolf 2017): fewer
            # parameters, and rare tokens' output vectors learn from their input occurrences too.
            self.lm_head.weight = self.wte.weight

        self.apply(self._init_weights)
        # GPT-2: scale the residual projections by 1/√(2·n_layer) so the residual stream's variance
        # does not grow with depth (each block adds two branches).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        with torch.no_grad():
            self.wte.weight[PAD_ID].zero_()

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        causal: bool = True,
        key_padding_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) token ids → (logits (B, T, V), mean cross-entropy over targets != -100, or None).

        `causal=False` lets every position see every other (used by the permutation-equivariance
        check); `key_padding_mask` (B, T), True = real token, masks padded keys explicitly.
        """
        x = self._trunk(idx, causal=causal, key_padding_mask=key_padding_mask)[0]  # (B, T, C)
        logits = self.lm_head(x)  # (B, T, V)
        # [PAD] is never a target, so it is never predicted: -inf keeps its probability at 0 and, with
        # tied weights, keeps the gradient off the [PAD] embedding row (which so stays zero).
        logits[..., PAD_ID] = float("-inf")
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=IGNORE_INDEX)
        return logits, loss

    def _trunk(self, idx: torch.Tensor, need_weights: bool = False, **attn_kw) -> tuple[torch.Tensor, list]:
        B, T = idx.shape
        x = self.wte(idx)  # (B, T, C)
        if self.pos is not None:
            x = x + self.pos(T)  # (B, T, C) + (T, C)
        x = self.drop(x)
        weights = []
        for block in self.h:
            x, w = block(x, self.rope, need_weights=need_weights, **attn_kw)  # (B, T, C)
            weights.append(w)
        return self.ln_f(x), weights  # (B, T, C)

    @torch.no_grad()
    def attention_weights(
        self, idx: torch.Tensor, causal: bool = True, key_padding_mask: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """Per layer, the attention weights (B, nh, T, T) on `idx`, whichever implementation is configured."""
        return self._trunk(idx, need_weights=True, causal=causal, key_padding_mask=key_padding_mask)[1]

    @torch.no_grad()
    def generate(
        self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None
    ) -> torch.Tensor:
        """Append `max_new_tokens` sampled tokens to idx (B, T). temperature <= 0 means greedy."""
        for _ in range(max_new_tokens):
            idx_cond = idx[:, -self.config.block_size :]  # (B, <=block_size) the context the model can see
            logits = self(idx_cond)[0][:, -1, :]  # (B, V) next-token logits
            if temperature <= 0:
                idx_next = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                logits = logits / temperature
                if top_k is not None and top_k < logits.size(-1):
                    kth = torch.topk(logits, top_k).values[:, [-1]]  # (B, 1) k-th largest logit
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)  # (B, 1)
            idx = torch.cat([idx, idx_next], dim=1)  # (B, T+1)
        return idx

    # ----------------------------------------------------------------------------------------------
    # FLOPs and MFU (the PaLM / nanoGPT estimate)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters (tied weights once). non_embedding drops the learned positional table, as nanoGPT
        does; the token embedding stays because, tied, it is also the output layer's matmul."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and self.config.pos_encoding == "learned":
            n -= self.pos.wpe.weight.numel()
        return n

    def flops_per_token(self, T: int | None = None) -> float:
        """Training FLOPs per token: 6N (forward 2N + backward 4N) + 12·L·H·Q·T for the attention scores."""
        T = T or self.config.block_size
        L, H, Q = self.config.n_layer, self.config.n_head, self.config.head_dim
        return float(6 * self.num_params() + 12 * L * H * Q * T)

    def estimate_mfu(self, tokens_per_s: float, device: torch.device | str, T: int | None = None) -> float | None:
        """Model FLOPs utilisation: achieved training FLOP/s over the device's dense bf16 peak. None on CPU
        or on a GPU missing from the peak table."""
        peak = peak_flops(device)
        return None if peak is None else self.flops_per_token(T) * tokens_per_s / peak


# Dense bf16 tensor-core peaks (no sparsity), FLOP/s. First substring match of the device name wins,
# so the more specific names come first.
PEAK_BF16_FLOPS: list[tuple[str, float]] = [
    ("H200", 989e12),
    ("GH200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM
    ("H800", 989e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("RTX 4090", 165e12),
    ("V100", 125e12),  # fp16; V100 has no bf16
]


def peak_flops(device: torch.device | str) -> float | None:
    """Dense bf16 peak FLOP/s of a CUDA device (by name), or None (CPU, unknown GPU)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return peak_flops_for_name(torch.cuda.get_device_name(device))


def peak_flops_for_name(name: str) -> float | None:
    """Dense bf16 peak FLOP/s for a GPU name as torch reports it (e.g. 'NVIDIA H200'), or None."""
    return next((peak for key, peak in PEAK_BF16_FLOPS if key in name), None)


# --------------------------------------------------------------------------------------------------
# Sizing to a parameter budget


def count_params(config: TransformerSettings, vocab_size: int) -> int:
    """Exact parameter count of a model with this config, built on the meta device (no memory used)."""
    with torch.device("meta"):
        model = Transformer(config.model_copy(update={"param_budget": None}), vocab_size)
    return sum(p.numel() for p in model.parameters())


def size_for_budget(config: TransformerSettings, vocab_size: int, budget: int | None = None) -> TransformerSettings:
    """The config with n_embd (a multiple of n_head, even per head for RoPE) whose parameter count is
    closest to `budget` (default: config.param_budget). Depth and heads stay as configured.
    Returns `config` unchanged when there is no budget."""
    budget = budget or config.param_budget
    if not budget:
        return config
    step = config.n_head * (2 if config.pos_encoding == "rope" else 1)

    def params(mult: int) -> int:
        return count_params(config.model_copy(update={"n_embd": mult * step, "param_budget": None}), vocab_size)

    if params(1) > budget:
        raise ConfigError(
            f"param_budget={budget} is below the smallest {config.n_layer}-layer Transformer for vocab_size={vocab_size} "
            f"({params(1)} parameters at n_embd={step}); raise param_budget or lower n_layer/n_head"
        )
    # The count grows monotonically with n_embd: bracket the budget by doubling, then bisect.
    hi = 1
    while params(hi) < budget:
        hi *= 2
    lo = max(1, hi // 2)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if params(mid) < budget else (lo, mid)
    best = min((lo, hi), key=lambda m: abs(params(m) - budget))
    # Validate the chosen shape through the model validators (param_budget kept for the record).
    return TransformerSettings(**{**config.model_dump(), "n_embd": best * step})


# --------------------------------------------------------------------------------------------------
# Weights on disk: safetensors only, with the config in the header


def transformer_metadata(model: Transformer) -> dict[str, str]:
    """The safetensors header metadata that rebuilds `model`: its config and vocabulary size."""
    return {
        "format": "transformer_lm",
        "model_kind": model.model_kind,
        "model_config": model.config.model_dump_json(),
        "vocab_size": str(model.vocab_size),
    }


def save_transformer(model: Transformer, path: str | Path) -> Path:
    """Weights as .safetensors (tied matrices stored once), config in the JSON header."""
    from safetensors.torch import save_model

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(model, str(path), metadata=transformer_metadata(model))
    return path


def load_transformer(path: str | Path, device: str | torch.device = "cpu") -> Transformer:
    """Rebuild a model saved by `save_transformer`, or from a training checkpoint (file or folder):
    both headers carry `model_config` and `vocab_size`. Strict: every tensor must match."""
    from safetensors import safe_open
    from safetensors.torch import load_model

    path = Path(path)
    if path.is_dir():  # a checkpoint folder of the shared training loop
        path = path / WEIGHTS_FILE
    if not path.is_file():
        raise PipelineInputError(f"{path}: no such weights file; materialize the Transformer first")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if "model_config" not in meta or "vocab_size" not in meta:
        raise PipelineInputError(f"{path}: safetensors header lacks model_config/vocab_size; not a Transformer checkpoint")
    if meta.get("model_kind", "transformer") != "transformer":
        raise PipelineInputError(f"{path} holds a {meta['model_kind']!r} model, not a Transformer; point at the Transformer's weights")
    config = TransformerSettings(**json.loads(meta["model_config"]))
    model = Transformer(config, int(meta["vocab_size"]))
    load_model(model, str(path), device=str(device))
    return model.to(device)


# --------------------------------------------------------------------------------------------------
# The `transformer_lm` stage: train through the shared loop, then verify the attention kernel,
# estimate MFU and sample text. Returns numbers, files and figures; the caller logs them.


class SamplingSettings(BaseModel):
    """Text samples drawn from the trained model."""

    model_config = ConfigDict(extra="forbid")

    num_samples: int = Field(3, ge=0, description="Samples to generate after training (0 = none).")
    sample_tokens: int = Field(200, ge=1, description="New tokens per sample.")
    temperature: float = Field(0.8, ge=0.0, description="Softmax temperature; 0 = greedy.")
    top_k: Optional[int] = Field(50, ge=1, description="Sample among the k most likely tokens only (None = all).")
    sample_prompt: str = Field(
        "", description="Prompt text (needs an encoder); empty = the first prompt_tokens tokens of validation blocks."
    )
    prompt_tokens: int = Field(8, ge=1, description="Tokens of a validation block used as the prompt when sample_prompt is empty.")
    sample_seed: int = Field(1234, description="Seed of the sampler.")


@dataclass
class TransformerLMResult:
    metrics: dict[str, float]  # headline numbers (the shared loop's names plus mfu, flops_per_token, ...)
    config: TransformerSettings  # as trained (n_embd resolved from param_budget)
    weights_path: Path  # checkpoint/model.safetensors, config and vocabulary in its header
    samples: list[str]
    samples_path: Path
    attention_backend: dict  # what detect_sdpa_backend observed (or the reference path)
    warnings: list[str]
    history: list[dict]
    train_result: TrainResult
    figures: dict[str, Figure] = field(default_factory=dict)


def attention_backend_report(model: Transformer, device: torch.device, dtype: torch.dtype, T: int) -> dict:
    """The attention path the model runs on `device`: for `fused`, the SDPA kernel observed running."""
    cfg = model.config
    if cfg.attention == "reference":
        return {"implementation": "reference", "observed": "reference (explicit QKᵀ·softmax·V)", "error": None}
    requested = cfg.sdpa_backend if device.type == "cuda" else "auto"  # pinning applies on CUDA only
    report = detect_sdpa_backend(device, dtype, (1, cfg.n_head, T, cfg.head_dim), requested)
    report["implementation"] = "fused"
    if cfg.sdpa_backend != "auto" and device.type != "cuda":
        report["note"] = f"sdpa_backend={cfg.sdpa_backend!r} is pinned on CUDA only; on {device.type} torch chose the kernel"
    return report


def train_transformer_lm(
    model_settings: TransformerSettings,
    train_settings: TrainSettings,
    train_data: TokenBlocks,
    val_data: TokenBlocks,
    vocab_size: int,
    out_dir: str | Path,
    *,
    sampling: SamplingSettings | None = None,
    decode: Callable[[list[int]], str] | None = None,
    encode: Callable[[str], list[int]] | None = None,
    log_metrics: Callable[[dict[str, float], int], None] | None = None,
    resume: bool = True,
    model_meta: dict | None = None,
) -> TransformerLMResult:
    """Build the Transformer, train it with the shared loop, verify the SDPA kernel, report MFU, sample text.

    `decode`/`encode` turn token ids into text and back (the tokenizer's); without `decode` samples
    are space-separated ids. `model_meta` goes into the checkpoint header (e.g. tokenizer_sha256).
    """
    sampling = sampling or SamplingSettings()
    out_dir = Path(out_dir)
    seed_everything(train_settings.seed)  # the same init on every run of these settings
    model = Transformer(model_settings, vocab_size)
    device, _ = resolve_device(train_settings.device)
    dtype = resolve_dtype(train_settings.dtype, device)
    T = min(train_settings.block_size or model.config.block_size, model.config.block_size, train_data.block_size)

    # Verify the attention kernel before training: a pinned backend this GPU cannot run fails now, clearly.
    backend = attention_backend_report(model, device, dtype, T)
    if backend.get("error") and device.type == "cuda":
        raise ConfigError(f"{backend['error']}; set sdpa_backend='auto' or pick one of {[k for k, ok in backend['available'].items() if ok]}")

    result = train(
        model, train_data, val_data, train_settings, out_dir,
        log_metrics=log_metrics, resume=resume, model_meta=model_meta,
    )
    notes = list(result.warnings)
    if backend.get("note"):
        notes.append(backend["note"])

    metrics = result.metrics()
    metrics["flops_per_token"] = float(model.flops_per_token(T))
    metrics["params_non_embedding"] = float(model.num_params())
    mfu = model.estimate_mfu(result.tokens_per_s, device, T)
    if mfu is not None:
        metrics["mfu"] = mfu
    elif device.type == "cuda":
        notes.append(f"MFU not reported: {torch.cuda.get_device_name(device)} is not in the peak-FLOPs table")

    samples = sample_texts(model, val_data, sampling, device, dtype, decode=decode, encode=encode)
    samples_path = out_dir / "samples.txt"
    samples_path.write_text("\n\n----------\n\n".join(samples) + "\n", encoding="utf-8")
    write_json(out_dir / "samples.json", {"settings": sampling.model_dump(), "samples": samples})
    write_json(out_dir / "attention_backend.json", backend)

    figures = dict(result.figures)  # the loop's loss curve
    x_vis = torch.from_numpy(val_data.x[:1, : min(32, T)].astype(np.int64)).to(device)  # (1, t)
    figures["attention_maps"] = plot_attention_maps(model, x_vis, decode=decode)
    return TransformerLMResult(
        metrics=metrics,
        config=model.config,
        weights_path=result.checkpoint_dir / WEIGHTS_FILE,
        samples=samples,
        samples_path=samples_path,
        attention_backend=backend,
        warnings=notes,
        history=result.history,
        train_result=result,
        figures=figures,
    )


@torch.no_grad()
def sample_texts(
    model: Transformer,
    val_data: TokenBlocks,
    s: SamplingSettings,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    *,
    decode: Callable[[list[int]], str] | None = None,
    encode: Callable[[str], list[int]] | None = None,
) -> list[str]:
    """`s.num_samples` continuations: of `s.sample_prompt` if given (needs `encode`), else of the first
    tokens of successive validation blocks (real text the model has not trained on)."""
    if s.num_samples == 0:
        return []
    if s.sample_prompt:
        if encode is None:
            raise ConfigError("sample_prompt is set but no tokenizer encoder was given; pass encode= or clear sample_prompt")
        ids = encode(s.sample_prompt)
        if not ids:
            raise ConfigError(f"sample_prompt={s.sample_prompt!r} encodes to no tokens; use another prompt")
        prompts = [ids] * s.num_samples
    else:
        rows = [i % val_data.n_blocks for i in range(s.num_samples)]
        prompts = [[int(t) for t in val_data.x[r, : s.prompt_tokens] if t != PAD_ID] or [int(val_data.x[r, 0])] for r in rows]
    decode = decode or (lambda ids: " ".join(map(str, ids)))
    was_training = model.training
    model.eval().to(device)
    gen = torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
    texts = []
    with gen:
        torch.manual_seed(s.sample_seed)
        for p in prompts:
            idx = torch.tensor([p], dtype=torch.long, device=device)  # (1, t)
            with autocast_context(device, dtype):
                out = model.generate(idx, s.sample_tokens, temperature=s.temperature, top_k=s.top_k)  # (1, t+n)
            texts.append(decode(out[0].tolist()))
    model.train(was_training)
    return texts


# --------------------------------------------------------------------------------------------------
# Figures (matplotlib Figure objects, no pyplot state)


@torch.no_grad()
def plot_attention_maps(
    model: Transformer, idx: torch.Tensor, *, decode: Callable[[list[int]], str] | None = None, max_heads: int = 4
) -> Figure:
    """Attention weights of every layer (rows) and the first heads (columns) on one sequence idx (1, t)."""
    weights = model.attention_weights(idx)  # n_layer × (1, nh, t, t)
    L, H = len(weights), min(max_heads, model.config.n_head)
    labels = [decode([int(t)]) if decode else str(int(t)) for t in idx[0]]
    fig = Figure(figsize=(2.6 * H, 2.6 * L), layout="constrained")
    axes = fig.subplots(L, H, squeeze=False)
    for layer, w in enumerate(weights):
        for head in range(H):
            ax = axes[layer][head]
            ax.imshow(w[0, head].float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"layer {layer} head {head}", fontsize=8)
            ticks = range(len(labels))
            ax.set_xticks(ticks, labels, fontsize=5, rotation=90)
            ax.set_yticks(ticks, labels, fontsize=5)
    fig.suptitle("attention weights (query rows → key columns)")
    return fig
