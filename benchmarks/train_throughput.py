"""Training throughput and quality of the pipeline's Transformer vs nanoGPT, side by side.

Character-level language modelling on a local text (vocabulary = the text's characters, [PAD]=0,
90/10 train/validation split like nanoGPT's shakespeare_char). Trains

- ours: `components.core.models.transformer.Transformer` through the shared training loop
  (`components.core.training.train`), and
- nanogpt: a faithful minimal reimplementation of nanoGPT's model.py + train.py loop (LayerNorm with
  optional bias, GELU MLP, SDPA causal attention, learned positions, weight tying, AdamW with decay
  on >= 2-D tensors only, linear warmup + cosine, grad clip, random-offset batches),

in the same process on the same text, for the same number of iterations and tokens, alternating
every --interleave iterations (ours pauses and resumes exactly through the loop's checkpoints) so
that a change in the machine's load hits both alike; then both are evaluated on the whole validation
split with the same function. Prints one JSON object (and writes it
with --out). The top-level tokens_per_s, step_ms, val_loss, params, device, attention_backend and mfu
are ours.

    python benchmarks/train_throughput.py --preset baby_gpt --out benchmarks/results/train_throughput_cpu.json
    # float32 on a CPU without AMX: ours through torch.compile with inductor's C++ wrapper
    python benchmarks/train_throughput.py --text input.txt --compile --set 'compile_options={"cpp_wrapper": true}'
    python benchmarks/train_throughput.py --text input.txt --iters 200 --set pos_encoding=rope

Without --text the corpus is plain text from the Wikipedia sample dump in gensim's test data (no
network needed), cut to --max-chars (default: tiny-shakespeare's 1,115,394 characters).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from result_file import emit  # noqa: E402

from components.core.data import IGNORE_INDEX, TokenBlocks  # noqa: E402
from components.core.device import estimate_mfu, resolve_device, resolve_dtype  # noqa: E402
from components.core.models.sdpa_probe import detect_sdpa_backend  # noqa: E402
from components.core.models.transformer import Transformer, TransformerSettings  # noqa: E402
from components.core.train_settings import TrainSettings  # noqa: E402
from components.core.train_step import evaluate, lr_at  # noqa: E402
from components.core.training import train  # noqa: E402

TINY_SHAKESPEARE_CHARS = 1_115_394

# nanoGPT's CPU "baby GPT" (README: train_shakespeare_char on a MacBook / CPU):
#   --device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12
#   --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0
# with config/train_shakespeare_char.py: lr 1e-3, min_lr 1e-4, beta2 0.99, warmup 100; train.py
# defaults: weight_decay 0.1, beta1 0.9, grad_clip 1.0, bias False. nanoGPT reports val loss 1.88.
PRESETS = {
    "baby_gpt": {
        "model": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0, bias=False),
        "train": dict(
            max_steps=2000,
            batch_size=12,
            lr=1e-3,
            min_lr=1e-4,
            warmup_steps=100,
            lr_decay_steps=2000,
            weight_decay=0.1,
            beta1=0.9,
            beta2=0.99,
            grad_clip=1.0,
        ),
        # The goal: ≥ 1.5× the tokens/s of nanoGPT's loop measured side by side in the same run where ours
        # trains under bf16 autocast (a CPU with AMX), ≥ 1.25× where it trains in float32 (a CPU without
        # AMX: there both loops run the same float32 kernels), at a validation loss ≤ 1.80 after 2000
        # iterations (nanoGPT's README: 1.88 on tiny-shakespeare).
        "goal": {
            "ratio_tokens_per_s": {"bfloat16": 1.5, "float32": 1.25},
            "val_loss": 1.80,
            "nanogpt_readme_val_loss": 1.88,
        },
    },
    # A smaller, quicker sanity run of the same recipe.
    "tiny": {
        "model": dict(n_layer=2, n_head=2, n_embd=64, block_size=32, dropout=0.0, bias=False),
        "train": dict(
            max_steps=100,
            batch_size=8,
            lr=1e-3,
            min_lr=1e-4,
            warmup_steps=10,
            lr_decay_steps=100,
            weight_decay=0.1,
            beta1=0.9,
            beta2=0.99,
            grad_clip=1.0,
        ),
        "goal": None,
    },
}


# --------------------------------------------------------------------------------------------------
# Corpus and character tokenizer


def wiki_sample_text(max_chars: int) -> str:
    """Plain text of the Wikipedia sample dump in gensim's test data, via the project's corpus reader."""
    from components.core.corpus import default_wiki_dump, iter_wiki_articles

    parts, n = [], 0
    for doc in iter_wiki_articles(default_wiki_dump()):
        parts.append(doc["text"])
        n += len(doc["text"]) + 2
        if n >= max_chars:
            break
    return "\n\n".join(parts)[:max_chars]


@dataclass
class CharData:
    train_ids: np.ndarray  # (n,) uint16 token ids of the training text
    val_ids: np.ndarray
    vocab_size: int  # characters + [PAD]
    info: dict


def char_data(text: str, source: str) -> CharData:
    """nanoGPT's shakespeare_char prepare.py: vocabulary = sorted characters, first 90% train.
    Ids start at 1 because 0 is the pipeline's [PAD]."""
    chars = sorted(set(text))
    stoi = {c: i + 1 for i, c in enumerate(chars)}
    ids = np.fromiter((stoi[c] for c in text), dtype=np.uint16, count=len(text))
    n = int(0.9 * len(ids))
    info = {
        "source": source,
        "chars": len(text),
        "vocab_size": len(chars) + 1,
        "train_tokens": n,
        "val_tokens": len(ids) - n,
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
    }
    return CharData(ids[:n], ids[n:], len(chars) + 1, info)


