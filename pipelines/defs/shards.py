"""The sharded route: a corpus given as many files or dump shards, one partition per shard.

    shard files ──► corpus_shards[key] ──► label_shards[key] ──┐
        └─ first N ──► shard_tokenizer ─────────┘               ├──► sharded_labels ──► transformer_shards_lm
                                                               ─┘    (one memory-mapped view over every shard)

`corpus_shards` and `label_shards` are partitioned by one dynamic partition per shard file of the
`shards` resource's folder; the `shard_sensor` adds a partition for every new shard and requests
its run (the tokenizer first, once). Each partition reads, cleans, tokenizes and packs only its own
shard, so a step's memory does not grow with the corpus. These assets form the `shards` group,
which the whole-graph config jobs leave out (a partitioned asset needs a partition key that "the
whole graph" does not have); the group has its own jobs, launched by the sensor or by hand.
"""

import json
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field

from components.core.artifacts import file_info
from components.core.errors import PipelineInputError
from components.core.labels import SPLITS, LabelSettings
from components.core.manifests import CorpusShard, LabelShard, ShardedLabels, ShardTokenizer
from components.core.shards import build_corpus_shard, build_label_shard, combine_label_shards, train_shard_tokenizer
from components.core.tokenizer import TokenizerSettings
from components.orchestration.shards import SHARD_GROUP, SHARD_PARTITIONS, SHARD_PARTITIONS_NAME, ShardFolder
from components.orchestration.stage import stage
from components.orchestration.state import PROJECT_ROOT, state_root
from components.orchestration.tracking import MlflowTracker

from .ingest import numbers, publish_tokenizer, tokenizer_healthy_spec

SHARD_CONFIG = PROJECT_ROOT / "configs" / "shards" / "default.yaml"  # the route's settings (its jobs' launchpad)
SENSOR_TAG = "pipeline/shards"  # tag of the runs the sensor requests: ingest, tokenizer or combine


class ShardTokenizerConfig(dg.Config, TokenizerSettings):
    """The tokenizer of the sharded corpus, trained once on a bounded sample of shards."""

    sample_shards: int = Field(
        default=4, ge=1, description="Train on the train split of the first this many shards (by key)."
    )


class ShardLabelsConfig(dg.Config, LabelSettings):
    """Packing of each shard's next-token blocks (one block size for every shard)."""


def _shard_file(shards: ShardFolder, key: str) -> Path:
    files = shards.shards()
    if key not in files:
        raise PipelineInputError(
            f"shard '{key}' is not in the shard folder {shards.folder()} (removed or renamed?): put it back, or delete "
            "its partition of `corpus_shards`"
        )
    return files[key]


@dg.asset(group_name=SHARD_GROUP, partitions_def=SHARD_PARTITIONS, kinds={"datasets"})
def corpus_shards(
    context: dg.AssetExecutionContext, shards: ShardFolder, mlflow: MlflowTracker
) -> dg.Output[CorpusShard]:
    """One shard's documents cleaned to plain text and split by document into train/validation (Arrow)."""
    key = context.partition_key
    path = _shard_file(shards, key)
    read = shards.read_settings()
    with stage(context, mlflow, {"shard": key, "file": str(path), **read.model_dump()}) as s:
        source = file_info(path)
        result = build_corpus_shard(path, read, s.tmp / "dataset", cache_dir=state_root() / "cache" / "datasets")
        stats = numbers(result.stats)
        return s.publish(
            CorpusShard(
                path=s.final_path(s.tmp / "dataset"),
                shard=key,
                source=source,
                **stats,
                content_sha256=result.stats["content_sha256"],
            ),
            metrics=stats,
            files={"dataset": s.tmp / "dataset"},
            values={
                "shard_file": dg.MetadataValue.path(source["path"]),
                "shard_sha256": source["sha256"],
                "shard_bytes": source["bytes"],
                "content_sha256": result.stats["content_sha256"],
            },
            warnings=result.stats.get("warnings"),
        )


