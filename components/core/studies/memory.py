"""Memory tasks on which the RNN, the LSTM, full attention and the sliding window part ways.

Real text at this size uses about a dozen tokens of context, so it cannot show why attention replaced
recurrence. Two controlled tasks, generated and seeded, can, in seconds on a CPU:

- **Delayed recall** (the long-time-lag tasks of Hochreiter & Schmidhuber's LSTM paper). A sequence of
  `seq_len` tokens is noise except one symbol (one of `n_symbols`) at distance `delay` before the
  last position, which holds a query token; the only target is the symbol, at the query. Each
  architecture is trained on each delay alone (`training: per_delay`, sequences of about d + 2
  tokens, `delay_seq_len`): the only way to learn delay d
  is the gradient carried back d steps, which is what the article says vanishes in an RNN. Accuracy
  is measured per delay; chance is 1 / n_symbols. Also measured: the norm of the gradient of the
  query's loss with respect to the input embedding at the symbol's position, relative to the query's
  own, in each trained model (how much signal from the loss at t reaches t − d). `training: mixed`
  trains one model per architecture on all delays at once: the short delays then teach the RNN to
  latch the symbol, and the latch holds over delays its gradient could never have taught.
- **Multi-query associative recall** (MQAR, the Zoology benchmark). `pairs` key-value pairs (distinct
  keys, values drawn with replacement), then every key once more in random order as a query whose
  target is its value; filler tokens, split at random, before the pairs and between pairs and
  queries, so the key-query distance varies on its own. Training sequences hold the most pairs
  (`train_pairs`): a mix with one or two pairs, which copying any value in the context answers,
  keeps a model on that shortcut. Accuracy is measured per number of pairs (1 to the most) and per
  key-query distance. Chance is 1 / n_values.
  A sliding-window Transformer sees at most its receptive field rf = n_layer · (window − 1) + 1
  positions (itself and rf − 1 back). A query is answerable while its value, one position after the
  key (distance d − 1), is among them: d ≤ rf ("within"); beyond (d > rf) its answer is invisible.

Models are the project's own (`RecurrentLM`, `Transformer`, the one contract
forward(idx, targets) -> (logits, loss)), each sized to one parameter budget, trained by the small
loop here on freshly drawn batches from a fixed training set, side by side in `workers` processes;
validation sequences are drawn with another seed and any that equals a training sequence is dropped.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from matplotlib.figure import Figure

from ..data import IGNORE_INDEX
from ..errors import ConfigError
from ..models.recurrent import RecurrentLM, RecurrentSettings
from ..models.recurrent import size_for_budget as size_recurrent
from ..models.sizing import count_parameters
from ..models.transformer import Transformer, TransformerSettings, require_transformer
from ..models.transformer import size_for_budget as size_transformer
from ..workers import weights_in, weights_out
from .memory_plots import plot_accuracy, plot_gradients, plot_gradients_by_delay
from .memory_pool import StudyPlan, run_studies, training_cost
from .memory_tasks import (
    DelaySettings,
    MemoryTrainSettings,
    RecallSettings,
    TaskData,
    delay_task,
    disjoint_validation,
    recall_task,
)

Z95 = 1.96

__all__ = [
    "MemoryResult",
    "Z95",
    "accuracy_row",
    "build_model",
    "delay_study",
    "plan_delay",
    "plan_recall",
    "input_gradients",
    "predictions",
    "recall_study",
    "receptive_field",
    "state_size",
    "train_model",
    "train_one",
]


# --------------------------------------------------------------------------------------------------
# Models, training, evaluation


def build_model(
    kind: str, vocab_size: int, seq_len: int, t: MemoryTrainSettings, window: int | None = None
) -> nn.Module:
    """One architecture sized to t.param_budget parameters."""
    if kind in ("rnn", "lstm"):
        cfg = size_recurrent(
            RecurrentSettings(cell=kind, n_embd=32, hidden_size=64, param_budget=t.param_budget), vocab_size
        )
        model = RecurrentLM(cfg, vocab_size)
        if kind == "lstm" and t.lstm_init != "torch":
            H = cfg.hidden_size
            with torch.no_grad():
                for k in range(cfg.n_layer):  # gate rows i, f, g, o; a gate's pre-activation bias is b_ih + b_hh
                    b_ih, b_hh = getattr(model.rnn, f"bias_ih_l{k}"), getattr(model.rnn, f"bias_hh_l{k}")
                    if t.lstm_init == "chrono":
                        bf = torch.log(torch.empty(H).uniform_(1.0, max(2.0, seq_len - 1.0)))
                        b_ih[:H], b_ih[H : 2 * H] = -bf, bf
                    else:
                        b_ih[H : 2 * H] = t.lstm_forget_bias
                    b_hh[: 2 * H] = 0.0
        return model
    extra = {}
    if kind == "window":
        if window is None or window < 1:
            raise ConfigError(f"window={window}: a sliding-window model needs window >= 1")
        extra = {"attention": "sliding_window", "window": min(window, seq_len)}
    cfg = TransformerSettings(
        n_layer=t.n_layer, n_head=t.n_head, block_size=seq_len, param_budget=t.param_budget, **extra
    )
    return Transformer(size_transformer(cfg, vocab_size), vocab_size)


def state_size(model: nn.Module, seq_len: int) -> int:
    """Numbers carried from one position to the next: the recurrent state (h, and c for the LSTM), or
    the KV cache a Transformer holds at the sequence's end (2 · n_layer · n_embd · keys seen)."""
    if isinstance(model, RecurrentLM):
        return model.config.hidden_size * model.config.n_layer * (2 if model.is_lstm else 1)
    c = require_transformer(model, "state_size").config
    keys = min(seq_len, c.window) if c.attention == "sliding_window" else seq_len
    return 2 * c.n_layer * c.n_embd * keys


