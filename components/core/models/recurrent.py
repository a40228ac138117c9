"""Recurrent language models: an Elman RNN and an LSTM, embedding -> recurrent layers -> output head.

A recurrent model reads a sequence one step at a time and carries everything it knows in a
fixed-size state: h_t = f(W_ih x_t + W_hh h_{t-1} + b). That is why its cost per token is constant
(no attention over the past) and also why it cannot be parallelised over time: step t needs h_{t-1}.

Two LSTM implementations, selected by `lstm_impl`:
- "torch": `nn.LSTM` (fused kernels, the fast path);
- "explicit": `ExplicitLSTM`, the same equations written out step by step, so the gates can be read
  (and their mean activations logged). Its parameters are named and laid out exactly like
  `nn.LSTM`'s (`weight_ih_l{k}`, `weight_hh_l{k}`, `bias_ih_l{k}`, `bias_hh_l{k}`, gate rows in the
  order i, f, g, o), so one state dict loads into either.

Parameter counts (V = vocab, E = n_embd, H = hidden_size, L = n_layer, G = 1 for the RNN, 4 for the
LSTM; the input of layer 0 is E wide, of the others H):
    embedding         V * E
    layer k           G*H*in_k + G*H*H + 2*G*H        (two bias vectors, as in nn.RNN / nn.LSTM)
    projection        H * E    only when tie_weights and H != E
    output head       H * V    untied (no bias); 0 when tied to the embedding
`size_for_budget` picks the width for a parameter budget (counting the built model, not the formula).
"""

from __future__ import annotations

import math
from typing import Literal, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..data import IGNORE_INDEX, PAD_ID
from ..errors import ConfigError
from .sizing import count_parameters
from .sizing import size_for_budget as _size_for_budget

State = torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # RNN: h (L, B, H); LSTM: (h, c), each (L, B, H)


class RecurrentSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cell: Literal["rnn", "lstm"] = Field(default="lstm", description="Recurrent cell: 'rnn' (Elman) or 'lstm'.")
    lstm_impl: Literal["torch", "explicit"] = Field(
        default="torch",
        description="LSTM implementation: 'torch' = nn.LSTM (fast); 'explicit' = gates written out "
        "step by step (slower, logs mean gate activations). Same weights either way.",
    )
    n_embd: int = Field(default=128, ge=1, description="Token embedding width E.")
    hidden_size: int = Field(default=256, ge=1, description="Recurrent state width H.")
    n_layer: int = Field(default=1, ge=1, description="Number of stacked recurrent layers.")
    dropout: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="Dropout on embeddings, between layers and before the head (0 = off)."
    )
    tie_weights: bool = Field(
        default=False,
        description="Share the embedding matrix with the output head; when hidden_size != n_embd a "
        "linear projection H -> E is inserted before the head.",
    )
    block_size: Optional[int] = Field(
        default=None,
        ge=1,
        description="Context it trains and is scored on (the truncated-backpropagation length): the labels' blocks "
        "are cropped to it. None = the labels' block_size (data.context_length).",
    )
    nonlinearity: Literal["tanh", "relu"] = Field(
        default="tanh", description="Elman RNN nonlinearity (ignored for the LSTM)."
    )
    param_budget: Optional[int] = Field(
        default=None,
        ge=1,
        description="When set, `size_for_budget` picks hidden_size (and n_embd, keeping their ratio) so the "
        "total parameter count for the vocabulary is as close as possible to this number.",
    )

    @model_validator(mode="after")
    def _impl_only_for_lstm(self) -> "RecurrentSettings":
        if self.cell == "rnn" and self.lstm_impl != "torch":
            raise ValueError("lstm_impl='explicit' applies to cell='lstm' only; set cell='lstm' or lstm_impl='torch'")
        return self


# ----------------------------------------------------------------------------------------------
# Explicit LSTM


