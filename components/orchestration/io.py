"""Assets hand each other small JSON manifests (paths, sizes, hashes, headline numbers), never
pickles: the large artifacts are files in run-scoped folders, and the manifest says where they are.

Isolation: each manifest is written once, into its own run's folder
(`artifacts/<asset>/<run id>/manifest.json`), and its path and SHA-256 go into the materialization's
metadata. A step reads an upstream produced in its own run from its own run's folder; an upstream
outside the run is read from the materialization Dagster's event log records (run id, path, hash).
There is no shared mutable "latest" file, so concurrent runs never read each other's data.

Integrity: every file a manifest names is checked against its recorded size, and against its
SHA-256 unless it is large (then the size alone: hashing gigabytes on every read costs more than it
protects); a mismatch is an error naming the file and what differs.

Types: a manifest is a typed dataclass (`components.core.manifests`), stored as tagged JSON. Reading
checks every field against its class and, where the consuming asset's input is annotated with a
manifest class, that the upstream wrote that kind: an old, foreign or hand-edited manifest is an
error naming the asset, the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import dagster as dg

from components.core.artifacts import file_info, read_json, sha256_file, write_json
from components.core.errors import PipelineInputError
from components.core.manifests import FileRecord, Manifest, from_json

from .state import artifacts_root

M = TypeVar("M", bound=Manifest)

MANIFEST = "manifest.json"
HASH_LIMIT_BYTES = 256 * 1024 * 1024  # files up to this size are re-hashed on every read


def manifest_path(key: dg.AssetKey, run_id: str, partition: str | None = None) -> Path:
    part = f"/{partition}" if partition else ""
    return artifacts_root() / "/".join(key.path) / f"{run_id}{part}" / MANIFEST


def verify_files(manifest: Manifest, asset: str) -> None:
    """Check every file the manifest records (outputs and figures): present, same size, same hash (when affordable)."""
    recorded: dict[str, FileRecord] = {**manifest.files, **{f"figure {k}": v for k, v in manifest.figures.items()}}
    for name, rec in recorded.items():
        p = Path(rec.path)
        if not p.exists():
            raise PipelineInputError(
                f"`{asset}`'s {name} file {p} is missing (deleted or pruned): re-materialize `{asset}`"
            )
        if p.is_file():
            size = p.stat().st_size
        else:
            size = sum(q.stat().st_size for q in p.rglob("*") if q.is_file())
        if size != rec.bytes:
            raise PipelineInputError(
                f"`{asset}`'s {name} file {p} has changed since it was materialized: {size} bytes, recorded "
                f"{rec.bytes}; re-materialize `{asset}`"
            )
        if size <= HASH_LIMIT_BYTES:
            digest = file_info(p)["sha256"]
            if digest != rec.sha256:
                raise PipelineInputError(
                    f"`{asset}`'s {name} file {p} has changed since it was materialized: SHA-256 {digest[:12]}…, "
                    f"recorded {rec.sha256[:12]}… (same size: swapped or edited in place); re-materialize `{asset}`"
                )


def latest_materializations(instance: dg.DagsterInstance, key: dg.AssetKey, partitions: list[str]) -> dict[str, Any]:
    """partition → the latest materialization record of asset `key` for each of `partitions` that
    has one (two queries per 500 partitions, however many materializations each has)."""
    latest = instance.get_latest_storage_id_by_partition(
        key, dg.DagsterEventType.ASSET_MATERIALIZATION, set(partitions)
    )
    ids = sorted(latest.values())
    out: dict[str, Any] = {}
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        for rec in instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, storage_ids=chunk), limit=len(chunk)
        ).records:
            if rec.partition_key is None:  # the ids are of partitioned materializations
                raise dg.DagsterInvariantViolationError(
                    f"{key.to_user_string()}: a materialization by partition has no partition"
                )
            out[rec.partition_key] = rec
    return out


def _recorded_manifest(materialization: Any, asset: str, run_id: str) -> tuple[Path, str]:
    meta = materialization.metadata
    if "manifest_path" not in meta:
        raise dg.Failure(
            f"upstream asset `{asset}`'s latest materialization (run {run_id}) records no manifest: re-materialize it"
        )
    return Path(meta["manifest_path"].value), meta["manifest_sha256"].value


def read_manifest(path: Path, expected: str | None, asset: str, kind: type[Manifest] | None = None) -> Manifest:
    """The typed manifest at `path`, checked against its recorded hash (if given) and its class
    (`kind`, if given), with every file it names verified."""
    if not path.is_file():
        raise dg.Failure(
            f"upstream asset `{asset}`: its manifest {path} is missing (deleted or pruned): re-materialize `{asset}`"
        )
    if expected is not None and sha256_file(path) != expected:
        raise PipelineInputError(
            f"`{asset}`'s manifest {path} has changed since it was materialized (SHA-256 differs); re-materialize "
            f"`{asset}`"
        )
    manifest = from_json(read_json(path), kind or Manifest, f"upstream asset `{asset}`'s manifest {path}")
    verify_files(manifest, asset)
    return manifest


def latest_manifest(instance: dg.DagsterInstance, key: dg.AssetKey, kind: type[M]) -> M | None:
    """The typed manifest of `key`'s latest materialization in this instance, checked as an input is;
    None when it was never materialized. For a study another job makes (the scaling job) that a run
    reports on without depending on it."""
    event = instance.get_latest_materialization_event(key)
    if event is None:
        return None
    name = key.to_user_string()
    found = read_manifest(*_recorded_manifest(event.asset_materialization, name, event.run_id), name, kind)
    if not isinstance(found, kind):  # from_json refuses another kind already
        raise TypeError(f"`{name}`'s latest manifest is a {type(found).__name__}, not a {kind.__name__}")
    return found


def _produced_in_this_run(context: dg.InputContext) -> bool:
    upstream = context.upstream_output
    try:
        return upstream is not None and upstream.run_id == context.step_context.run_id
    except dg.DagsterInvariantViolationError:  # an upstream outside the run has no producing run id
        return False


def expected_kind(context: dg.InputContext) -> type[Manifest] | None:
    """The manifest class the consuming asset's input is annotated with (None: any kind)."""
    try:
        hint = context.dagster_type.typing_type
    except AttributeError:
        return None
    return hint if isinstance(hint, type) and issubclass(hint, Manifest) else None


