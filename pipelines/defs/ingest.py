"""Ingest stage: corpus → tokenizer → next-token labels."""

from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from components.core.artifacts import sha256_file
from components.core.corpus import CorpusSettings, build_corpus, load_corpus
from components.core.data import TokenBlocks
from components.core.errors import PipelineInputError
from components.core.labels import LabelSettings, build_labels, check_blocks, load_labels
from components.core.manifests import Corpus, Labels, Tokenizer
from components.core.tokenizer import (
    TokenizerReport,
    TokenizerSettings,
    encode,
    evaluate_tokenizer,
    roundtrip_ok,
    train_tokenizer,
)
from components.orchestration.stage import Stage, stage
from components.orchestration.state import state_root
from components.orchestration.tracking import MlflowTracker

GROUP = "ingest"
ROUNDTRIP_PROBES = ["苹果公司发布了新手机，它的市值大涨。", "我爱你", "你爱我", "Hello, world!\n\tTabs  and  spaces."]
SPLITS = ("train", "validation")


class CorpusConfig(dg.Config, CorpusSettings):
    """Which documents to read and how to split them."""


class TokenizerConfig(dg.Config, TokenizerSettings):
    """The language-model tokenizer. The pipeline's default is bytes: byte-level BPE with no merges
    (260 = 256 byte symbols + 4 special tokens). At about 1 M training tokens a model (500 steps of
    16 × 128) every neural model beats the Kneser–Ney trigram over bytes, and none beats it
    over BPE-2048 or BPE-512, where two tokens span 4–6 characters
    (`benchmarks/results/lm_vs_ngram_tokenizers_*.json`; docs/results.md)."""

    vocab_size: int = Field(
        default=260,
        description="Largest vocabulary, special tokens included (260 with kind 'bpe': bytes, no merges).",
    )


class LabelsConfig(dg.Config, LabelSettings):
    """Packing of the next-token blocks."""


def numbers(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


@dg.asset(group_name=GROUP, kinds={"datasets"})
def corpus(context: dg.AssetExecutionContext, config: CorpusConfig, mlflow: MlflowTracker) -> dg.Output[Corpus]:
    """Documents cleaned to plain text, split by document into train/validation, saved as Arrow."""
    with stage(context, mlflow, config.model_dump()) as s:
        result = build_corpus(config, s.tmp / "dataset", cache_dir=state_root() / "cache" / "datasets")
        stats = numbers(result.stats)
        return s.publish(
            Corpus(path=s.final_path(s.tmp / "dataset"), **stats, content_sha256=result.stats["content_sha256"]),
            metrics=stats,
            texts={"samples": "\n".join(f"> {line}" for line in result.samples)},
            files={"dataset": s.tmp / "dataset"},
            values={"content_sha256": result.stats["content_sha256"]},
            warnings=result.stats.get("warnings"),
        )


def tokenizer_healthy_spec(asset: str) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(
        "tokenizer_is_healthy",
        asset=asset,
        description="The tokenizer learned the vocabulary it was asked for and rarely falls back to [UNK].",
    )


def publish_tokenizer(
    s: Stage,
    tok: Any,
    report: TokenizerReport,
    kind: str,
    extra: dict[str, Any] | None = None,
    manifest: type[Tokenizer] = Tokenizer,
) -> tuple[dg.Output, dg.AssetCheckResult]:
    """Save `tok` as `tokenizer.json`, probe its round trip, publish it with `report`'s figures as a
    `manifest` (with the `extra` fields of that class); the output and its `tokenizer_is_healthy`
    check result (yield both, the output first)."""
    path = s.tmp / "tokenizer.json"
    tok.save(str(path))
    roundtrip = [
        {
            "text": t.replace("\n", "⏎").replace("\t", "⇥"),
            "tokens": len(encode(tok, t)),
            "exact_roundtrip": roundtrip_ok(tok, t),
        }
        for t in ROUNDTRIP_PROBES
    ]
    metrics = {**report.metrics(), "roundtrip_ok": float(all(r["exact_roundtrip"] for r in roundtrip))}
    warnings = list(getattr(report, "warnings", []) or [])
    output = s.publish(
        manifest(
            path=s.final_path(path),
            kind=kind,
            sha256=sha256_file(path),
            vocab_size=tok.get_vocab_size(),
            **report.metrics(),
            **(extra or {}),
        ),
        metrics=metrics,
        tables={"roundtrip": roundtrip},
        files={"tokenizer": path},
        artifacts=[path],
        warnings=warnings,
    )
    check = dg.AssetCheckResult(
        check_name="tokenizer_is_healthy",
        passed=not warnings,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "warnings": dg.MetadataValue.md("\n".join(f"- {w}" for w in warnings) or "none"),
            **numbers(report.metrics()),
        },
    )
    return output, check


@dg.asset(group_name=GROUP, kinds={"tokenizers"}, check_specs=[tokenizer_healthy_spec("tokenizer")])
def tokenizer(context: dg.AssetExecutionContext, config: TokenizerConfig, corpus: Corpus, mlflow: MlflowTracker):
    """Tokenizer trained on the train split only; `tokenizer.json`."""
    with stage(context, mlflow, config.model_dump()) as s:
        dd = load_corpus(corpus.path)
        tok = train_tokenizer(dd["train"]["text"], config)
        report = evaluate_tokenizer(tok, dd["validation"]["text"], requested_vocab_size=config.vocab_size)
        output, check = publish_tokenizer(s, tok, report, config.kind)
    yield output
    yield check


@dg.asset(group_name=GROUP, kinds={"numpy"})
def labels(
    context: dg.AssetExecutionContext, config: LabelsConfig, corpus: Corpus, tokenizer: Tokenizer, mlflow: MlflowTracker
) -> dg.Output[Labels]:
    """Next-token blocks: X = tokens[:-1], Y = tokens[1:], padding targets -100; .npy per split."""
    with stage(context, mlflow, config.model_dump()) as s:
        dd = load_corpus(corpus.path)
        result = build_labels({split: dd[split]["text"] for split in SPLITS}, tokenizer.path, config, s.tmp)
        files = {f"{split}_{xy}": s.tmp / f"{split}_{xy}.npy" for split in SPLITS for xy in ("x", "y")}
        return s.publish(
            Labels(path=str(s.final), **numbers(result.meta), tokenizer_sha256=result.meta["tokenizer_sha256"]),
            metrics=numbers(result.meta),
            files={**files, "meta": s.tmp / "meta.json"},
            artifacts=[s.tmp / "meta.json"],
            values={"block_size": int(result.meta["block_size"]), "tokenizer_sha256": result.meta["tokenizer_sha256"]},
        )


@dg.asset_check(
    asset=labels, blocking=True, description="Y is X shifted by one in every block; no target crosses into padding."
)
def labels_are_shifted_inputs(labels: Labels) -> dg.AssetCheckResult:
    train, val, meta = load_labels(Path(labels.path))
    if not isinstance(train, TokenBlocks) or not isinstance(val, TokenBlocks):
        raise PipelineInputError(
            f"labels folder {labels.path} holds sharded labels; this check reads `labels`' own .npy arrays"
        )
    reports = {"train": check_blocks(train), "validation": check_blocks(val)}
    passed = all(r["ok"] for r in reports.values())
    metadata = {f"{split}_{k}": v for split, r in reports.items() for k, v in r.items()}
    return dg.AssetCheckResult(passed=passed, metadata=metadata)