@dg.asset(group_name=SHARD_GROUP, kinds={"tokenizers"}, check_specs=[tokenizer_healthy_spec("shard_tokenizer")])
def shard_tokenizer(
    context: dg.AssetExecutionContext, config: ShardTokenizerConfig, shards: ShardFolder, mlflow: MlflowTracker
):
    """The tokenizer of the sharded corpus: trained once, on the train split of the first
    `sample_shards` shards by key (each read and split as `corpus_shards` does), evaluated on their
    validation split; `tokenizer.json`."""
    files = shards.shards()
    sample = dict(list(files.items())[: config.sample_shards])
    settings = TokenizerSettings(**config.model_dump(exclude={"sample_shards"}))
    with stage(context, mlflow, config.model_dump()) as s:
        scratch = state_root() / "cache"
        scratch.mkdir(parents=True, exist_ok=True)
        tok, report, trained_on = train_shard_tokenizer(sample, shards.read_settings(), settings, scratch)
        output, check = publish_tokenizer(
            s, tok, report, config.kind, extra={"trained_on": trained_on}, manifest=ShardTokenizer
        )
    yield output
    yield check


@dg.asset(group_name=SHARD_GROUP, partitions_def=SHARD_PARTITIONS, kinds={"numpy"})
def label_shards(
    context: dg.AssetExecutionContext,
    config: ShardLabelsConfig,
    corpus_shards: CorpusShard,
    shard_tokenizer: ShardTokenizer,
    mlflow: MlflowTracker,
) -> dg.Output[LabelShard]:
    """One shard's next-token blocks (as `labels` packs them, from that shard's documents alone): .npy per split."""
    with stage(context, mlflow, {"shard": context.partition_key, **config.model_dump()}) as s:
        result = build_label_shard(corpus_shards.path, shard_tokenizer.path, config, s.tmp)
        files = {f"{split}_{xy}": s.tmp / f"{split}_{xy}.npy" for split in SPLITS for xy in ("x", "y")}
        return s.publish(
            LabelShard(
                path=str(s.final),
                shard=context.partition_key,
                **numbers(result.meta),
                tokenizer_sha256=result.meta["tokenizer_sha256"],
            ),
            metrics=numbers(result.meta),
            files={**files, "meta": s.tmp / "meta.json"},
            values={"block_size": int(result.meta["block_size"]), "tokenizer_sha256": result.meta["tokenizer_sha256"]},
        )


@dg.asset(
    group_name=SHARD_GROUP,
    kinds={"numpy"},
    ins={"label_shards": dg.AssetIn(partition_mapping=dg.AllPartitionMapping())},
)
def sharded_labels(
    context: dg.AssetExecutionContext,
    label_shards: dict[str, LabelShard],
    shard_tokenizer: ShardTokenizer,
    mlflow: MlflowTracker,
) -> dg.Output[ShardedLabels]:
    """Every shard's token files listed in one `meta.json` (nothing copied), in key order:
    `load_labels` on it gives one memory-mapped view over all of them. The shards' files, with
    their recorded sizes and hashes, are in this manifest, so whoever reads it has them checked."""
    stale = sorted(k for k, m in label_shards.items() if m.tokenizer_sha256 != shard_tokenizer.sha256)
    if stale:
        shown = ", ".join(stale[:10]) + (f" and {len(stale) - 10} more" if len(stale) > 10 else "")
        raise PipelineInputError(
            f"label shard(s) {shown} were built with another tokenizer than the current `shard_tokenizer` "
            f"({shard_tokenizer.sha256[:12]}…): re-materialize those partitions of `label_shards` first"
        )
    with stage(context, mlflow, {"shards": len(label_shards)}) as s:
        result = combine_label_shards({k: m.path for k, m in label_shards.items()}, s.tmp)
        recorded = {f"{k}/{name}": m.files[name] for k, m in label_shards.items() for name in m.files if name != "meta"}
        totals = numbers(result.meta)
        return s.publish(
            ShardedLabels(
                path=str(s.final),
                **totals,
                tokenizer_sha256=result.meta["tokenizer_sha256"],
                shards={k: m.dagster_run_id for k, m in sorted(label_shards.items())},
            ),
            metrics=totals,
            files={"meta": s.tmp / "meta.json"},
            recorded_files=recorded,
            artifacts=[s.tmp / "meta.json"],
            values={"block_size": int(result.meta["block_size"]), "tokenizer_sha256": result.meta["tokenizer_sha256"]},
        )


# --- jobs and the sensor ------------------------------------------------------------------------------


def _job_config(ops: list[str]) -> dict[str, Any]:
    import yaml

    cfg = yaml.safe_load(SHARD_CONFIG.read_text()) or {}
    return {"ops": {k: v for k, v in (cfg.get("ops") or {}).items() if k in ops}}