class ManifestIOManager(dg.ConfigurableIOManager):
    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if obj is None:
            return
        if not isinstance(obj, Manifest):
            raise TypeError(
                f"`{context.asset_key.to_user_string()}` returned {type(obj).__name__}, not a typed manifest"
            )
        obj = obj.to_json()
        partition = context.partition_key if context.has_partition_key else None
        path = write_json(manifest_path(context.asset_key, context.run_id, partition), obj)
        context.add_output_metadata(
            {"manifest_path": dg.MetadataValue.path(str(path)), "manifest_sha256": sha256_file(path)}
        )

    def load_input(self, context: dg.InputContext) -> Any:
        """The upstream's manifest; for a partitioned upstream read by a step of one partition, that
        partition's; read by an unpartitioned step, {partition: manifest} of every partition."""
        key = context.asset_key
        run_id = context.step_context.run_id
        kind = expected_kind(context)
        if not context.has_asset_partitions:
            if _produced_in_this_run(context):
                return read_manifest(manifest_path(key, run_id), None, key.to_user_string(), kind)
            event = context.instance.get_latest_materialization_event(key)
            if event is None:
                raise dg.Failure(
                    f"upstream asset `{key.to_user_string()}` has never been materialized in this instance: "
                    f"materialize it first"
                )
            return read_manifest(
                *_recorded_manifest(event.asset_materialization, key.to_user_string(), event.run_id),
                key.to_user_string(),
                kind,
            )
        partitions = list(context.asset_partition_keys)
        manifests = self._load_partitions(context, key, partitions, kind)
        return manifests[partitions[0]] if context.has_partition_key and len(partitions) == 1 else manifests

    def _load_partitions(
        self, context: dg.InputContext, key: dg.AssetKey, partitions: list[str], kind: type[Manifest] | None
    ) -> dict[str, Any]:
        asset = key.to_user_string()
        run_id = context.step_context.run_id
        out: dict[str, Any] = {}
        if _produced_in_this_run(context):
            for p in partitions:
                out[p] = read_manifest(manifest_path(key, run_id, p), None, f"{asset}[{p}]", kind)
            return out
        records = latest_materializations(context.instance, key, partitions)
        missing = [p for p in partitions if p not in records]
        if missing:
            shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
            raise dg.Failure(
                f"upstream asset `{asset}` has no materialization for partition(s) {shown}: materialize them first"
            )
        for p in partitions:
            rec = records[p]
            out[p] = read_manifest(
                *_recorded_manifest(rec.asset_materialization, f"{asset}[{p}]", rec.run_id), f"{asset}[{p}]", kind
            )
        return out
