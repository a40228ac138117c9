"""Ingest stage: corpus → tokenizer → next-token labels."""


from pathlib import Path
from typing import Any

import dagster as dg

from components.core.corpus import CorpusSettings, build_corpus, load_corpus
from components.core.labels import LabelSettings, build_labels, check_blocks, load_labels
from components.core.tokenizer import TokenizerSettings, evaluate_tokenizer, roundtrip_ok, train_tokenizer

from components.orchestration.stage import stage
from components.orchestration.state import state_root
from components.orchestration.tracking import MlflowTracker

GROUP = "ingest"
ROUNDTRIP_PROBES = ["苹果公司发布了新手机，它的市值大涨。", "我爱你", "你爱我", "Hello, world!\n\tTabs  and  spaces."]


class CorpusConfig(dg.Config, CorpusSettings):
    """Which documents to read and how to split them."""


class TokenizerConfig(dg.Config, TokenizerSettings):
    """The language-model tokenizer (byte-level BPE by default)."""


class LabelsConfig(dg.Config, LabelSettings):
    """Packing of the next-token blocks."""


def _numbers(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


@dg.asset(group_name=GROUP, kinds={"datasets"}, io_manager_key="manifest_io")
def corpus(context: dg.AssetExecutionContext, config: CorpusConfig, mlflow: MlflowTracker) -> dg.Output[dict]:
    """Documents cleaned to plain text, split by document into train/validation, saved as Arrow."""
    with stage(context, mlflow, config.model_dump()) as s:
        result = build_corpus(config, s.tmp / "dataset", cache_dir=state_root() / "cache" / "datasets")
        s.run.log_metrics(_numbers(result.stats))
        s.run.log_text("\n".join(result.samples), "samples.txt")
        meta = {**_numbers(result.stats), "content_sha256": result.stats["content_sha256"]}
        meta["samples"] = dg.MetadataValue.md("\n".join(f"> {line}" for line in result.samples))
        meta.update(s.file_metadata("dataset", s.tmp / "dataset"))
        meta.update(s.run.metadata())
        manifest = {"path": s.final_path(s.tmp / "dataset"), **_numbers(result.stats), "content_sha256": result.stats["content_sha256"]}
    return dg.Output(manifest, metadata=meta)


def _train_tokenizer_asset(context, config: TokenizerSettings, corpus: dict, mlflow: MlflowTracker) -> dg.Output[dict]:
    with stage(context, mlflow, config.model_dump()) as s:
        dd = load_corpus(corpus["path"])
        tok = train_tokenizer(dd["train"]["text"], config)
        path = s.tmp / "tokenizer.json"
        tok.save(str(path))
        report = evaluate_tokenizer(tok, dd["validation"]["text"])
        roundtrip = {text: roundtrip_ok(tok, text) for text in ROUNDTRIP_PROBES}
        metrics = {**report.metrics(), "roundtrip_ok": float(all(roundtrip.values()))}
        s.run.log_metrics(metrics)
        s.run.log_artifact(path)
        meta = {**metrics, **s.file_metadata("tokenizer", path), **s.run.metadata()}
        meta["roundtrip"] = dg.MetadataValue.md(
            "| text | tokens | exact roundtrip |\n|---|---|---|\n"
            + "\n".join(
                f"| {t.replace(chr(10), '⏎').replace(chr(9), '⇥')} | {len(tok.encode(t, add_special_tokens=False).ids)} | {ok} |"
                for t, ok in roundtrip.items()
            )
        )
        manifest = {"path": s.final_path(path), "kind": config.kind, "sha256": meta["tokenizer_sha256"], **report.metrics()}
    return dg.Output(manifest, metadata=meta)


@dg.asset(group_name=GROUP, kinds={"tokenizers"}, io_manager_key="manifest_io")
def tokenizer(context: dg.AssetExecutionContext, config: TokenizerConfig, corpus: dict, mlflow: MlflowTracker) -> dg.Output[dict]:
    """Tokenizer trained on the train split only; `tokenizer.json`."""
    return _train_tokenizer_asset(context, config, corpus, mlflow)


@dg.asset(group_name=GROUP, kinds={"numpy"}, io_manager_key="manifest_io")
def labels(
    context: dg.AssetExecutionContext, config: LabelsConfig, corpus: dict, tokenizer: dict, mlflow: MlflowTracker
) -> dg.Output[dict]:
    """Next-token blocks: X = tokens[:-1], Y = tokens[1:], padding targets -100; .npy per split."""
    with stage(context, mlflow, config.model_dump()) as s:
        dd = load_corpus(corpus["path"])
        texts = {split: dd[split]["text"] for split in ("train", "validation")}
        result = build_labels(texts, tokenizer["path"], config, s.tmp)
        s.run.log_metrics(_numbers(result.meta))
        s.run.log_artifact(s.tmp / "meta.json")
        meta = {**_numbers(result.meta), "tokenizer_sha256": result.meta["tokenizer_sha256"]}
        for split in ("train", "validation"):
            meta.update(s.file_metadata(f"{split}_x", s.tmp / f"{split}_x.npy"))
        meta.update(s.run.metadata())
        manifest = {"path": str(s.final), **_numbers(result.meta), "tokenizer_sha256": result.meta["tokenizer_sha256"]}
    return dg.Output(manifest, metadata=meta)


@dg.asset_check(asset=labels, blocking=True, description="Y is X shifted by one in every block; no target crosses into padding.")
def labels_are_shifted_inputs(labels: dict) -> dg.AssetCheckResult:
    train, val, meta = load_labels(Path(labels["path"]))
    reports = {"train": check_blocks(train), "validation": check_blocks(val)}
    passed = all(r["ok"] for r in reports.values())
    metadata = {f"{split}_{k}": v for split, r in reports.items() for k, v in r.items()}
    return dg.AssetCheckResult(passed=passed, metadata=metadata)
