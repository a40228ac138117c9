"""RNN vs LSTM vs Transformer on the same labels: at matched parameter budgets (the configs size
every model to one budget) and at matched wall-clock (each model's validation loss at the same
amount of training time, read off its own evaluation history)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from ..data import tokens_per_step
from ..manifests import LanguageModel, NgramBaseline, NgramRung
from ..plots import draw_count_ladder
from .ngram import ladder_position


def training_time_axis(history: list[dict]) -> list[tuple[float, float]]:
    """(cumulative training seconds, val loss) at each evaluation point of a training history.

    Training time is summed from the logged step times (step_ms × steps since the previous log
    point), so evaluation, logging and checkpointing are excluded, as in tokens/s.
    """
    points, elapsed, last_step = [], 0.0, 0
    for h in history:
        if "step_ms" in h:
            elapsed += h["step_ms"] / 1000 * (h["step"] - last_step)
            last_step = h["step"]
        if "val/loss" in h:
            points.append((elapsed, float(h["val/loss"])))
    return points


def tokens_axis(history: list[dict]) -> list[tuple[float, float]]:
    """(tokens seen, val loss) at each evaluation point; tokens per step read off the log points
    (tokens_per_s × step_ms), so the axis needs no settings."""
    per_step = next(
        (h["tokens_per_s"] * h["step_ms"] / 1000 for h in history if "tokens_per_s" in h and "step_ms" in h), None
    )
    if per_step is None:
        return []
    return [(h["step"] * per_step, float(h["val/loss"])) for h in history if "val/loss" in h]


def train_flops(m: LanguageModel) -> float | None:
    """The training FLOPs a model spent: steps × tokens per step × its FLOPs per token (None when a
    figure is missing)."""
    met, ts = m.metrics, m.train_settings or {}
    steps, per_token, batch, block = (
        met.get("steps"),
        met.get("flops_per_token"),
        ts.get("batch_size"),
        m.context_length,
    )
    if not (steps and per_token and batch and block):
        return None
    return float(steps) * tokens_per_step(batch, block, ts.get("grad_accum")) * float(per_token)


def flops_axis(history: list[dict], flops_per_token: float | None) -> list[tuple[float, float]]:
    """(training FLOPs spent, val loss) at each evaluation point: tokens seen × the model's training
    FLOPs per token (empty without the figure)."""
    if not flops_per_token:
        return []
    return [(n * flops_per_token, loss) for n, loss in tokens_axis(history)]


def ranked_tiers(losses: dict[str, float], tolerance: dict[str, float] | None = None) -> list[list[str]]:
    """Models sorted by loss, in tiers: a model joins the tier of the one before it when their losses
    differ by no more than the larger of the two models' tolerance (their seed-to-seed spread), so an
    order inside a tier is noise, not a finding. Without tolerances every model is its own tier."""
    tolerance = tolerance or {}
    tiers: list[list[str]] = []
    prev = None
    for name in sorted(losses, key=lambda n: losses[n]):
        tol = max(tolerance.get(name, 0.0), tolerance.get(prev, 0.0)) if prev is not None else 0.0
        if prev is not None and losses[name] - losses[prev] <= tol:
            tiers[-1].append(name)
        else:
            tiers.append([name])
        prev = name
    return tiers


def tiers_text(tiers: list[list[str]]) -> str:
    return " < ".join(t[0] if len(t) == 1 else "{" + ", ".join(sorted(t)) + "}" for t in tiers)


def ranking_settledness(
    curves: dict[str, list[tuple[float, float]]], spread: dict[str, float] | None = None
) -> dict[str, Any]:
    """The models ranked by validation loss at their last and at their second-to-last evaluation:
    a ranking that still changes between the two is not settled by this budget. With the models'
    seed-to-seed `spread`, models closer than it are tied (a tier), and the ranking is settled when
    the tiers no longer change (`ranking_settled_beyond_spread`). A model not retrained with other
    seeds is given the largest spread measured (seed noise at this data and budget; named in
    `spread_assumed_for`): two such models 0.001 apart are not ranked."""
    ok = {n: c for n, c in curves.items() if len(c) >= 2}
    last = sorted(ok, key=lambda n: ok[n][-1][1])
    previous = sorted(ok, key=lambda n: ok[n][-2][1])
    out: dict[str, Any] = {
        "ranking_last_eval": last,
        "ranking_previous_eval": previous,
        "ranking_settled": bool(ok) and last == previous,
    }
    if spread:
        assumed = sorted(n for n in ok if n not in spread)
        tolerance = {**{n: max(spread.values()) for n in assumed}, **spread}
        t_last = ranked_tiers({n: ok[n][-1][1] for n in ok}, tolerance)
        t_prev = ranked_tiers({n: ok[n][-2][1] for n in ok}, tolerance)
        norm = lambda tiers: [sorted(t) for t in tiers]  # noqa: E731
        out.update(
            {
                "spread_assumed_for": assumed,
                "tiers_last_eval": t_last,
                "tiers_previous_eval": t_prev,
                "ranking_settled_beyond_spread": bool(ok) and norm(t_last) == norm(t_prev),
            }
        )
    return out


def seed_spread(val_losses: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Per model, its final validation loss over seeds: mean, min, max and spread (max − min)."""
    return {
        n: {
            "seeds": len(v),
            "mean": float(np.mean(v)),
            "min": float(min(v)),
            "max": float(max(v)),
            "spread": float(max(v) - min(v)),
        }
        for n, v in val_losses.items()
        if v
    }


