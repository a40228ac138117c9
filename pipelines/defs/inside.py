"""Inside the trained Transformer: what each head attends to (and whether several heads matter), and
the FFN's neurons as key-value memories, probed on facts and on made-up entities.

    transformer_lm, transformer_1head_lm, labels, tokenizer ──► attention_heads
    transformer_lm, labels, tokenizer, corpus ──► ffn_memories
"""

import dagster as dg

from components.core.corpus import load_corpus
from components.core.labels import load_labels
from components.core.lm import load_lm
from components.core.studies.inside import InsideSettings, attention_heads as run_attention_heads, ffn_memories as run_ffn_memories, known_words
from components.core.tokenizer import load_tokenizer
from components.orchestration.stage import stage
from components.orchestration.tracking import MlflowTracker

GROUP = "inside"


class InsideConfig(dg.Config, InsideSettings):
    """Sentences, thresholds and sizes of the look inside the Transformer."""


def _codec(tokenizer: dict):
    tok = load_tokenizer(tokenizer["path"])
    return (lambda ids: tok.decode(ids, skip_special_tokens=False)), (lambda text: tok.encode(text, add_special_tokens=False).ids)


@dg.asset(group_name=GROUP, kinds={"pytorch"})
def attention_heads(
    context: dg.AssetExecutionContext, config: InsideConfig, transformer_lm: dict, transformer_1head_lm: dict, labels: dict,
    tokenizer: dict, mlflow: MlflowTracker,
) -> dg.Output[dict]:
    """Attention maps per layer and head; each head's share of attention on the previous, first and
    same token, mean distance and entropy over validation text, and its class (thresholds in the
    config); the loss increase when each head is zeroed; the model against its one-head twin."""
    with stage(context, mlflow, config.model_dump()) as s:
        _, val, _ = load_labels(labels["path"])
        decode, encode = _codec(tokenizer)
        r = run_attention_heads(load_lm(transformer_lm["weights"]), val, config, decode=decode, encode=encode,
                                one_head=load_lm(transformer_1head_lm["weights"]))
        metrics = r.metrics()
        thresholds = {k: getattr(config, k) for k in ("prev_threshold", "first_threshold", "self_threshold", "local_distance")}
        return s.publish(
            {"heads": r.heads, "ablation": r.ablation, "base_loss": r.base_loss, "one_head_loss": r.one_head_loss,
             "thresholds": thresholds, "metrics": metrics},
            metrics=metrics,
            tables={"heads": r.heads},
            figures=r.figures,
            values={"thresholds": dg.MetadataValue.json(thresholds)},
        )


@dg.asset_check(
    asset=attention_heads,
    description="Attention weights are a distribution per query (each row sums to 1 within 1e-5), and the heads do not all do one "
    "thing: at least two head classes, and zeroing some head costs more than 0.01 nats.",
)
def heads_differ(attention_heads: dict) -> dg.AssetCheckResult:
    m = attention_heads["metrics"]
    kinds = {h["kind"] for h in attention_heads["heads"]}
    checks = {"rows_sum_to_one": m["heads/max_row_sum_error"] < 1e-5, "several_head_classes": len(kinds) >= 2,
              "some_head_matters": m["heads/max_ablation_increase"] > 0.01}
    return dg.AssetCheckResult(passed=all(checks.values()), severity=dg.AssetCheckSeverity.WARN,
                               metadata={**checks, "classes": ", ".join(sorted(kinds)), **{k.replace("/", "_"): v for k, v in m.items()}})


@dg.asset(group_name=GROUP, kinds={"pytorch"})
def ffn_memories(
    context: dg.AssetExecutionContext, config: InsideConfig, transformer_lm: dict, labels: dict, tokenizer: dict, corpus: dict,
    mlflow: MlflowTracker,
) -> dg.Output[dict]:
    """FFN neurons as key-value memories: the most selective neurons' top contexts and promoted tokens;
    the fact probe (the neurons that most raise a confident answer's logit, zeroed, against as many
    random ones); the model's confidence on the same prompts about made-up entities."""
    with stage(context, mlflow, config.model_dump()) as s:
        _, val, _ = load_labels(labels["path"])
        decode, encode = _codec(tokenizer)
        dd = load_corpus(corpus["path"])
        known = known_words(t for split in dd for t in dd[split]["text"])
        r = run_ffn_memories(load_lm(transformer_lm["weights"]), val, config, decode=decode, encode=encode, known=known)
        metrics = r.metrics()
        probe = [{k: v for k, v in p.items() if k != "_neurons"} for p in r.probe]
        neurons = [{**n, "key_contexts": " | ".join(n["key_contexts"]), "value_tokens": " ".join(repr(t) for t in n["value_tokens"])} for n in r.neurons]
        return s.publish(
            {"neurons": r.neurons, "probe": probe, "made_up": r.gap, "metrics": metrics},
            metrics=metrics,
            tables={"neurons": neurons, "fact_probe": [{**p, "top_neurons": " ".join(p["top_neurons"])} for p in probe], "made_up": r.gap},
            figures=r.figures,
        )


@dg.asset_check(
    asset=ffn_memories,
    description="The attributed neurons carry the facts: zeroing the top-k lowers the answers' mean probability more than zeroing "
    "k random neurons of the same layers (figures reported whatever they are).",
)
def fact_neurons_matter(ffn_memories: dict) -> dg.AssetCheckResult:
    m = ffn_memories["metrics"]
    ok = bool(ffn_memories["probe"]) and m["ffn/p_top_k_zeroed_mean"] < m["ffn/p_random_k_zeroed_mean"]
    return dg.AssetCheckResult(passed=ok, severity=dg.AssetCheckSeverity.WARN, metadata={k.replace("/", "_"): v for k, v in m.items()})
