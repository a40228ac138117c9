"""RNN and LSTM training throughput: the pipeline's models in the shared loop vs torch's own
`nn.RNN` / `nn.LSTM` in a bare loop, side by side. The gap is what the shared loop and the model
wrapper cost on top of torch's recurrent kernels.

Both train the same shapes on the same data: the pipeline's default byte-level BPE (2,048 tokens)
over the Wikipedia sample dump in gensim's test data, blocks of 128 tokens, the `rnn_lm` / `lstm_lm`
defaults of `pipelines/defs/*/defs.yaml` (1 layer, parameter budget 1 M, batch 16, AdamW, clipping
at 1.0). The bare loop is what a user would write: embedding → nn.RNN/nn.LSTM → linear head →
cross-entropy, `torch.optim.AdamW`, `clip_grad_norm_`, a random batch of blocks per step. The two
alternate every --interleave steps so that a change in the machine's load hits both alike.

    python benchmarks/recurrent_throughput.py --out benchmarks/results/recurrent_throughput_cpu.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from result_file import emit  # noqa: E402

from components.core.data import IGNORE_INDEX, TokenBlocks  # noqa: E402
from components.core.device import autocast_context, resolve_dtype  # noqa: E402
from components.core.labels import pack_blocks, token_stream  # noqa: E402
from components.core.lm import build_model, resolve_settings  # noqa: E402
from components.core.tokenizer import TokenizerSettings, train_tokenizer  # noqa: E402
from components.core.train_settings import TrainSettings  # noqa: E402
from components.core.train_step import lr_at  # noqa: E402
from components.core.training import train  # noqa: E402

# The defaults of pipelines/defs/{rnn_lm,lstm_lm}/defs.yaml.
MODELS = {
    "rnn": {"cell": "rnn", "n_embd": 128, "hidden_size": 256, "n_layer": 1, "param_budget": 1_000_000},
    "lstm": {"cell": "lstm", "n_embd": 128, "hidden_size": 256, "n_layer": 1, "param_budget": 1_000_000},
}
TRAIN = dict(batch_size=16, lr=3e-3, min_lr=3e-4, warmup_steps=20, grad_clip=1.0)
BLOCK = 128  # the context every model trains on (the labels' blocks: recurrent models take the whole block)


def bpe_blocks(block_size: int, vocab_size: int) -> tuple[TokenBlocks, int]:
    """The default corpus as the pipeline tokenizes it: byte-level BPE trained on it, blocks packed."""
    from components.core.corpus import default_wiki_dump, iter_wiki_articles

    texts = [d["text"] for d in iter_wiki_articles(default_wiki_dump())]
    tok = train_tokenizer(texts, TokenizerSettings(vocab_size=vocab_size))
    V = tok.get_vocab_size()
    return pack_blocks(token_stream(tok, texts), block_size, V), V


def split_blocks(blocks: TokenBlocks) -> tuple[TokenBlocks, TokenBlocks]:
    """(train, val): the first twentieth of the blocks held out for the loop's (unused) evaluation."""
    n_val = max(1, blocks.n_blocks // 20)
    return TokenBlocks(blocks.x[n_val:], blocks.y[n_val:]), TokenBlocks(blocks.x[:n_val], blocks.y[:n_val])


def loop_settings(train: dict, steps: int, interleave: int, threads: int, dtype: str) -> TrainSettings:
    """The shared loop's settings for a timing run: `steps` steps on CPU, logged (and so timed) every
    `interleave`, no evaluation."""
    return TrainSettings(
        **train,
        max_steps=steps,
        eval_interval=0,
        eval_batches=1,
        log_interval=interleave,
        threads=threads,
        device="cpu",
        dtype=dtype,
    )


class Bare(nn.Module):
    """embedding → nn.RNN / nn.LSTM → linear head: the model as torch's documentation builds it."""

    def __init__(self, cell: str, V: int, E: int, H: int, L: int):
        super().__init__()
        self.wte = nn.Embedding(V, E)
        self.rnn = (nn.RNN if cell == "rnn" else nn.LSTM)(E, H, L, batch_first=True)
        self.head = nn.Linear(H, V, bias=False)

    def forward(self, x, y):
        h, _ = self.rnn(self.wte(x))
        logits = self.head(h)
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX)