def windows(ids: np.ndarray, block_size: int, stride: int) -> TokenBlocks:
    """Overlapping (x, y) windows every `stride` tokens: our loop samples blocks, and windows at every
    stride-th offset approximate nanoGPT's uniformly random offsets."""
    starts = np.arange(0, len(ids) - block_size - 1, stride)
    x = np.lib.stride_tricks.sliding_window_view(ids[:-1], block_size)[starts]
    y = np.lib.stride_tricks.sliding_window_view(ids[1:], block_size)[starts].astype(np.int32)
    return TokenBlocks(np.ascontiguousarray(x), np.ascontiguousarray(y))


def val_blocks(ids: np.ndarray, block_size: int) -> TokenBlocks:
    """The whole validation text as consecutive blocks (the last one padded, its pad targets -100)."""
    n = -(-(len(ids) - 1) // block_size)
    x = np.zeros(n * block_size, dtype=np.uint16)
    y = np.full(n * block_size, IGNORE_INDEX, dtype=np.int32)
    x[: len(ids) - 1], y[: len(ids) - 1] = ids[:-1], ids[1:]
    return TokenBlocks(x.reshape(n, block_size), y.reshape(n, block_size))


# --------------------------------------------------------------------------------------------------
# nanoGPT (model.py), minimal and faithful


@dataclass
class NanoGPTConfig:
    block_size: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    bias: bool = False


class NanoLayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's had no bias=False when nanoGPT was written)."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class NanoCausalSelfAttention(nn.Module):
    def __init__(self, c: NanoGPTConfig):
        super().__init__()
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.resid_dropout = nn.Dropout(c.dropout)
        self.n_head, self.n_embd, self.dropout = c.n_head, c.n_embd, c.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class NanoMLP(nn.Module):
    def __init__(self, c: NanoGPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class NanoBlock(nn.Module):
    def __init__(self, c: NanoGPTConfig):
        super().__init__()
        self.ln_1, self.attn = NanoLayerNorm(c.n_embd, c.bias), NanoCausalSelfAttention(c)
        self.ln_2, self.mlp = NanoLayerNorm(c.n_embd, c.bias), NanoMLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, c: NanoGPTConfig):
        super().__init__()
        self.config, self.vocab_size = c, c.vocab_size
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(c.vocab_size, c.n_embd),
                wpe=nn.Embedding(c.block_size, c.n_embd),
                drop=nn.Dropout(c.dropout),
                h=nn.ModuleList([NanoBlock(c) for _ in range(c.n_layer)]),
                ln_f=NanoLayerNorm(c.n_embd, bias=c.bias),
            )
        )
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self, non_embedding=True):
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:  # nanoGPT ignores -1; the pipeline's blocks use -100
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=IGNORE_INDEX)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == "cuda")


