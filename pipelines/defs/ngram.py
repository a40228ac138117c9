"""`ngram_baseline`: the count model every language model must beat (interpolated Kneser–Ney bigram
and trigram over the training tokens, scored on the validation targets the models are scored on)."""

import dagster as dg

from components.core.labels import load_labels
from components.core.manifests import Labels, NgramBaseline
from components.core.studies.ngram import NgramSettings
from components.core.studies.ngram import ngram_baseline as run_ngram_baseline
from components.orchestration.stage import stage
from components.orchestration.tracking import MlflowTracker

GROUP = "baseline"


class NgramBaselineConfig(dg.Config, NgramSettings):
    """Orders and the context length (the language models' training block_size)."""


@dg.asset(group_name=GROUP, kinds={"numpy"})
def ngram_baseline(
    context: dg.AssetExecutionContext, config: NgramBaselineConfig, labels: Labels, mlflow: MlflowTracker
) -> dg.Output[NgramBaseline]:
    """Interpolated Kneser–Ney n-grams counted over the training labels, scored on every validation
    target at the models' block size: the loss a language model must beat to have learned more
    than counts."""
    with stage(context, mlflow, config.model_dump()) as s:
        train, val, meta = load_labels(labels.path)
        result = run_ngram_baseline(train, val, int(meta["vocab_size"]), NgramSettings(**config.model_dump()))
        best = result.best
        return s.publish(
            NgramBaseline(rows=result.rows, best=best, val_loss=best["val_loss"], block_size=result.block_size,
                          n_targets=result.n_targets, n_train_tokens=result.n_train_tokens,
                          vocab_size=result.vocab_size, tokenizer_sha256=labels.tokenizer_sha256),
            metrics=result.metrics(),
            tables={"ngram": [{k: v for k, v in r.items() if k != "discounts"} for r in result.rows]},
            texts={"summary": result.markdown()},
            values={"best": best["model"], "val_loss": best["val_loss"], "block_size": result.block_size,
                    "n_targets": result.n_targets},
        )