class BareRun:
    def __init__(
        self, cell: str, V: int, E: int, H: int, L: int, data: TokenBlocks, ts: TrainSettings, dtype: torch.dtype
    ):
        torch.manual_seed(ts.seed)
        self.dtype = dtype
        self.model, self.ts = Bare(cell, V, E, H, L), ts
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=ts.lr, betas=(ts.beta1, ts.beta2), weight_decay=ts.weight_decay, fused=True
        )
        self.x = torch.from_numpy(data.x.astype(np.int64))
        self.y = torch.from_numpy(data.y.astype(np.int64))
        self.gen = torch.Generator().manual_seed(ts.seed)
        self.it, self.times = 0, []

    def steps(self, n: int) -> None:
        for _ in range(n):
            t0 = time.perf_counter()
            for g in self.opt.param_groups:
                g["lr"] = lr_at(self.it, self.ts)
            ix = torch.randint(len(self.x), (self.ts.batch_size,), generator=self.gen)
            with autocast_context(torch.device("cpu"), self.dtype):  # the same precision as ours
                loss = self.model(self.x[ix], self.y[ix])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.ts.grad_clip)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            loss.item()
            self.times.append(time.perf_counter() - t0)
            self.it += 1


class OursRun:
    def __init__(self, model: nn.Module, data: TokenBlocks, val: TokenBlocks, ts: TrainSettings, out: Path):
        self.model, self.data, self.val, self.ts, self.out = model, data, val, ts, out
        self.timed_s, self.timed_steps, self.done = 0.0, 0, 0

    def steps(self, n: int) -> None:
        res = train(self.model, self.data, self.val, self.ts, self.out, resume=True, stop_after_steps=n)
        k = res.steps - self.done
        timed = max(k - 1, 1)  # the loop leaves each call's first step out of its mean
        self.timed_s += res.step_ms / 1000 * timed
        self.timed_steps += timed
        self.done = res.steps


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--interleave", type=int, default=50)
    ap.add_argument("--cells", default="rnn,lstm")
    ap.add_argument("--vocab-size", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="autocast of both loops ('auto' as the pipeline trains: bf16 on a CPU with AMX)",
    )
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    blocks, V = bpe_blocks(BLOCK, args.vocab_size)
    train_blocks, val_blocks = split_blocks(blocks)
    ts = loop_settings(TRAIN, args.steps, args.interleave, args.threads, args.dtype)
    dtype = resolve_dtype(args.dtype, torch.device("cpu"))
    out: dict = {
        "benchmark": "recurrent_throughput",
        "steps": args.steps,
        "interleave": args.interleave,
        "vocab_size": V,
        "train_blocks": train_blocks.n_blocks,
        "train_settings": ts.model_dump(),
        "threads": args.threads,
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "loadavg_start": list(os.getloadavg()),
        "models": {},
    }
    tmp = tempfile.TemporaryDirectory()
    loads = []
    for cell in [c.strip() for c in args.cells.split(",") if c.strip()]:
        settings = resolve_settings("recurrent", MODELS[cell], V)
        torch.manual_seed(ts.seed)
        model = build_model("recurrent", settings, V)
        ours = OursRun(model, train_blocks, val_blocks, ts, Path(tmp.name) / cell)
        bare = BareRun(cell, V, settings.n_embd, settings.hidden_size, settings.n_layer, train_blocks, ts, dtype)
        for _ in range(0, args.steps, args.interleave):
            ours.steps(args.interleave)
            bare.steps(args.interleave)
            loads.append(os.getloadavg()[0])
            print(
                f"[recurrent_throughput] {cell}: {ours.done}/{args.steps} steps, load {loads[-1]:.2f}", file=sys.stderr
            )
        tokens = ts.batch_size * BLOCK
        ours_s = ours.timed_s / ours.timed_steps
        bare_s = float(np.mean(bare.times[1:]))
        out["models"][cell] = {
            "settings": settings.model_dump(),
            "params_ours": sum(p.numel() for p in model.parameters()),
            "params_bare": sum(p.numel() for p in bare.model.parameters()),
            "ours_tokens_per_s": tokens / ours_s,
            "ours_step_ms": 1000 * ours_s,
            "bare_tokens_per_s": tokens / bare_s,
            "bare_step_ms": 1000 * bare_s,
            "ratio_tokens_per_s": bare_s / ours_s,
            "loop_overhead_ms": 1000 * (ours_s - bare_s),
        }
    tmp.cleanup()
    out["loadavg_per_chunk"] = loads
    out["machine_loaded"] = max(loads) > args.threads + 0.75
    if out["machine_loaded"]:
        out["warning"] = (
            f"1-min load average reached {max(loads):.2f} with {args.threads} threads: the ratio may not hold on a "
            f"quiet machine"
        )
    return emit(out, args.out)


if __name__ == "__main__":
    main()
