"""A GPT-style Transformer language model (nanoGPT-like), with the switches the ablations need.

token ids → token embedding ([PAD] row zero) + positional encoding → n_layer × Block → LayerNorm → logits.
Block = causal self-attention and a 4× GELU feed-forward network, each wrapped in a residual
connection with LayerNorm before (pre-norm, GPT-2) or after (post-norm, the original Transformer).

Everything selectable lives in `TransformerSettings` (flat, pydantic): positional encoding
(sinusoidal / learned / rope / none), attention implementation (fused SDPA / reference), norm
placement, residual connections on/off, √d score scaling on/off, weight tying, FFN width.
A `param_budget` is resolved into a width by `size_for_budget` before the model is built.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Literal, Optional, ParamSpec, TypeVar, cast, get_args

import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..data import IGNORE_INDEX, PAD_ID
from ..errors import ConfigError
from .attention import AttentionImpl, CausalSelfAttention, KVCache, SdpaBackend
from .positional import ROPE_LAYOUT, LearnedPositionalEncoding, PositionalEncoding, build_positional
from .sizing import count_parameters
from .sizing import size_for_budget as _size_for_budget

Norm = Literal["pre", "post"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _compile_disabled(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """`torch.compiler.disable(fn)` with fn's signature kept (torch leaves the decorator's result untyped)."""
    return cast(Callable[_P, _R], torch.compiler.disable(fn))


class TransformerSettings(BaseModel):
    """The Transformer's shape and switches (vocabulary size comes from the tokenizer at build time)."""

    model_config = ConfigDict(extra="forbid")

    n_layer: int = Field(default=4, ge=1, description="Number of Transformer blocks.")
    n_head: int = Field(default=4, ge=1, description="Attention heads per block; n_embd must be divisible by it.")
    n_embd: int = Field(default=128, ge=1, description="Model width (embedding and residual stream size).")
    block_size: int = Field(
        default=64, ge=1, description="Context length in tokens (rows of the learned positional table)."
    )
    dropout: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="Dropout on embeddings, attention weights and residual branches."
    )
    bias: bool = Field(
        default=False,
        description="Biases in Linear and LayerNorm layers (GPT-2: True; nanoGPT's default False is a bit faster and "
        "no worse).",
    )
    pos_encoding: PositionalEncoding = Field(
        default="rope",
        description="Positional encoding: rope (rotary; the default: it trains fastest here), learned (GPT-2), "
        "sinusoidal, or none (the ablation).",
    )
    attention: AttentionImpl = Field(
        default="fused",
        description="fused: torch SDPA (FlashAttention-class kernels); reference: explicit QKᵀ→mask→softmax→×V; "
        "sliding_window: each query sees the last `window` keys and the first `n_global` positions (memory N·window).",
    )
    window: int = Field(
        default=64, ge=1, description="Keys each query sees under attention: sliding_window (at most block_size)."
    )
    n_global: int = Field(
        default=0,
        ge=0,
        description="Leading positions every query sees under attention: sliding_window (global tokens; fewer than "
        "block_size).",
    )
    norm: Norm = Field(
        default="pre",
        description="LayerNorm before each sublayer (pre, GPT-2) or after the residual add (post, original "
        "Transformer).",
    )
    residual: bool = Field(
        default=True, description="Residual connections around attention and FFN (False is the ablation)."
    )
    scale_scores: bool = Field(
        default=True, description="Scale attention scores by 1/sqrt(d_head) (False is the ablation)."
    )
    hard_attention: bool = Field(
        default=False,
        description="Each query takes the value of its single top-scoring key (one-hot weights, \"ordering one "
        "dish\"), trained straight-through: the forward pass is hard, the gradient the softmax's (True is the "
        "ablation against soft attention; explicit attention, no fused kernel, no KV cache).",
    )
    tie_weights: bool = Field(default=True, description="Share the token embedding matrix with the output head.")
    ffn_mult: int = Field(default=4, ge=1, description="FFN hidden width as a multiple of n_embd.")
    sdpa_backend: SdpaBackend = Field(
        default="auto",
        description="SDPA kernel pinned on CUDA via torch.nn.attention.sdpa_kernel; auto lets torch choose. Ignored on "
        "CPU.",
    )
    rope_base: float = Field(default=10000.0, gt=0, description="Base of the rotary / sinusoidal wavelengths.")
    param_budget: Optional[int] = Field(
        default=None,
        ge=1,
        description="If set, n_embd is chosen (a multiple of n_head) so the model's parameter count is closest to "
        "this.",
    )

    @field_validator("pos_encoding", "attention", "norm", "sdpa_backend", mode="before")
    @classmethod
    def _known_name(cls, v, info):
        # The Literal rejects these too; this message names the field and lists the valid names.
        choices = get_args(cls.model_fields[info.field_name].annotation)
        if v not in choices:
            raise ValueError(f"{info.field_name}={v!r} is unknown; use one of: {', '.join(choices)}")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        if self.param_budget is None and self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd={self.n_embd} must be divisible by n_head={self.n_head} (each head gets n_embd/n_head "
                f"channels)"
            )
        if self.attention == "sliding_window" and self.window > self.block_size:
            raise ValueError(
                f"window={self.window} is larger than block_size={self.block_size}: the sliding window would be full "
                f"attention"
            )
        if self.attention == "sliding_window" and self.n_global >= self.block_size:
            raise ValueError(f"n_global={self.n_global} global tokens must be fewer than block_size={self.block_size}")
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
            cfg.n_embd,
            cfg.n_head,
            dropout=cfg.dropout,
            bias=cfg.bias,
            impl=cfg.attention,
            scale_scores=cfg.scale_scores,
            sdpa_backend=cfg.sdpa_backend,
            window=cfg.window,
            n_global=cfg.n_global,
            hard=cfg.hard_attention,
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
            raise ConfigError(
                f"vocab_size={vocab_size} is too small; the tokenizer must hold [PAD] and at least one token"
            )
        if config.param_budget is not None:
            raise ConfigError(
                f"param_budget={config.param_budget} is not resolved into a width yet; size the settings first "
                "(components.core.lm.resolve_settings or models.transformer.size_for_budget), then build"
            )
        self.config, self.vocab_size = config, vocab_size
        self.model_kind = "transformer"  # recorded in checkpoints; a resume refuses another kind
        C = config.n_embd

        # padding_idx keeps the [PAD] row at zero: its lookup gets no gradient.
        self.wte = nn.Embedding(vocab_size, C, padding_idx=PAD_ID)
        self.pos, self.rope = build_positional(
            config.pos_encoding, C, config.n_head, config.block_size, config.rope_base
        )
        # Recorded with the weights and checked on every load (checkpoint.load_weights_into): weights
        # trained with another pairing of the rotated channels would load without error and be wrong.
        self.weight_layout = {"rope_layout": ROPE_LAYOUT} if self.rope is not None else {}
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

    @property
    def blocks(self) -> list[Block]:
        """The blocks `h`, in order, typed (indexing the ModuleList gives a plain Module)."""
        return cast("list[Block]", list(self.h))

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
        cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) token ids → (logits (B, T, V), mean cross-entropy over targets != -100, or None).

        `causal=False` lets every position see every other (used by the permutation-equivariance
        check); `key_padding_mask` (B, T), True = real token, masks padded keys explicitly. With
        `cache` (generation), idx continues the positions the cache holds and is appended to it.
        """
        kw: dict[str, Any] = (
            {"causal": causal, "key_padding_mask": key_padding_mask} if cache is None else {"cache": cache}
        )
        x = self._trunk(idx, **kw)[0]  # (B, T, C)
        logits = self.lm_head(x)  # (B, T, V)
        # [PAD] is never a target, so it is never predicted: -inf keeps its probability at 0 and, with
        # tied weights, keeps the gradient off the [PAD] embedding row (which so stays zero).
        logits[..., PAD_ID] = float("-inf")
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=IGNORE_INDEX)
        return logits, loss

    def _trunk(
        self, idx: torch.Tensor, need_weights: bool = False, cache: KVCache | None = None, **attn_kw
    ) -> tuple[torch.Tensor, list]:
        B, T = idx.shape
        offset = cache.length if cache is not None else 0  # positions already in the cache
        x = self._embed(idx) if idx.device.type == "cpu" else self.wte(idx)  # (B, T, C)
        if self.pos is not None:
            x = x + self.pos(T, offset)  # (B, T, C) + (T, C)
        x = self.drop(x)
        weights = []
        for i, block in enumerate(self.h):
            if cache is not None:
                attn_kw = {"cache": cache, "layer": i, "offset": offset}
            x, w = block(x, self.rope, need_weights=need_weights, **attn_kw)  # (B, T, C)
            weights.append(w)
        return self.ln_f(x), weights  # (B, T, C)

    @_compile_disabled
    def _embed(self, idx: torch.Tensor) -> torch.Tensor:
        """The token lookup on the CPU, left out of a torch.compile graph: inductor's C++ backend makes the
        lookup's backward a scatter-add kernel that took ~0.4 ms a step against ATen's ~0.09 ms (baby GPT,
        2-core CPU: the compiled step ran 2 % faster with the lookup eager, benchmarks/train_throughput.py).
        On a GPU the lookup stays in the graph (no graph break)."""
        return self.wte(idx)

    @torch.no_grad()
    def attention_weights(
        self, idx: torch.Tensor, causal: bool = True, key_padding_mask: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """Per layer, the attention weights (B, nh, T, T) on `idx`, whichever implementation is configured."""
        return self._trunk(idx, need_weights=True, causal=causal, key_padding_mask=key_padding_mask)[1]

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Append `max_new_tokens` sampled tokens to idx (B, T). temperature <= 0 means greedy.

        With `use_cache` the prompt is run once and each new token costs one position against the
        KV cache, for as long as the context fits in block_size; beyond it the window slides and
        every token recomputes the last block_size positions, exactly as without the cache (whose
        output this equals)."""
        bs = self.config.block_size
        cache = KVCache(len(self.h)) if use_cache and idx.size(1) <= bs else None
        logits = self(idx[:, -bs:], cache=cache)[0][:, -1, :]  # (B, V) next-token logits
        for i in range(max_new_tokens):
            if i > 0:
                if cache is not None and cache.length < bs:
                    logits = self(idx[:, -1:], cache=cache)[0][:, -1, :]  # one new position
                else:
                    cache = None  # the context slides past block_size: recompute the window
                    logits = self(idx[:, -bs:])[0][:, -1, :]
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
    # FLOPs (the PaLM / nanoGPT estimate)

    def flops_per_token(self, T: int | None = None) -> float:
        """Training FLOPs per token: 6N (forward 2N + backward 4N) + 12·L·H·Q·T for the attention scores.
        N counts every parameter but a learned positional table, as nanoGPT does: the token embedding
        stays because, tied, it is also the output layer's matmul."""
        T = T or self.config.block_size
        L, H, Q = self.config.n_layer, self.config.n_head, self.config.head_dim
        learned = self.pos.wpe.weight.numel() if isinstance(self.pos, LearnedPositionalEncoding) else 0
        N = count_parameters(self) - learned
        return float(6 * N + 12 * L * H * Q * T)


def require_transformer(model: nn.Module, what: str) -> Transformer:
    """`model` as a Transformer; any other model is a ConfigError naming `what` needs one."""
    if not isinstance(model, Transformer):
        raise ConfigError(f"{what} needs a Transformer LM, not a {type(model).__name__}")
    return model


def size_for_budget(config: TransformerSettings, vocab_size: int, budget: int | None = None) -> TransformerSettings:
    """The config with n_embd (a multiple of n_head, even per head for RoPE) whose parameter count is
    closest to `budget` (default: config.param_budget), param_budget then None. Depth and heads stay as
    configured. Returns `config` unchanged when there is no budget."""
    budget = budget or config.param_budget
    if not budget:
        return config
    step = config.n_head * (2 if config.pos_encoding == "rope" else 1)
    return _size_for_budget(
        config,
        vocab_size,
        Transformer,
        lambda m: {"n_embd": m * step},
        budget=budget,
        what=f"{config.n_layer}-layer Transformer",
    )