class NanoGPTRun:
    """nanoGPT's train.py loop (single process, grad accumulation 1), run in chunks of iterations so it
    can alternate with ours; only the iterations are timed."""

    def __init__(
        self,
        data: CharData,
        model_cfg: dict,
        train_cfg: TrainSettings,
        device: torch.device,
        dtype: torch.dtype,
        compile_model: bool,
    ):
        torch.manual_seed(train_cfg.seed)
        c = NanoGPTConfig(
            vocab_size=data.vocab_size,
            **{k: model_cfg[k] for k in ("block_size", "n_layer", "n_head", "n_embd", "dropout", "bias")},
        )
        self.c, self.s, self.device = c, train_cfg, device
        self.model = NanoGPT(c).to(device)
        self.optimizer = self.model.configure_optimizers(
            train_cfg.weight_decay, train_cfg.lr, (train_cfg.beta1, train_cfg.beta2), device.type
        )
        self.fwd = torch.compile(self.model) if compile_model else self.model
        # nanoGPT's train.py: `nullcontext() if device_type == 'cpu' else torch.amp.autocast(...)`; on the CPU
        # its recipe always runs in float32, whatever precision ours is given.
        self.ctx = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32 and device.type != "cpu")
        self.train_data = torch.from_numpy(data.train_ids.astype(np.int64))
        # Its own generator: nanoGPT draws batches from the global RNG, which our loop reseeds on resume.
        self.gen = torch.Generator().manual_seed(train_cfg.seed)
        self.it, self.step_times, self.losses, self.wall_s, self.cpu_s, self.loop_s = 0, [], [], 0.0, 0.0, 0.0

    def get_batch(self):
        T, B = self.c.block_size, self.s.batch_size
        ix = torch.randint(len(self.train_data) - T, (B,), generator=self.gen)
        x = torch.stack([self.train_data[i : i + T] for i in ix])
        y = torch.stack([self.train_data[i + 1 : i + 1 + T] for i in ix])
        return x.to(self.device), y.to(self.device)

    def steps(self, n: int) -> None:
        t_start, c_start = time.perf_counter(), time.process_time()
        self.model.train()
        for _ in range(min(n, self.s.max_steps - self.it)):
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            lr = lr_at(self.it, self.s)  # the same warmup + cosine formula as nanoGPT's get_lr
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            with record_function("phase/batch"):
                X, Y = self.get_batch()
            with record_function("phase/forward"), self.ctx:
                _, loss = self.fwd(X, Y)
            with record_function("phase/backward"):
                loss.backward()
            if self.s.grad_clip != 0.0:
                with record_function("phase/clip"):  # nanoGPT: norm and clip in one call
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.s.grad_clip)
            with record_function("phase/optimizer"):
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            self.losses.append(loss.item())  # nanoGPT syncs here at every log_interval (1 in the CPU recipe)
            self.step_times.append(time.perf_counter() - t0)
            self.it += 1
        self.wall_s += time.perf_counter() - t_start
        self.loop_s += time.perf_counter() - t_start
        self.cpu_s += time.process_time() - c_start

    def stats(self) -> dict:
        step_s = float(np.mean(self.step_times[1:] or self.step_times))
        c, T = self.c, self.c.block_size
        return {
            "tokens_per_s": self.s.batch_size * T / step_s,
            "step_ms": 1000 * step_s,
            "train_loss": float(np.mean(self.losses[-50:])),
            "wall_s": self.wall_s,
            "cpu_ms_per_step": 1000 * self.cpu_s / max(self.it, 1),
            "cpu_utilisation": self.cpu_s / max(self.loop_s * torch.get_num_threads(), 1e-9),
            "params": sum(p.numel() for p in self.model.parameters()),
            "flops_per_token": 6 * self.model.get_num_params() + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * T,
        }


class OursRun:
    """Our model through the shared loop, run in chunks (stop_after_steps + exact resume)."""

    def __init__(self, cfg: TransformerSettings, data: CharData, ts: TrainSettings, stride: int, out_dir: Path):
        torch.manual_seed(ts.seed)
        self.model = Transformer(cfg, data.vocab_size)
        self.ts, self.out_dir = ts, out_dir
        self.train_blocks = windows(data.train_ids, cfg.block_size, stride)
        self.val = val_blocks(data.val_ids, cfg.block_size)
        self.done, self.timed_s, self.timed_steps, self.wall_s, self.result = 0, 0.0, 0, 0.0, None
        self.cpu_s = 0.0
        # CPU and wall time of every call but the first (which compiles, with --compile): the utilisation
        self.later_cpu_s, self.later_wall_s = 0.0, 0.0

    def steps(self, n: int) -> None:
        if self.done >= self.ts.max_steps:
            return
        c0 = time.process_time()
        res = train(self.model, self.train_blocks, self.val, self.ts, self.out_dir, resume=True, stop_after_steps=n)
        cpu = time.process_time() - c0
        if self.done:
            self.later_cpu_s += cpu
            self.later_wall_s += res.wall_s
        self.cpu_s += cpu
        k = res.steps - self.done
        timed = max(k - 1, 1)  # the loop leaves each call's first step out of its mean
        self.timed_s += res.step_ms / 1000 * timed
        self.timed_steps += timed
        self.wall_s += res.wall_s
        self.done, self.result = res.steps, res

    def utilisation(self) -> float:
        """CPU time over wall time x threads, leaving out the first call (it compiles, with --compile)."""
        cpu, wall = (self.later_cpu_s, self.later_wall_s) if self.later_wall_s else (self.cpu_s, self.wall_s)
        return cpu / max(wall * torch.get_num_threads(), 1e-9)


