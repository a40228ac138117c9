"""`ngram_baseline`: the count model every language model must beat (interpolated modified Kneser–Ney
n-grams of orders 1, 2, …, the order chosen on the held-out end of the training stream, every rung
scored on the validation targets the models are scored on)."""

import dagster as dg

from components.core.labels import load_labels
from components.core.manifests import Labels, NgramBaseline
from components.core.studies.ngram import NgramSettings
from components.core.studies.ngram import ngram_baseline as run_ngram_baseline
from components.orchestration.stage import stage
from components.orchestration.tracking import MlflowTracker

GROUP = "baseline"


class NgramBaselineConfig(dg.Config, NgramSettings):
    """The highest order, the held-out share that chooses the order, and the context length (the
    language models' training block_size)."""


@dg.asset(group_name=GROUP, kinds={"numpy"})
def ngram_baseline(
    context: dg.AssetExecutionContext, config: NgramBaselineConfig, labels: Labels, mlflow: MlflowTracker
) -> dg.Output[NgramBaseline]:
    """The count ladder, orders 1, 2, … counted over the training labels, the order chosen on the
    held-out end of the training stream ("the count model"), every rung scored on every validation
    target at the models' block size: the loss a language model must beat to have learned more
    than counts."""
    with stage(context, mlflow, config.model_dump()) as s:
        train, val, meta = load_labels(labels.path)
        result = run_ngram_baseline(train, val, int(meta["vocab_size"]), NgramSettings(**config.model_dump()))
        chosen = result.chosen
        return s.publish(
            NgramBaseline(
                rows=result.rows,
                chosen=chosen,
                val_loss=chosen.val_loss,
                block_size=result.block_size,
                n_targets=result.n_targets,
                n_heldout_targets=result.n_heldout_targets,
                n_train_tokens=result.n_train_tokens,
                vocab_size=result.vocab_size,
                tokenizer_sha256=labels.tokenizer_sha256,
            ),
            metrics=result.metrics(),
            tables={
                "ladder": [
                    {
                        "order": r.order,
                        "model": r.model,
                        "heldout_loss": r.heldout_loss,
                        "val_loss": r.val_loss,
                        "val_ppl": r.val_ppl,
                        "types": r.types,
                        "chosen": r.order == chosen.order,
                    }
                    for r in result.rows
                ]
            },
            texts={"summary": result.markdown()},
            values={
                "count_model": chosen.model,
                "chosen_order": chosen.order,
                "val_loss": chosen.val_loss,
                "heldout_loss": chosen.heldout_loss,
                "block_size": result.block_size,
                "n_targets": result.n_targets,
            },
        )
