"""Recurrent layers as Linear layers: `LinearRecurrence`, the same RNN/LSTM equations with W_ih
and W_hh as `nn.Linear` layers, so that bitsandbytes can quantize them (`rewrite_recurrent`).
Used by `export.precision`.
"""

from __future__ import annotations

from typing import Literal, cast

import torch
import torch.nn as nn

from ..errors import ConfigError, PipelineInputError


class LinearRecurrence(nn.Module):
    """A batch-first, unidirectional RNN/LSTM stack with its matmuls as `nn.Linear` layers:
    ih[k]: in_k → G·H (bias b_ih), hh[k]: H → G·H (bias b_hh), G = 4 (LSTM, gates i, f, g, o as in
    nn.LSTM) or 1 (Elman RNN). Same equations, weights and state layout as `nn.LSTM` / `nn.RNN`,
    so it is a drop-in whose Linear layers can become quantized layers."""

    def __init__(
        self,
        cell: Literal["lstm", "rnn"],
        input_size: int,
        hidden_size: int,
        num_layers: int,
        nonlinearity: str = "tanh",
    ):
        super().__init__()
        G = 4 if cell == "lstm" else 1
        self.cell, self.hidden_size, self.num_layers, self.nonlinearity = cell, hidden_size, num_layers, nonlinearity
        self.ih = nn.ModuleList(
            nn.Linear(input_size if k == 0 else hidden_size, G * hidden_size) for k in range(num_layers)
        )
        self.hh = nn.ModuleList(nn.Linear(hidden_size, G * hidden_size) for k in range(num_layers))

    @classmethod
    def from_module(cls, rnn: nn.Module) -> "LinearRecurrence":
        from ..models.recurrent import ExplicitLSTM

        if isinstance(rnn, (nn.LSTM, nn.RNN)):
            if not rnn.batch_first or rnn.bidirectional or not rnn.bias or getattr(rnn, "proj_size", 0):
                raise ConfigError(
                    f"{type(rnn).__name__}: only batch-first, unidirectional layers with biases and no projection can "
                    f"be rewritten"
                )
            cell = "lstm" if isinstance(rnn, nn.LSTM) else "rnn"
            nonlin = getattr(rnn, "nonlinearity", "tanh")
        elif isinstance(rnn, ExplicitLSTM):
            cell, nonlin = "lstm", "tanh"
        else:
            raise ConfigError(f"{type(rnn).__name__} cannot be rewritten as Linear layers")
        out = cls(cell, rnn.input_size, rnn.hidden_size, rnn.num_layers, nonlin)
        with torch.no_grad():
            for k in range(rnn.num_layers):
                ih, hh = cast(nn.Linear, out.ih[k]), cast(nn.Linear, out.hh[k])
                ih.weight.copy_(getattr(rnn, f"weight_ih_l{k}"))
                ih.bias.copy_(getattr(rnn, f"bias_ih_l{k}"))
                hh.weight.copy_(getattr(rnn, f"weight_hh_l{k}"))
                hh.bias.copy_(getattr(rnn, f"bias_hh_l{k}"))
        return out

    def forward(self, x: torch.Tensor, state=None):
        B, T, _ = x.shape  # (B, T, in)
        if state is None:
            zeros = x.new_zeros(self.num_layers, B, self.hidden_size)
            state = (zeros, zeros) if self.cell == "lstm" else zeros
        h0, c0 = state if self.cell == "lstm" else (state, None)
        act = torch.tanh if self.nonlinearity == "tanh" else torch.relu
        h_n, c_n = [], []
        for k in range(self.num_layers):
            x_proj = self.ih[k](x)  # (B, T, G·H): no time dependency, one matmul
            h = h0[k]
            c = c0[k] if c0 is not None else None
            outs = []
            for t in range(T):
                z = x_proj[:, t] + self.hh[k](h)  # (B, G·H)
                if self.cell == "lstm":
                    assert c is not None  # an LSTM's state carries its cell
                    zi, zf, zg, zo = z.chunk(4, dim=-1)
                    c = torch.sigmoid(zf) * c + torch.sigmoid(zi) * torch.tanh(zg)
                    h = torch.sigmoid(zo) * torch.tanh(c)
                else:
                    h = act(z)
                outs.append(h)
            x = torch.stack(outs, dim=1)  # (B, T, H)
            h_n.append(h)
            c_n.append(c)
        h_n = torch.stack(h_n)
        return x, ((h_n, torch.stack(c_n)) if self.cell == "lstm" else h_n)


def _recurrent_modules(model: nn.Module) -> list[str]:
    from ..models.recurrent import ExplicitLSTM

    return [n for n, m in model.named_modules() if isinstance(m, (nn.LSTM, nn.RNN, ExplicitLSTM))]


def _set_submodule(root: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, new)


def rewrite_recurrent(model: nn.Module, names: list[str] | None = None) -> list[str]:
    """Replace the recurrent modules `names` (default: every nn.LSTM / nn.RNN / ExplicitLSTM) by
    `LinearRecurrence` copies, in place. Returns the names rewritten."""
    names = _recurrent_modules(model) if names is None else list(names)
    for name in names:
        try:
            module = model.get_submodule(name)
        except AttributeError:
            raise PipelineInputError(
                f"recurrent module {name!r} to rewrite does not exist in {type(model).__name__}"
            ) from None
        if not isinstance(module, LinearRecurrence):
            _set_submodule(model, name, LinearRecurrence.from_module(module))
    return names