def lstm_cell(
    x_proj: torch.Tensor, h: torch.Tensor, c: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One LSTM step. `x_proj` = W_ih x_t + b_ih, precomputed for all t (it does not depend on h).

    Returns (h_t, c_t, gates) where gates (B, 4H) holds the activations i, f, g, o.
    """
    z = x_proj + h @ w_hh.t() + b_hh  # (B, 4H) pre-activations, rows in nn.LSTM's order i, f, g, o
    zi, zf, zg, zo = z.chunk(4, dim=-1)  # each (B, H)
    i = torch.sigmoid(zi)  # input gate: how much of the candidate to write
    f = torch.sigmoid(zf)  # forget gate: how much of the old cell to keep
    g = torch.tanh(zg)  # candidate cell content
    o = torch.sigmoid(zo)  # output gate: how much of the cell to expose
    c_t = f * c + i * g  # (B, H) the additive cell path is what lets gradients survive long distances
    h_t = o * torch.tanh(c_t)  # (B, H)
    return h_t, c_t, torch.cat([i, f, g, o], dim=-1)


class ExplicitLSTM(nn.Module):
    """A multi-layer, batch-first LSTM with the cell written out; a drop-in for `nn.LSTM`.

    Records the mean input, forget and output gate activations of every forward pass in training
    mode (summed until `pop_gate_stats` reads and resets them), for logging.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, dropout: float = 0.0):
        super().__init__()
        self.input_size, self.hidden_size, self.num_layers, self.dropout = input_size, hidden_size, num_layers, dropout
        for k in range(num_layers):
            in_k = input_size if k == 0 else hidden_size
            self.register_parameter(f"weight_ih_l{k}", nn.Parameter(torch.empty(4 * hidden_size, in_k)))
            self.register_parameter(f"weight_hh_l{k}", nn.Parameter(torch.empty(4 * hidden_size, hidden_size)))
            self.register_parameter(f"bias_ih_l{k}", nn.Parameter(torch.empty(4 * hidden_size)))
            self.register_parameter(f"bias_hh_l{k}", nn.Parameter(torch.empty(4 * hidden_size)))
        self.reset_parameters()
        self._gate_sum = torch.zeros(3)  # running sums of mean i, f, o over recorded forwards
        self._gate_n = 0

    def reset_parameters(self) -> None:
        # nn.LSTM's initialisation: every weight and bias U(-1/sqrt(H), 1/sqrt(H)).
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None):
        B, T, _ = x.shape
        if state is None:
            zeros = x.new_zeros(self.num_layers, B, self.hidden_size)
            state = (zeros, zeros)
        h0, c0 = state  # each (L, B, H)
        h_n, c_n, gate_means = [], [], []
        for k in range(self.num_layers):
            w_ih, w_hh = getattr(self, f"weight_ih_l{k}"), getattr(self, f"weight_hh_l{k}")
            b_ih, b_hh = getattr(self, f"bias_ih_l{k}"), getattr(self, f"bias_hh_l{k}")
            # The input projection has no time dependency: one matmul for all steps.
            x_proj = x @ w_ih.t() + b_ih  # (B, T, 4H)
            h, c = h0[k], c0[k]  # (B, H)
            outs, gates = [], []
            for t in range(T):  # the part that cannot run in parallel: step t needs h_{t-1}
                h, c, g = lstm_cell(x_proj[:, t], h, c, w_hh, b_hh)
                outs.append(h)
                gates.append(g)
            x = torch.stack(outs, dim=1)  # (B, T, H) input of the next layer
            if self.training and self.dropout > 0 and k < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)  # between layers only, like nn.LSTM
            h_n.append(h)
            c_n.append(c)
            if self.training:
                gate_means.append(torch.stack(gates).detach().float().mean(dim=(0, 1)))  # (4H,)
        if gate_means:
            H = self.hidden_size
            m = torch.stack(gate_means).mean(0)  # (4H,) averaged over layers, steps and batch
            self._gate_sum = self._gate_sum.to(m.device) + torch.stack(
                [m[:H].mean(), m[H : 2 * H].mean(), m[3 * H :].mean()]
            )
            self._gate_n += 1
        return x, (torch.stack(h_n), torch.stack(c_n))

    def pop_gate_stats(self) -> dict[str, float]:
        """Mean gate activations since the last call (empty when nothing was recorded)."""
        if self._gate_n == 0:
            return {}
        i, f, o = (self._gate_sum / self._gate_n).tolist()
        self._gate_sum.zero_()
        self._gate_n = 0
        return {"lstm/gate_input": i, "lstm/gate_forget": f, "lstm/gate_output": o}


# ----------------------------------------------------------------------------------------------
# The language model


