"""The ablation study's tables as markdown: the runs, the permutation and √d-scaling checks, the
parameters per component and the residual depth study (components/core/studies/ablations.py runs
the study). A leaf module."""

from __future__ import annotations

__all__ = ["ablation_markdown", "accounting_markdown", "depth_markdown", "permutation_markdown", "scaling_markdown"]


def ablation_markdown(rows: list[dict]) -> str:
    head = (
        "| run | change | vs | params | val loss | Δ val loss | val ppl | attn entropy | tokens/s |\n"
        "|---|---|---|---:|---:|---:|---:|---:|---:|"
    )
    lines = [
        f"| {r['run']} | {r['change']} | {r['baseline'] or '—'} | {r['params']:,} | {r['val_loss']:.4f} | "
        f"{r['delta_val_loss']:+.4f} | {r['val_ppl']:.2f} | {r['attn_entropy']:.3f} | {r['tokens_per_s']:,.0f} |"
        for r in rows
    ]
    return "### Ablations\n\n" + "\n".join([head, *lines])


def permutation_markdown(p: dict) -> str:
    return (
        "### Permutation equivariance (我爱你 vs 你爱我)\n\n"
        "| positional encoding | rel. error, bidirectional | rel. error, reversal | rel. error, causal | equivariant "
        "|\n|---|---:|---:|---:|---|\n"
        + "\n".join(
            f"| {v['pos_encoding']} | {v['max_rel_err']:.2e} | {v['reversal_rel_err']:.2e} | "
            f"{v['causal_max_rel_err']:.2e} | {v['equivariant']} |"
            for v in p.values()
        )
    )


def scaling_markdown(s: dict) -> str:
    rows = [
        f"| model at init (d_head={s['head_dim']}) | {s['scaled']['normalized_entropy']:.3f} | "
        f"{s['unscaled']['normalized_entropy']:.3f} | "
        f"{s['scaled']['score_std']:.3f} / {s['unscaled']['score_std']:.3f} | {s['scaled']['grad_norm']:.3f} / "
        f"{s['unscaled']['grad_norm']:.3f} |"
    ] + [
        f"| unit-variance q, k (d={u['head_dim']}) | {u['entropy_scaled']:.3f} | {u['entropy_unscaled']:.3f} | "
        f"— | {u['score_grad_rms_scaled']:.2e} / {u['score_grad_rms_unscaled']:.2e} (score grad RMS) |"
        for u in s["unit_variance"]
    ]
    return (
        "### √d scaling at init\n\nNormalised softmax entropy (1 = uniform, 0 = one-hot).\n\n"
        "| probe | entropy scaled | entropy unscaled | score std scaled / unscaled | grad norm scaled / unscaled "
        "|\n|---|---:|---:|---:|---:|\n" + "\n".join(rows)
    )


def accounting_markdown(a: dict) -> str:
    lines = [f"| {k} | {v:,} | {v / a['total']:.1%} |" for k, v in a["components"].items()]
    return (
        f"### Parameters per component ({a['n_layer']} layers, width {a['n_embd']}, vocab {a['vocab_size']}, "
        f"tied={a['tied']})\n\n"
        "| component | parameters | share of total |\n|---|---:|---:|\n"
        + "\n".join(lines)
        + f"\n| **total** | {a['total']:,} | 100% |\n\n"
        f"Non-embedding parameters (all but the token and position tables): {a['non_embedding']:,}. "
        f"FFN share of the blocks' parameters (attention + FFN + norms, {a['blocks']:,}): **{a['ffn_share']:.1%}** "
        f"(formula 2m/(2m+4) = {a['ffn_share_formula']:.1%}; the article's \"about two thirds\": "
        f"{a['about_two_thirds']})."
    )


def depth_markdown(depth: list[dict]) -> str:
    if not depth:
        return ""
    lines = [
        "### Depth with and without residual connections (same budget)",
        "",
        "| n_layer | residual | val loss | first-layer grad norm at init | after training |",
        "|---:|---|---:|---:|---:|",
    ]
    lines += [
        f"| {r['n_layer']} | {'yes' if r['residual'] else 'no'} | {r['val_loss']:.4f} | "
        f"{r['first_layer_grad_norm_init']:.3g} | "
        f"{r['first_layer_grad_norm_trained']:.3g} |"
        for r in depth
    ]
    return "\n".join(lines)