shard_ingest_job = dg.define_asset_job(
    "shard_ingest",
    selection=dg.AssetSelection.assets(corpus_shards, label_shards),
    partitions_def=SHARD_PARTITIONS,
    config=_job_config(["corpus_shards", "label_shards"]),
    description="One shard: read and clean it (corpus_shards), tokenize and pack it (label_shards).",
)
shard_tokenizer_job = dg.define_asset_job(
    "shard_tokenizer_job",
    selection=dg.AssetSelection.assets(shard_tokenizer),
    config=_job_config(["shard_tokenizer"]),
    description="Train the sharded corpus's tokenizer on the first shards (once).",
)
combine_shards_job = dg.define_asset_job(
    "combine_shards",
    selection=dg.AssetSelection.assets(sharded_labels),
    description="List every shard's token files in one view (sharded_labels).",
)

IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def fingerprint(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size}-{st.st_mtime_ns}"


def _runs(instance: dg.DagsterInstance, kind: str, statuses: list | None = None, limit: int = 1) -> list:
    return list(instance.get_runs(dg.RunsFilter(tags={SENSOR_TAG: kind}, statuses=statuses or []), limit=limit))


@dg.sensor(
    name="shard_sensor",
    jobs=[shard_ingest_job, shard_tokenizer_job, combine_shards_job],
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Watches the shard folder (resource `shards`): a partition per new shard file, the tokenizer trained "
    "once, a run per new or changed shard, then sharded_labels once every shard is ingested.",
)
def shard_sensor(context: dg.SensorEvaluationContext, shards: ShardFolder) -> dg.SensorResult:
    """One tick: add a partition for every shard file that has none; if `shard_tokenizer` was never
    materialized, request it (once: a failed one is retried when the shard files change) and wait;
    else request `shard_ingest` for every shard that is new or changed since it was requested
    (cursor: key → size and mtime); when none is pending and every partition has its label shard,
    request `combine_shards` if a label shard is newer than `sharded_labels`."""
    instance = context.instance
    files = shards.shards()
    known = set(instance.get_dynamic_partitions(SHARD_PARTITIONS_NAME))
    new = [k for k in files if k not in known]
    adds = [SHARD_PARTITIONS.build_add_request(new)] if new else []
    cursor = json.loads(context.cursor) if context.cursor else {}
    requested: dict[str, str] = cursor.get("requested", {})
    prints = {k: fingerprint(p) for k, p in files.items()}

    def result(runs: list[dg.RunRequest], why: str | None = None) -> dg.SensorResult:
        return dg.SensorResult(
            run_requests=runs,
            dynamic_partitions_requests=adds,
            skip_reason=None if runs else why,
            cursor=json.dumps({**cursor, "requested": requested}),
        )

    if not files:
        return result([], f"no shard files in {shards.folder()}")
    if instance.get_latest_materialization_event(dg.AssetKey("shard_tokenizer")) is None:
        if _runs(instance, "tokenizer", IN_FLIGHT):
            return result([], "waiting for the shard_tokenizer run")
        listing = json.dumps(prints, sort_keys=True)
        if cursor.get("tokenizer_requested_for") == listing:
            return result([], "shard_tokenizer failed for these shard files: fix them, or materialize it by hand")
        cursor["tokenizer_requested_for"] = listing
        return result([dg.RunRequest(job_name=shard_tokenizer_job.name, tags={SENSOR_TAG: "tokenizer"})])
    runs = []
    for key, fp in prints.items():
        if requested.get(key) != fp:
            runs.append(
                dg.RunRequest(
                    job_name=shard_ingest_job.name,
                    partition_key=key,
                    run_key=f"{key}@{fp}",
                    tags={SENSOR_TAG: "ingest"},
                )
            )
            requested[key] = fp
    if runs:
        return result(runs)
    partitions = sorted(known | set(new))
    done = instance.get_materialized_partitions(dg.AssetKey("label_shards"))
    if not set(partitions) <= done or _runs(instance, "ingest", IN_FLIGHT):
        return result([], f"{len(set(partitions) - done)} of {len(partitions)} shards not ingested yet")
    latest = max(
        instance.get_latest_storage_id_by_partition(
            dg.AssetKey("label_shards"), dg.DagsterEventType.ASSET_MATERIALIZATION, set(partitions)
        ).values()
    )
    combined = instance.fetch_materializations(dg.AssetKey("sharded_labels"), limit=1).records
    if combined and combined[0].storage_id > latest:
        return result([], f"sharded_labels is up to date with all {len(partitions)} shards")
    return result(
        [dg.RunRequest(job_name=combine_shards_job.name, run_key=f"combine@{latest}", tags={SENSOR_TAG: "combine"})]
    )