def parameter_split(model) -> dict[str, int]:
    """A model's parameters in three parts: the token (and position) embedding, the output head
    (0 when tied to the embedding: the same tensor is counted once, as embedding) and the core
    (everything between: recurrent cells, attention, FFN, norms). Their sum is the parameter count."""
    out = {"embedding": 0, "head": 0, "core": 0}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        part = "embedding" if name.split(".")[0] in ("wte", "wpe") else "head" if name.startswith("lm_head") else "core"
        out[part] += p.numel()
    out["total"] = sum(out.values())
    return out


def pair_verdicts(val_losses: dict[str, list[float]]) -> list[dict[str, Any]]:
    """For each pair of models (a, b) with their final validation losses over seeds: "better" when
    a's mean loss is below b's by more than the larger of their seed spreads (max − min over seeds),
    "worse" when above by more, else "tied". A model trained with one seed only is given the largest
    spread measured on the others (seed noise at this data and budget; `a_seeds`/`b_seeds` say so)."""
    out = []
    names = sorted(val_losses)
    measured = [max(v) - min(v) for v in val_losses.values() if len(v) > 1]
    assumed = max(measured) if measured else 0.0
    spread = {n: (max(v) - min(v)) if len(v) > 1 else assumed for n, v in val_losses.items()}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            la, lb = val_losses[a], val_losses[b]
            ma, mb = float(np.mean(la)), float(np.mean(lb))
            tol = max(spread[a], spread[b])
            diff = ma - mb
            verdict = "tied" if abs(diff) <= tol else ("better" if diff < 0 else "worse")
            out.append(
                {
                    "a": a,
                    "b": b,
                    "verdict": verdict,
                    "a_mean": ma,
                    "b_mean": mb,
                    "difference": diff,
                    "spread": tol,
                    "a_seeds": len(la),
                    "b_seeds": len(lb),
                }
            )
    return out


def loss_at_time(points: list[tuple[float, float]], t: float) -> float:
    """Validation loss at training time t: linear interpolation between evaluation points
    (before the first evaluation there is no measurement: NaN)."""
    if not points or t < points[0][0]:
        return float("nan")
    times, losses = zip(*points)
    return float(np.interp(t, times, losses))


