"""Prefill and decode of a recurrent model, timed: the one measurement `generation_cost` and
`recurrent_cost` share (a prompt run through once, then tokens generated one at a time, greedy, the
state carried along)."""

from __future__ import annotations

import torch

from ..device import median_seconds
from ..models.recurrent import RecurrentLM


@torch.no_grad()
def recurrent_prefill_decode(
    m: RecurrentLM, x: torch.Tensor, gen_tokens: int, device: torch.device, *, warmup: int, repeats: int
) -> tuple[float, float, object]:
    """(median seconds of the prefill of x (B, L), median seconds of decoding `gen_tokens` tokens after it,
    the state after the prompt)."""
    prefill_s = median_seconds(lambda: m.forward_hidden(x), device, warmup=warmup, repeats=repeats)
    out, state = m.forward_hidden(x)
    first = m.head(out[:, -1]).argmax(-1)  # (B,)

    def decode() -> None:
        tok, st = first, state
        for _ in range(gen_tokens):
            logits, st = m.step(tok, st)  # (B, V)
            tok = logits.argmax(-1)

    return prefill_s, median_seconds(decode, device, warmup=warmup, repeats=repeats), state