# --------------------------------------------------------------------------------------------------
# The benchmark


def parse_overrides(pairs: list[str]) -> tuple[dict, dict]:
    """--set key=value pairs, routed to TransformerSettings or TrainSettings by field name."""
    model, train_ = {}, {}
    for pair in pairs:
        key, _, raw = pair.partition("=")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if key in TransformerSettings.model_fields:
            model[key] = value
        elif key in TrainSettings.model_fields:
            train_[key] = value
        else:
            raise SystemExit(f"--set {key}: not a TransformerSettings or TrainSettings field")
    return model, train_


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", help="UTF-8 text file (default: the Wikipedia sample dump in gensim's test data)")
    ap.add_argument(
        "--max-chars", type=int, default=TINY_SHAKESPEARE_CHARS, help="cut the text to this many characters"
    )
    ap.add_argument("--preset", choices=sorted(PRESETS), default="baby_gpt")
    ap.add_argument("--iters", type=int, help="training iterations (default: the preset's)")
    ap.add_argument("--models", default="ours,nanogpt", help="comma-separated: ours, nanogpt")
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a model or train setting (ours)"
    )
    ap.add_argument("--compile", action="store_true", help="torch.compile ours (nanoGPT's CPU recipe runs without)")
    ap.add_argument("--compile-nanogpt", action="store_true", help="torch.compile the nanoGPT reference too")
    ap.add_argument("--stride", type=int, default=8, help="offset between our training windows")
    ap.add_argument(
        "--interleave",
        type=int,
        default=100,
        help="alternate the two models every this many iterations (0: one after the other)",
    )
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: the core count)")
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    preset = PRESETS[args.preset]
    model_over, train_over = parse_overrides(args.set)
    model_cfg = {**preset["model"], **model_over}
    iters = args.iters or preset["train"]["max_steps"]
    train_kw = {**preset["train"], "max_steps": iters, "lr_decay_steps": iters, **train_over}
    ts = TrainSettings(
        **train_kw,
        eval_interval=0,
        eval_batches=1,
        log_interval=max(1, iters // 20),
        device=args.device,
        dtype=args.dtype,
        compile=args.compile,
        threads=args.threads,
    )
    device, _ = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    nano_dtype = torch.float32 if device.type == "cpu" else dtype  # nanoGPT never autocasts on the CPU

    if args.text:
        text, source = Path(args.text).read_text(encoding="utf-8")[: args.max_chars], str(Path(args.text).resolve())
    else:
        text, source = wiki_sample_text(args.max_chars), "gensim test data: enwiki sample dump, plain text"
    data = char_data(text, source)
    T = model_cfg["block_size"]
    val = val_blocks(data.val_ids, T)
    out: dict = {
        "benchmark": "train_throughput",
        "preset": args.preset,
        "iters": iters,
        "batch_size": ts.batch_size,
        "block_size": T,
        "tokens_per_iter": ts.batch_size * T,
        "corpus": data.info,
        "threads": args.threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "loadavg_start": list(os.getloadavg()),
        "model_settings": model_cfg,
        "train_settings": {k: v for k, v in ts.model_dump().items()},
    }
    models = [m.strip() for m in args.models.split(",") if m.strip()]

    chunk = args.interleave or iters
    ours = nano = None
    tmp = tempfile.TemporaryDirectory()
    if "ours" in models:
        cfg = TransformerSettings(**model_cfg)
        ours = OursRun(cfg, data, ts, args.stride, Path(tmp.name) / "ours")
    if "nanogpt" in models:
        nano = NanoGPTRun(data, model_cfg, ts, device, nano_dtype, args.compile_nanogpt)
    # Alternate chunks of iterations, so a machine whose load changes slows both alike.
    loads = []
    for start in range(0, iters, chunk):
        for run in (ours, nano):
            if run is not None:
                run.steps(chunk)
        loads.append(os.getloadavg()[0])
        print(
            f"[train_throughput] {min(start + chunk, iters)}/{iters} iterations, load {loads[-1]:.2f}", file=sys.stderr
        )

    if ours is not None:
        model, res = ours.model, ours.result
        val_loss = evaluate(model, val, batch_size=64, max_batches=None, device=device, dtype=dtype)
        backend = detect_sdpa_backend(
            device,
            dtype,
            (ts.batch_size, cfg.n_head, T, cfg.head_dim),
            cfg.sdpa_backend if device.type == "cuda" else "auto",
        )
        tokens_per_s = ts.batch_size * T * ours.timed_steps / ours.timed_s
        out["ours"] = {
            "tokens_per_s": tokens_per_s,
            "step_ms": 1000 * ours.timed_s / ours.timed_steps,
            "val_loss": val_loss,
            "train_loss": res.train_loss,
            "params": res.params,
            "wall_s": ours.wall_s,
            # Outside the timed steps: each chunk's first step, setup and (with --compile) compilation.
            "untimed_s": ours.wall_s - ours.timed_s,
            "cpu_ms_per_step": 1000 * ours.cpu_s / max(ours.done, 1),
            "cpu_utilisation": ours.utilisation(),
            "device": res.device,
            "dtype": res.dtype,
            "compile": args.compile,
            "compile_options": ts.compile_options,
            "attention": cfg.attention,
            "pos_encoding": cfg.pos_encoding,
            "attention_backend": backend["observed"] if cfg.attention == "fused" else "reference",
            "mfu": estimate_mfu(model.flops_per_token(T), tokens_per_s, device),
            "flops_per_token": model.flops_per_token(T),
        }
        print(f"ours: {json.dumps(out['ours'])}", file=sys.stderr)

    if nano is not None:
        stats = nano.stats()
        stats["val_loss"] = evaluate(nano.model, val, batch_size=64, max_batches=None, device=device, dtype=nano_dtype)
        stats.update(
            {
                "device": str(device),
                "compile": args.compile_nanogpt,
                "dtype": str(nano_dtype).removeprefix("torch."),
                "attention_backend": detect_sdpa_backend(
                    device,
                    nano_dtype,
                    (ts.batch_size, model_cfg["n_head"], T, model_cfg["n_embd"] // model_cfg["n_head"]),
                )["observed"],
                "mfu": estimate_mfu(stats["flops_per_token"], stats["tokens_per_s"], device),
            }
        )
        out["nanogpt"] = stats
        print(f"nanogpt: {json.dumps(stats)}", file=sys.stderr)
    tmp.cleanup()
    out["loadavg_end"] = list(os.getloadavg())
    out["interleave"] = chunk
    # A quiet machine runs only this process: its own threads make the load average ≈ threads, and
    # the process gets the CPU time it asks for (utilisation near 1). More load, or less CPU time
    # per wall second, means something else competed for the cores: the result is marked.
    out["loadavg_per_chunk"] = loads
    utils = [out[k]["cpu_utilisation"] for k in ("ours", "nanogpt") if k in out]
    reasons = []
    if max(loads) > args.threads + 0.75:
        reasons.append(f"1-min load average reached {max(loads):.2f} with {args.threads} threads of ours")
    if utils and min(utils) < 0.8:
        reasons.append(f"CPU utilisation {min(utils):.2f} < 0.8 of {args.threads} threads")
    out["machine_loaded"] = bool(reasons)
    if reasons:
        out["warning"] = "machine was loaded: " + "; ".join(reasons) + " — the ratio may not hold on a quiet machine"
        print(f"[train_throughput] WARNING {out['warning']}", file=sys.stderr)

    if "ours" in out:
        for key in ("tokens_per_s", "step_ms", "val_loss", "params", "device", "attention_backend", "mfu"):
            out[key] = out["ours"][key]
    if "ours" in out and "nanogpt" in out:
        out["ratio_tokens_per_s"] = out["ours"]["tokens_per_s"] / out["nanogpt"]["tokens_per_s"]
        out["delta_val_loss"] = out["ours"]["val_loss"] - out["nanogpt"]["val_loss"]
    if preset["goal"] and "ours" in out:
        goal = preset["goal"]
        bar = goal["ratio_tokens_per_s"].get(out["ours"]["dtype"], max(goal["ratio_tokens_per_s"].values()))
        out["goal"] = {
            **goal,
            "ratio_tokens_per_s": bar,  # the bar for the dtype ours trained in
            "ratio_met": out.get("ratio_tokens_per_s", 0.0) >= bar and not out["machine_loaded"],
            "val_loss_met": out["ours"]["val_loss"] <= goal["val_loss"],
            "note": "the ratio is against the nanoGPT loop run side by side on the same text (its CPU recipe: "
            "float32, no autocast); the val-loss goal assumes tiny-shakespeare (--text).",
        }
    return emit(out, args.out)


if __name__ == "__main__":
    main()