def train_model(model: nn.Module, data: TaskData, t: MemoryTrainSettings, lr: float) -> dict:
    """AdamW on batches drawn (seeded) from `data`, for t.steps steps or until solved (t.solved_accuracy on
    t.solved_steps batches in a row, counted on the batch just trained on): seconds, first and final loss,
    steps trained, and the step it was solved at (None if never)."""
    rng = np.random.default_rng(t.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warm = max(1, t.steps // 10)
    x_all, y_all = torch.from_numpy(data.x), torch.from_numpy(data.y)
    model.train()
    t0, losses, run = time.perf_counter(), [], 0  # run: consecutive batches at t.solved_accuracy
    solved_at = None
    for step in range(t.steps):
        for g in opt.param_groups:
            g["lr"] = (
                lr
                * min(1.0, (step + 1) / warm)
                * (0.5 * (1 + math.cos(math.pi * step / t.steps)) if step >= warm else 1.0)
            )
        idx = torch.from_numpy(rng.integers(0, len(data), size=t.batch_size))
        y = y_all[idx]
        logits, loss = model(x_all[idx], y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        losses.append(float(loss.detach()))
        if t.solved_accuracy is not None:
            asked = y != IGNORE_INDEX
            acc = float((logits.detach().argmax(-1)[asked] == y[asked]).float().mean()) if asked.any() else 0.0
            run = run + 1 if acc >= t.solved_accuracy else 0
            if run >= t.solved_steps:
                solved_at = step + 1
                break
    model.eval()
    return {
        "seconds": time.perf_counter() - t0,
        "first_loss": float(np.mean(losses[:10])),
        "final_loss": float(np.mean(losses[-10:])),
        "steps": len(losses),
        "solved_at": solved_at,
    }


@torch.no_grad()
def predictions(model: nn.Module, data: TaskData, batch_size: int = 128) -> np.ndarray:
    """Correct (1) / wrong (0) per target, (N, T) bool with False where there is no target."""
    model.eval()
    out = np.zeros(data.y.shape, dtype=bool)
    for s in range(0, len(data), batch_size):
        x = torch.from_numpy(data.x[s : s + batch_size])
        logits, _ = model(x)
        out[s : s + batch_size] = logits.argmax(-1).numpy() == data.y[s : s + batch_size]
    return out


def accuracy_row(correct: np.ndarray) -> dict:
    """Accuracy over 0/1 outcomes with a 95% (Wilson) interval."""
    n = int(correct.size)
    if n == 0:
        return {"n": 0, "accuracy": float("nan"), "low": float("nan"), "high": float("nan")}
    p = float(correct.mean())
    den = 1 + Z95**2 / n
    mid = (p + Z95**2 / (2 * n)) / den
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / den
    return {"n": n, "accuracy": p, "low": max(0.0, mid - half), "high": min(1.0, mid + half)}


def input_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """‖∂ loss(last position) / ∂ embedding(position j)‖ for every j, mean over the batch: (T,)."""
    store = {}

    def hook(mod, args, out):
        out.retain_grad()
        store["emb"] = out

    h = model.get_submodule("wte").register_forward_hook(hook)
    try:
        model.eval()
        model.zero_grad(set_to_none=True)
        logits, _ = model(x)
        loss = F.cross_entropy(logits[:, -1].float(), y[:, -1])
        loss.backward()
        g = store["emb"].grad.norm(dim=-1).mean(0)  # (T,)
    finally:
        h.remove()
        model.zero_grad(set_to_none=True)
    return g.detach().numpy()


# --------------------------------------------------------------------------------------------------
# The studies


@dataclass
class MemoryResult:
    rows: list[dict]  # per model and condition (delay / pairs / distance bucket): accuracy with interval
    models: list[dict]  # per model: parameters, state size, training seconds and losses
    chance: float
    extra: dict = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    # the trained modules, for a caller that probes them further (not in the manifest): by architecture,
    # or by (architecture, delay) when each delay trained its own
    trained: dict = field(default_factory=dict, repr=False)

    def metrics(self, prefix: str) -> dict[str, float]:
        out = {}
        for r in self.rows:
            out[f"{prefix}/{r['model']}_{r['by']}{r['at']}_accuracy"] = r["accuracy"]
        for m in self.models:
            name = m["model"] + (f"_delay{m['delay']}" if "delay" in m else "")
            out[f"{prefix}/{name}_train_seconds"] = m["train_seconds"]
            if "train_steps" in m:
                out[f"{prefix}/{name}_train_steps"] = m["train_steps"]
        return out

    def manifest(self) -> dict:
        return {"rows": self.rows, "models": self.models, "chance": self.chance, **self.extra}


def train_one(kind: str, vocab: int, seq_len: int, train: TaskData, t: MemoryTrainSettings, window: int | None):
    """Build and train one model (seeded by t.seed, with t.threads threads): its weights and its training info."""
    torch.set_num_threads(t.threads)
    torch.manual_seed(t.seed)
    model = build_model(kind, vocab, seq_len, t, window)
    info = train_model(model, train, t, t.lrs[kind])
    return weights_out(model), info


def _check_lrs(kinds: list[str], t: MemoryTrainSettings) -> None:
    for kind in kinds:
        if kind not in t.lrs:
            raise ConfigError(f"lrs has no learning rate for model {kind!r}; give one (lrs: {{{kind}: 0.003}})")


def _training_jobs(
    kinds: list[str], vocab: int, seq_len: int, train: TaskData, t: MemoryTrainSettings, window: int | None = None
) -> tuple[list[tuple[Any, tuple]], list[float]]:
    """One `train_one` job per architecture, with its cost (memory_pool.training_cost)."""
    _check_lrs(kinds, t)
    jobs = [(train_one, (kind, vocab, seq_len, train, t, window)) for kind in kinds]
    return jobs, [training_cost(kind, t.steps, t.batch_size, seq_len) for kind in kinds]


def _trained(
    kinds: list[str], results: list, vocab: int, seq_len: int, t: MemoryTrainSettings, window: int | None = None
) -> dict[str, tuple[nn.Module, dict]]:
    """The `_training_jobs` outcomes as modules (in eval mode) with their training info, by architecture."""
    out = {}
    for kind, (weights, info) in zip(kinds, results):
        torch.manual_seed(t.seed)
        model = build_model(kind, vocab, seq_len, t, window)
        weights_in(model, weights)
        model.eval()
        out[kind] = (
            model,
            {
                "model": kind,
                "parameters": count_parameters(model),
                "state_size": state_size(model, seq_len),
                "train_seconds": info["seconds"],
                "first_loss": info["first_loss"],
                "final_loss": info["final_loss"],
                "train_steps": info["steps"],
                "solved_at": info["solved_at"],
            },
        )
    return out


def delay_study(s: DelaySettings) -> MemoryResult:
    """Accuracy against delay for each architecture, and the gradient reaching the symbol's position from
    the query's loss in the trained models: one model per architecture and delay (training: per_delay),
    or one per architecture trained on every delay at once (mixed)."""
    return run_studies({"delay": plan_delay(s)})["delay"]


def plan_delay(s: DelaySettings) -> StudyPlan[MemoryResult]:
    """`delay_study` as its trainings and what makes its result of them (memory_pool.run_studies)."""
    return _plan_delay_mixed(s) if s.training == "mixed" else _plan_delay_per_delay(s)


def _gradient_row(kind: str, d: int, g: np.ndarray, seq_len: int) -> dict:
    return {
        "model": kind,
        "delay": d,
        "grad_norm": float(g[seq_len - 1 - d]),
        "relative_to_last": float(g[seq_len - 1 - d] / max(g[-1], 1e-30)),
    }


def _delay_result(
    s: DelaySettings,
    rows: list[dict],
    models: list[dict],
    grads: list[dict],
    gradient_figure: Figure,
    val_sequences: int,
) -> MemoryResult:
    chance = 1.0 / s.n_symbols
    figures = {
        "delay_accuracy": plot_accuracy(
            rows,
            "delay",
            "delay (positions between the symbol and the query)",
            f"Delayed recall ({s.training.replace('_', ' ')}): accuracy against delay",
            chance,
            log_x=True,
        ),
        "delay_gradients": gradient_figure,
    }
    return MemoryResult(
        rows,
        models,
        chance,
        {"gradients": grads, "delays": s.delays, "training": s.training, "val_sequences": val_sequences},
        figures,
    )


def _plan_delay_mixed(s: DelaySettings) -> StudyPlan[MemoryResult]:
    train = delay_task(s, s.train_sequences, s.seed)
    val = disjoint_validation(train, delay_task(s, s.val_per_delay * len(s.delays), s.seed + 1))
    jobs, costs = _training_jobs(s.models, s.vocab_size, s.seq_len, train, s.train)

    def finish(results: list) -> MemoryResult:
        return _delay_mixed_result(s, val, _trained(s.models, results, s.vocab_size, s.seq_len, s.train))

    return StudyPlan(jobs, costs, finish, s.workers, s.threads)


def _delay_mixed_result(s: DelaySettings, val: TaskData, trained: dict[str, tuple[nn.Module, dict]]) -> MemoryResult:
    rows, grads, curves = [], [], {}
    for kind, (model, _) in trained.items():
        correct = predictions(model, val)[:, -1]
        for d in s.delays:
            rows.append(
                {"model": kind, "by": "delay", "at": d, "delay": d, **accuracy_row(correct[val.condition == d])}
            )
        n = min(64, len(val))
        g = input_gradients(model, torch.from_numpy(val.x[:n]), torch.from_numpy(val.y[:n]))
        curves[kind] = g
        grads += [_gradient_row(kind, d, g, s.seq_len) for d in s.delays]
    r = _delay_result(s, rows, [m for _, m in trained.values()], grads, plot_gradients(curves, s.delays), len(val))
    r.trained = {kind: model for kind, (model, _) in trained.items()}
    return r


MIN_DELAY_SEQ_LEN = 12  # n_noise ** 10 noise patterns at least: enough for validation disjoint from training


def delay_seq_len(s: DelaySettings, d: int) -> int:
    """Tokens per sequence when delay `d` is trained alone: d + 2 (noise, the symbol, d − 1 noise tokens, the
    query), so a model that cannot bridge the delay does not also pay for noise it never needs to read; at
    least MIN_DELAY_SEQ_LEN, so a short delay still has more distinct sequences than training draws; at
    most seq_len."""
    return min(s.seq_len, max(d + 2, MIN_DELAY_SEQ_LEN))


def _one_delay(s: DelaySettings, d: int) -> DelaySettings:
    """The settings of delay `d` trained alone (sequences of delay_seq_len tokens)."""
    return s.model_copy(update={"delays": [d], "seq_len": delay_seq_len(s, d)})


def _one_delay_data(s: DelaySettings, d: int) -> tuple[TaskData, TaskData]:
    """Training and (disjoint) validation sequences of delay `d` alone; the seeds differ per delay."""
    one = _one_delay(s, d)
    train = delay_task(one, s.train_sequences, s.seed + 1000 * d)
    return train, disjoint_validation(train, delay_task(one, s.val_per_delay, s.seed + 1000 * d + 1))


def _train_one_delay(kind: str, d: int, s: DelaySettings):
    """Train one architecture on delay `d` alone (its data drawn here, in the worker): weights and info."""
    return train_one(kind, s.vocab_size, delay_seq_len(s, d), _one_delay_data(s, d)[0], s.train, None)


def _plan_delay_per_delay(s: DelaySettings) -> StudyPlan[MemoryResult]:
    _check_lrs(s.models, s.train)
    keys = [(kind, d) for kind in s.models for d in s.delays]
    jobs: list[tuple[Any, tuple]] = [(_train_one_delay, (kind, d, s)) for kind, d in keys]
    costs = [training_cost(kind, s.steps, s.batch_size, delay_seq_len(s, d)) for kind, d in keys]

    def finish(done: list) -> MemoryResult:
        return _delay_per_delay_result(s, dict(zip(keys, done)))

    return StudyPlan(jobs, costs, finish, s.workers, s.threads)


def _delay_per_delay_result(s: DelaySettings, results: dict[tuple[str, int], Any]) -> MemoryResult:
    rows, models, grads, n_val, modules = [], [], [], 0, {}
    for d in s.delays:
        _, val = _one_delay_data(s, d)
        n_val += len(val)
        T = delay_seq_len(s, d)
        for kind in s.models:
            weights, info = results[(kind, d)]
            torch.manual_seed(s.seed)
            model = build_model(kind, s.vocab_size, T, s.train)
            weights_in(model, weights)
            model.eval()
            modules[(kind, d)] = model
            rows.append(
                {"model": kind, "by": "delay", "at": d, "delay": d, **accuracy_row(predictions(model, val)[:, -1])}
            )
            n = min(64, len(val))
            g = input_gradients(model, torch.from_numpy(val.x[:n]), torch.from_numpy(val.y[:n]))
            grads.append(_gradient_row(kind, d, g, T))
            models.append(
                {
                    "model": kind,
                    "delay": d,
                    "seq_len": T,
                    "parameters": count_parameters(model),
                    "state_size": state_size(model, T),
                    "train_seconds": info["seconds"],
                    "first_loss": info["first_loss"],
                    "final_loss": info["final_loss"],
                    "train_steps": info["steps"],
                    "solved_at": info["solved_at"],
                }
            )
    rows.sort(key=lambda r: (s.models.index(r["model"]), r["delay"]))
    r = _delay_result(s, rows, models, grads, plot_gradients_by_delay(grads), n_val)
    r.trained = modules
    return r


def receptive_field(model: nn.Module) -> int | None:
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "attention", None) != "sliding_window":
        return None
    return cfg.n_layer * (cfg.window - 1) + 1


def recall_study(s: RecallSettings) -> MemoryResult:
    """MQAR accuracy against the number of pairs and against key-query distance for each
    architecture (trained on all pair counts at once); the window model's receptive field."""
    return run_studies({"recall": plan_recall(s)})["recall"]


def plan_recall(s: RecallSettings) -> StudyPlan[MemoryResult]:
    """`recall_study` as its trainings and what makes its result of them (memory_pool.run_studies)."""
    train = recall_task(s, s.train_sequences, s.seed, s.trained_pairs)
    val = disjoint_validation(train, recall_task(s, s.val_per_pairs * len(s.pairs), s.seed + 1))
    jobs, costs = _training_jobs(s.models, s.vocab_size, s.seq_len, train, s.train, s.window)

    def finish(results: list) -> MemoryResult:
        return _recall_result(s, val, _trained(s.models, results, s.vocab_size, s.seq_len, s.train, s.window))

    return StudyPlan(jobs, costs, finish, s.workers, s.threads)


def _recall_result(s: RecallSettings, val: TaskData, trained: dict[str, tuple[nn.Module, dict]]) -> MemoryResult:
    rows, fields = [], {}
    edges = [0] + s.distance_buckets
    asked = val.y != IGNORE_INDEX
    for kind, (model, info) in trained.items():
        ok = predictions(model, val)
        rf = receptive_field(model)
        info["receptive_field"] = rf
        if rf is not None:
            fields[kind] = rf
        for p in s.pairs:
            sel = asked & (val.condition == p)[:, None]
            rows.append({"model": kind, "by": "pairs", "at": p, "pairs": p, **accuracy_row(ok[sel])})
        for lo, hi in zip(edges, edges[1:]):
            sel = asked & (val.distance > lo) & (val.distance <= hi)
            rows.append(
                {
                    "model": kind,
                    "by": "distance",
                    "at": hi,
                    "distance": hi,
                    "distance_from": lo + 1,
                    **accuracy_row(ok[sel]),
                }
            )
        if rf is not None:
            # the value sits one after its key, at distance d - 1 from the query: visible while d - 1 < rf
            for where, sel in (("within", asked & (val.distance <= rf)), ("beyond", asked & (val.distance > rf))):
                rows.append({"model": kind, "by": "field", "at": where, **accuracy_row(ok[sel])})
    chance = 1.0 / s.n_values
    marks = {f"{k} field {v}": v for k, v in fields.items()}
    figures = {
        "recall_by_pairs": plot_accuracy(
            [r for r in rows if r["by"] == "pairs"],
            "pairs",
            "key-value pairs in the sequence",
            "Associative recall (MQAR): accuracy against pairs",
            chance,
            log_x=True,
        ),
        "recall_by_distance": plot_accuracy(
            [r for r in rows if r["by"] == "distance"],
            "distance",
            "key-query distance (bucket's upper edge)",
            "Associative recall: accuracy against distance",
            chance,
            log_x=True,
            marks=marks,
        ),
    }
    return MemoryResult(
        rows,
        [m for _, m in trained.values()],
        chance,
        {"pairs": s.pairs, "receptive_fields": fields, "val_sequences": len(val)},
        figures,
    )