@dataclass
class ComparisonResult:
    rows: list[dict[str, Any]]
    matched_time_s: float
    settledness: dict[str, Any] = field(default_factory=dict)
    seeds: dict[str, dict[str, float]] = field(
        default_factory=dict
    )  # seed_spread of the models retrained with other seeds
    figures: dict[str, Figure] = field(default_factory=dict)
    baseline: list[dict[str, Any]] = field(
        default_factory=list
    )  # the count ladder's rows (model, val_loss, count_model), on the same targets
    pairs: list[dict[str, Any]] = field(default_factory=list)  # pair_verdicts over seeds
    ladder: list[NgramRung] = field(default_factory=list)

    @property
    def count_model(self) -> dict[str, Any] | None:
        """The ladder's rung chosen on held-out data."""
        return next((r for r in self.baseline if r.get("count_model")), None)

    def markdown(self) -> str:
        cols = (
            ["model", "params"]
            + [c for c in ("params_embedding", "params_head", "params_core") if any(c in r for r in self.rows)]
            + [c for c in ("steps", "train_flops") if any(c in r for r in self.rows)]
            + ["val_loss", "val_ppl", "tokens_per_s_mean", "train_time_s", "val_loss_at_matched_time"]
        )
        cols += [c for c in ("val_loss_seed_mean", "val_loss_seed_spread") if any(c in r for r in self.rows)]
        head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"

        def fmt(v: Any) -> str:
            return (
                f"{v:,.0f}"
                if isinstance(v, (int, float)) and abs(v) >= 1000
                else (f"{v:.4g}" if isinstance(v, float) else str(v))
            )

        body = "\n".join("| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in self.rows)
        if self.baseline:  # the count models, scored on the same validation targets: rows of their own
            body += "\n" + "\n".join("| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in self.baseline)
        st = self.settledness
        settled = (
            f"\n\nRanking by validation loss at the last evaluation: {' < '.join(st.get('ranking_last_eval', []))}; at "
            f"the one "
            f"before: {' < '.join(st.get('ranking_previous_eval', []))} — "
            + (
                "settled."
                if st.get("ranking_settled")
                else "**still changing: train longer before trusting the order**."
            )
        )
        if "tiers_last_eval" in st:
            spread = ", ".join(f"{n} {v['spread']:.3f}" for n, v in self.seeds.items())
            settled += (
                f"\n\nSeed-to-seed spread of the final validation loss ({next(iter(self.seeds.values()))['seeds']} "
                f"seeds): "
                f"{spread}"
                + (
                    f" (assumed for {', '.join(st['spread_assumed_for'])}: the largest of these)"
                    if st.get("spread_assumed_for")
                    else ""
                )
                + f". Models closer than their spread are tied: {tiers_text(st['tiers_last_eval'])} at the last "
                f"evaluation, {tiers_text(st['tiers_previous_eval'])} at the one before — "
                + (
                    "settled beyond seed noise."
                    if st["ranking_settled_beyond_spread"]
                    else "**still changing beyond seed noise**."
                )
            )
        best = self.count_model
        if best is not None:
            settled += (
                "\n\nAgainst the count model ("
                + best["model"]
                + f", its order chosen on held-out training data; {best['val_loss']:.4f} on the same targets): "
                + ", ".join(
                    f"{r['model']} {best['val_loss'] - r.get('val_loss_seed_mean', r['val_loss']):+.3f}"
                    for r in self.rows
                )
                + " nats ahead. On the ladder: "
                + "; ".join(
                    f"{r['model']} {ladder_position(r.get('val_loss_seed_mean', r['val_loss']), self.ladder)}"
                    for r in self.rows
                )
                + "."
            )
        if self.pairs:
            settled += (
                "\n\nPairs, beyond the larger seed spread: "
                + "; ".join(
                    f"{p['a']} {p['verdict']} than {p['b']}"
                    if p["verdict"] != "tied"
                    else f"{p['a']} tied with {p['b']}"
                    for p in self.pairs
                )
                + "."
            )
        return (
            head
            + body
            + f"\n\nMatched wall-clock: validation loss after {self.matched_time_s:.1f} s of training each."
            + settled
        )

    def metrics(self) -> dict[str, float]:
        out = {
            "matched_time_s": self.matched_time_s,
            "ranking_settled": float(bool(self.settledness.get("ranking_settled"))),
        }
        if "ranking_settled_beyond_spread" in self.settledness:
            out["ranking_settled_beyond_spread"] = float(self.settledness["ranking_settled_beyond_spread"])
        best = self.count_model
        if best is not None:
            out["count_model/val_loss"] = float(best["val_loss"])
            for r in self.rows:
                out[f"{r['model']}/margin_over_count_model"] = float(best["val_loss"]) - float(
                    r.get("val_loss_seed_mean", r["val_loss"])
                )
        for r in self.rows:
            for k in (
                "val_loss",
                "val_ppl",
                "tokens_per_s_mean",
                "params",
                "val_loss_at_matched_time",
                "val_loss_seed_mean",
                "val_loss_seed_spread",
            ):
                if k in r:
                    out[f"{r['model']}/{k}"] = float(r[k])
        return out


def compare_models(
    models: dict[str, LanguageModel],
    seed_losses: dict[str, list[float]] | None = None,
    baseline: NgramBaseline | None = None,
) -> ComparisonResult:
    """`models`: name -> its language model's manifest (its metrics and eval history are read).
    `seed_losses`: name -> final validation losses of the same model trained with other seeds (the
    model's own run included); their spread decides which differences are beyond seed noise.
    `baseline`: the count ladder scored on the same validation targets: a row of the table and a line
    on every loss plot each rung, the count model (the order chosen on held-out data) marked."""
    spreads = seed_spread(seed_losses or {})
    curves = {name: training_time_axis(m.history) for name, m in models.items()}
    # The longest time every model reached: the fair budget for "who is better per second".
    matched = min((c[-1][0] for c in curves.values() if c), default=0.0)
    rows = []
    for name, m in models.items():
        met = m.metrics
        spent = train_flops(m)
        rows.append(
            {
                "model": name,
                "params": int(met["params"]),
                **({"steps": int(met["steps"])} if "steps" in met else {}),
                **({"train_flops": spent} if spent else {}),
                "val_loss": float(met["val/loss"]),
                "val_ppl": float(met["val/ppl"]),
                "tokens_per_s_mean": float(met["train/tokens_per_s_mean"]),
                "train_time_s": curves[name][-1][0] if curves[name] else float("nan"),
                "val_loss_at_matched_time": loss_at_time(curves[name], matched),
                **(
                    {
                        "seeds": spreads[name]["seeds"],
                        "val_loss_seed_mean": spreads[name]["mean"],
                        "val_loss_seed_spread": spreads[name]["spread"],
                    }
                    if name in spreads
                    else {}
                ),
            }
        )
    settledness = ranking_settledness(curves, {n: v["spread"] for n, v in spreads.items()} or None)
    base_rows = (
        [
            {
                "model": r.model,
                "params": 0,
                "val_loss": r.val_loss,
                "val_ppl": r.val_ppl,
                "count_model": r.order == baseline.chosen.order,
            }
            for r in baseline.rows
        ]
        if baseline
        else []
    )
    all_losses = {n: list(seed_losses[n]) if seed_losses and n in seed_losses else [models[n].val_loss] for n in models}
    result = ComparisonResult(
        rows=rows,
        matched_time_s=matched,
        settledness=settledness,
        seeds=spreads,
        baseline=base_rows,
        pairs=pair_verdicts(all_losses),
        ladder=list(baseline.rows) if baseline else [],
    )
    tokens = {name: tokens_axis(m.history) for name, m in models.items()}
    flops = {name: flops_axis(m.history, m.metrics.get("flops_per_token")) for name, m in models.items()}
    result.figures["comparison"] = plot_comparison(curves, rows, matched, tokens, base_rows, flops)
    return result


def plot_comparison(
    curves: dict[str, list[tuple[float, float]]],
    rows: list[dict],
    matched: float,
    tokens: dict[str, list[tuple[float, float]]] | None = None,
    baseline: list[dict] | None = None,
    flops: dict[str, list[tuple[float, float]]] | None = None,
) -> Figure:
    fig = Figure(figsize=(20, 4.2), layout="constrained")
    ax1, ax_tok, ax_fl, ax2 = fig.subplots(1, 4)
    for i, (name, pts) in enumerate(curves.items()):
        if pts:
            t, loss = zip(*pts)
            ax1.plot(t, loss, marker="o", ms=3, label=name, color=f"C{i}")
        if tokens and tokens.get(name):
            n, loss = zip(*tokens[name])
            ax_tok.plot(n, loss, marker="o", ms=3, label=name, color=f"C{i}")
        if flops and flops.get(name):
            f, loss = zip(*flops[name])
            ax_fl.plot(f, loss, marker="o", ms=3, label=name, color=f"C{i}")
    for a in (ax1, ax_tok, ax_fl):  # the count ladder: a line per rung on the three loss panels
        draw_count_ladder(a, [(b["model"], b["val_loss"], bool(b.get("count_model"))) for b in baseline or []])
    ax1.axvline(matched, color="grey", ls="--", lw=1)
    ax1.set_xlabel("training time (s)")
    ax1.set_ylabel("validation loss")
    ax1.set_title("Loss vs wall-clock")
    ax1.legend()
    ax_tok.set_xlabel("training tokens seen")
    ax_tok.set_ylabel("validation loss")
    ax_tok.set_title("Loss vs tokens")
    if ax_tok.get_legend_handles_labels()[0]:
        ax_tok.legend()
    ax_fl.set_xlabel("training FLOPs (flops_per_token × tokens)")
    ax_fl.set_ylabel("validation loss")
    ax_fl.set_title("Loss vs FLOPs")
    if ax_fl.get_legend_handles_labels()[0]:
        ax_fl.legend(fontsize=7)
    for a in (ax1, ax_tok, ax_fl):
        a.grid(True, alpha=0.3)
    names = [r["model"] for r in rows]
    ax2.bar(names, [r["tokens_per_s_mean"] for r in rows], color=[f"C{i}" for i in range(len(rows))])
    ax2.tick_params(axis="x", labelrotation=30)
    ax2.set_ylabel("training tokens / s")
    ax2.set_title(
        "Throughput (params: " + ", ".join(f"{r['model']} {r['params'] / 1e6:.2f}M" for r in rows) + ")", fontsize=8
    )
    return fig


def _train_seed(family, model_config, ts, train_data, val_data, vocab_size, out_dir, model_meta) -> float:
    """One retraining (in a worker or here): its final validation loss."""
    from ..lm import SamplingSettings, train_lm

    res = train_lm(
        family,
        model_config,
        ts,
        train_data,
        val_data,
        vocab_size,
        out_dir,
        sampling=SamplingSettings(num_samples=0),
        resume=False,
        model_meta=model_meta,
    )
    return float(res.metrics["val/loss"])


def train_other_seeds(
    models: dict[str, LanguageModel],
    seeds: list[int],
    train_data,
    val_data,
    vocab_size: int,
    out_dir,
    *,
    model_meta: dict | None = None,
    log=None,
    workers: int = 1,
) -> dict[str, list[float]]:
    """Each model trained again with each of `seeds` (its own seed skipped): the same family, resolved
    model settings, training settings and data, only the seed (initialisation and batch order)
    differs. Returns name -> final validation losses, the model's own run first.

    `models`: name -> its language model's manifest (family, model_config, train_settings and
    metrics are read); `log(str)` gets a line per run. `workers` > 1: the retrainings run side by side
    in that many processes with one torch thread each (components.core.workers; the losses are those
    of one thread, whatever `threads` the model trained with: a thread count changes the sums' order,
    not the recipe)."""
    from pathlib import Path

    from ..train_settings import TrainSettings
    from ..workers import cpu_workers, one_thread_each, run_jobs

    jobs, owners = [], []
    for name, m in models.items():
        # In process, whatever launched the model (launch settings are not TrainSettings; a seed is a seed in any
        # world size).
        own = TrainSettings(**{k: v for k, v in m.train_settings.items() if k in TrainSettings.model_fields})
        workers = cpu_workers(workers, own.device)
        for seed in seeds:
            if seed == own.seed:
                continue
            jobs.append(
                (
                    m.family,
                    m.model_config,
                    # Scored once, at the end (eval_interval 0): only the final loss is kept, and an evaluation
                    # changes nothing the training draws or computes.
                    one_thread_each(own.model_copy(update={"seed": seed, "eval_interval": 0}), workers),
                    train_data,
                    val_data,
                    vocab_size,
                    Path(out_dir) / name / str(seed),
                    model_meta,
                )
            )
            owners.append((name, seed, own.seed))
    losses = run_jobs(_train_seed, jobs, workers, threads=1)
    out: dict[str, list[float]] = {name: [m.val_loss] for name, m in models.items()}
    for (name, seed, own_seed), loss in zip(owners, losses):
        out[name].append(loss)
        if log:
            log(f"{name} seed {seed}: val loss {loss:.4f} (seed {own_seed}: {out[name][0]:.4f})")
    return out