class RecurrentLM(nn.Module):
    """embedding -> recurrent layers -> (projection) -> output head.

    Contract shared with the Transformer: `forward(idx, targets=None) -> (logits, loss)` with the
    loss a cross-entropy that ignores targets equal to -100. Each block starts from a zero state.
    """

    def __init__(self, config: RecurrentSettings, vocab_size: int):
        super().__init__()
        if vocab_size < 2:
            raise ConfigError(f"vocab_size must be >= 2, got {vocab_size}")
        if config.param_budget is not None:
            raise ConfigError(
                f"param_budget={config.param_budget} is not resolved into a width yet; size the settings first "
                "(components.core.lm.resolve_settings or models.recurrent.size_for_budget), then build"
            )
        self.config, self.vocab_size = config, vocab_size
        self.model_kind = f"recurrent-{config.cell}"  # recorded in checkpoints; resume refuses another kind
        E, H, L, p = config.n_embd, config.hidden_size, config.n_layer, config.dropout

        self.wte = nn.Embedding(vocab_size, E, padding_idx=PAD_ID)
        self.drop = nn.Dropout(p)
        inter = p if L > 1 else 0.0  # nn.RNN warns when inter-layer dropout is set on a single layer
        if config.cell == "rnn":
            self.rnn = nn.RNN(E, H, L, nonlinearity=config.nonlinearity, batch_first=True, dropout=inter)
        elif config.lstm_impl == "torch":
            self.rnn = nn.LSTM(E, H, L, batch_first=True, dropout=inter)
        else:
            self.rnn = ExplicitLSTM(E, H, L, dropout=inter)
        self.proj = nn.Linear(H, E, bias=False) if config.tie_weights and H != E else None
        self.lm_head = nn.Linear(E if config.tie_weights else H, vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.wte.weight  # one (V, E) matrix reads and writes tokens
            # A tied embedding is also the output matrix: unit-variance rows would give logits of
            # std ~sqrt(E) at init, so scale like a linear layer instead.
            nn.init.normal_(self.wte.weight, std=E**-0.5)
        with torch.no_grad():
            self.wte.weight[PAD_ID].zero_()

    # -- pieces, reused by generation, the gradient study and the cost measurement -------------

    @property
    def is_lstm(self) -> bool:
        return self.config.cell == "lstm"

    def init_state(self, batch_size: int, device=None, dtype=None) -> State:
        """The zero state every block starts from."""
        w = self.wte.weight
        h = torch.zeros(
            self.config.n_layer, batch_size, self.config.hidden_size, device=device or w.device, dtype=dtype or w.dtype
        )
        return (h, h.clone()) if self.is_lstm else h

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        return self.drop(self.wte(idx))  # (B, T, E)

    def recur(self, emb: torch.Tensor, state: State | None = None) -> tuple[torch.Tensor, State]:
        """Run the recurrent layers over (B, T, E); returns top-layer outputs (B, T, H) and the final state."""
        return self.rnn(emb, state)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        h = self.drop(h)
        if self.proj is not None:
            h = self.proj(h)  # (..., E)
        return self.lm_head(h)  # (..., V)

    def forward_hidden(self, idx: torch.Tensor, state: State | None = None) -> tuple[torch.Tensor, State]:
        """Top-layer hidden states (B, T, H) for all positions and the state after the last one."""
        return self.recur(self.embed(idx), state)

    # -- the contract ------------------------------------------------------------------------

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        h, _ = self.forward_hidden(idx)  # (B, T, H)
        logits = self.head(h)  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)
        return logits, loss

    def pop_gate_stats(self) -> dict[str, float]:
        """Mean LSTM gate activations since the last call (explicit LSTM only; else {})."""
        return self.rnn.pop_gate_stats() if isinstance(self.rnn, ExplicitLSTM) else {}

    def flops_per_token(self, T: int | None = None) -> float:
        """Training FLOPs per token, 6N (forward 2N + backward 4N) over the N parameters in matmuls:
        all but an untied embedding, which is a table lookup (tied, it is also the head's matmul).
        The same at any context length T: a recurrent step does not look back."""
        lookup = 0 if self.config.tie_weights else self.wte.weight.numel()
        return float(6 * (count_parameters(self) - lookup))

    # -- generation: prefill once, then one step per token, carrying the state ---------------

    @torch.no_grad()
    def step(self, idx_t: torch.Tensor, state: State | None) -> tuple[torch.Tensor, State]:
        """One token per sequence (B,) -> next-token logits (B, V) and the new state."""
        out, state = self.recur(self.embed(idx_t[:, None]), state)  # out (B, 1, H)
        return self.head(out[:, -1]), state

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue (B, T) prompts by `max_new_tokens` tokens; temperature 0 = greedy."""
        was_training = self.training
        self.eval()
        out, state = self.forward_hidden(idx)  # prefill: the whole prompt in one call
        logits = self.head(out[:, -1])  # (B, V)
        new = []
        for _ in range(max_new_tokens):
            nxt = sample_next(logits, temperature, top_k, generator)  # (B,)
            new.append(nxt)
            logits, state = self.step(nxt, state)  # O(1) in the context length
        self.train(was_training)
        return torch.cat([idx, torch.stack(new, dim=1)], dim=1) if new else idx


def sample_next(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Next token ids (B,) from logits (B, V): greedy at temperature 0, else top-k sampling."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = F.softmax(logits, dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


# ----------------------------------------------------------------------------------------------
# Sizing by parameter budget


def require_recurrent(model: nn.Module, what: str) -> RecurrentLM:
    """`model` as a RecurrentLM; any other model is a ConfigError naming `what` needs one."""
    if not isinstance(model, RecurrentLM):
        raise ConfigError(f"{what} needs a recurrent LM, not a {type(model).__name__}")
    return model


def size_for_budget(config: RecurrentSettings, vocab_size: int) -> RecurrentSettings:
    """Settings whose parameter count is closest to `config.param_budget` for this vocabulary, with
    param_budget then None (resolved). The width is scaled while the ratio hidden_size / n_embd of
    `config` is kept (so n_embd == hidden_size stays equal, e.g. for tied weights); depth, cell and
    the rest are unchanged. Returns `config` unchanged when no budget is set.
    """
    if config.param_budget is None:
        return config
    ratio = config.hidden_size / config.n_embd
    return _size_for_budget(
        config,
        vocab_size,
        RecurrentLM,
        lambda h: {"hidden_size": h, "n_embd": max(1, round(h / ratio))},
        budget=config.param_budget,
        what=f"{config.cell} model",
    )
