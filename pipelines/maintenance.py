"""Housekeeping of the state folder (PIPELINE_STATE_DIR, default .state/), one JSON report per call.

    python -m pipelines.maintenance init              # create the stores once (safe when concurrent), then `recover`
    python -m pipelines.maintenance recover           # mark runs whose processes are gone failed; MLflow mirrors
                                                      # Dagster
    python -m pipelines.maintenance prune [--keep N]  # keep the newest N run folders per asset (+ the latest
                                                      # materialization)
    python -m pipelines.maintenance shards [--keys]   # a `corpus_shards` partition per file of the shard folder
    python -m pipelines.maintenance addresses [--get dagster|mlflow] [--dagster URL] [--mlflow URL]
                                                      # the UI addresses the state folder's links point to

The scripts in scripts/ run `init` before launching Dagster or MLflow. `init` recovers too: a run
killed while it held the `training` pool's slot would otherwise keep a new run's training step
waiting for that slot, and the in-step recovery only runs once a step has its slot (under the
daemon, the `recover_dead_runs` sensor does the same every minute). Imports neither the asset
graph nor torch (but `shards`, which reads the shard folder as the assets do), so it works while
the pipeline code is broken.

`init` also records the UI addresses (`<state>/ui_addresses.json`, from DAGSTER_UI_URL and
MLFLOW_UI_URL, else the defaults) unless the folder has them already: every link a run records points
there, and scripts/ui.sh and scripts/mlflow_ui.sh serve there. `addresses --dagster URL` moves the
Dagster one (links recorded before keep the old address).

The stores are those the pipeline uses: DAGSTER_HOME's instance (SQLite files, or the database its
dagster.yaml names: configs/deploy/dagster.yaml) and MLFLOW_TRACKING_URI (default: the SQLite DB in
the state folder). A store that does not answer is an error naming the setting to fix (exit 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from components.orchestration.services import StoreUnreachable, open_instance
from components.orchestration.state import (
    dagster_home,
    default_tracking_uri,
    ensure_stores,
    record_ui_addresses,
    ui_addresses,
)


def _instance(uri: str, setting: str | None):
    ensure_stores(uri, dagster=True, setting=setting)
    return open_instance(dagster_home())


def _add_shard_partitions(uri: str, setting: str | None) -> dict:
    """Add a `corpus_shards` partition for every shard file of the folder that has none (the
    `shards` resource's default folder: $PIPELINE_SHARD_DIR, else <state>/shards)."""
    from components.orchestration.shards import SHARD_PARTITIONS_NAME, ShardFolder

    folder = ShardFolder()
    files = folder.shards()
    instance = _instance(uri, setting)
    try:
        known = set(instance.get_dynamic_partitions(SHARD_PARTITIONS_NAME))
        new = [k for k in files if k not in known]
        if new:
            instance.add_dynamic_partitions(SHARD_PARTITIONS_NAME, new)
    finally:
        instance.dispose()
    return {
        "folder": str(folder.folder()),
        "added": new,
        "keys": list(files),
        "partitions_without_file": sorted(known - set(files)),
    }


def _parser() -> argparse.ArgumentParser:
    """The command line: the global --tracking-uri and one subcommand per housekeeping job."""
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.maintenance", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else the SQLite DB in the state folder)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "init",
        help="create the Dagster instance storage, dagster.yaml and the MLflow DB/experiment, once; then recover",
    )
    rec = sub.add_parser("recover", help="fail dead runs, end their MLflow runs, remove leftovers")
    rec.add_argument("--grace", type=float, default=0.0, help="skip runs started less than this many seconds ago")
    pr = sub.add_parser("prune", help="delete old run folders, dead leftovers and stale checkpoints")
    pr.add_argument(
        "--keep",
        type=int,
        default=int(os.environ.get("PIPELINE_KEEP_LAST", 3)),
        help="run folders kept per asset, newest first (default: $PIPELINE_KEEP_LAST or 3)",
    )
    pr.add_argument(
        "--checkpoint-days", type=float, default=7.0, help="remove checkpoint scratch untouched this long (default 7)"
    )
    pr.add_argument("--dry-run", action="store_true", help="report what would be deleted, delete nothing")
    sh = sub.add_parser(
        "shards", help="add a partition for every shard file in the shard folder (what the shard_sensor does first)"
    )
    sh.add_argument(
        "--keys", action="store_true", help="print the shard keys, one per line, instead of the JSON report"
    )
    ad = sub.add_parser("addresses", help="the UI addresses this state folder's links point to (recorded on first use)")
    ad.add_argument("--get", choices=["dagster", "mlflow"], help="print only this address")
    ad.add_argument("--dagster", help="record a new Dagster UI address (earlier links keep the old one)")
    ad.add_argument("--mlflow", help="record a new MLflow UI address (earlier links keep the old one)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    if args.command == "addresses":  # touches no store
        try:
            addresses = (
                record_ui_addresses(args.dagster, args.mlflow) if args.dagster or args.mlflow else ui_addresses()
            )
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(addresses[args.get] if args.get else json.dumps(addresses, indent=1))
        return 0

    # The scripts' layout: DAGSTER_HOME defaults to <state>/dagster (scripts/env.sh exports the same).
    os.environ.setdefault("DAGSTER_HOME", str(dagster_home()))
    uri = args.tracking_uri or default_tracking_uri()
    setting = "--tracking-uri" if args.tracking_uri else None  # else services.tracking_setting says

    try:
        if args.command in ("init", "recover"):
            from components.orchestration.mlflow_sync import sync_mlflow_parents
            from components.orchestration.recovery import recover_dead_runs

            report = {"stores": ensure_stores(uri, dagster=True, setting=setting)}
            if args.command == "init":
                try:
                    report["ui_addresses"] = ui_addresses()
                except ValueError as e:  # a malformed DAGSTER_UI_URL / MLFLOW_UI_URL, or a broken record
                    print(f"error: {e}", file=sys.stderr)
                    return 2
            instance = _instance(uri, setting)
            try:
                report.update(recover_dead_runs(instance, uri, grace_s=getattr(args, "grace", 0.0)))
                report["sync"] = sync_mlflow_parents(instance, uri)
            finally:
                instance.dispose()
        elif args.command == "shards":
            report = _add_shard_partitions(uri, setting)
            if args.keys:
                print("\n".join(report["keys"]))
                return 0
        else:
            from components.orchestration.retention import prune

            instance = _instance(uri, setting)
            try:
                report = prune(
                    args.keep,
                    instance,
                    checkpoint_max_age_days=args.checkpoint_days,
                    dry_run=args.dry_run,
                    tracking_uri=uri,
                )
            finally:
                instance.dispose()
    except StoreUnreachable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=1, default=str))
    if (
        report.get("errors") and args.command == "init"
    ):  # the stores are ready; housekeeping problems do not block a run
        print(f"note: recovery reported problems: {report['errors']}", file=sys.stderr)
        return 0
    return 1 if report.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
