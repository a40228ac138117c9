"""Check an experiment file of configs/ before anything launches: Dagster's schema (unknown keys,
wrong types, missing fields) and the config classes' own rules (`validation.check_run_config`),
every problem on one line naming its path, no traceback. Exit 0 when the file is valid, 2 if not.

    python -m pipelines.check_config tiny                 # configs/tiny.yaml, as the job tiny_pipeline runs it
    python -m pipelines.check_config path/to/other.yaml   # any run-config file, against the default route

scripts/run_pipeline.sh runs the same check inside the launch (`pipelines.launch --check-config`), before the
run is created.
"""

from __future__ import annotations

import sys
from pathlib import Path


def problems(path: str | Path) -> list[str]:
    """Every problem of the run-config file at `path`, as 'path: where: what' lines."""
    import dagster as dg
    import yaml
    from dagster._core.errors import DagsterInvalidConfigError

    from components.orchestration.validation import check_run_config, config_classes, other_labels
    from pipelines.definitions import default_route_job

    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        return [f"{path}: cannot be read as YAML ({e})"]
    if not isinstance(config, dict):
        return [f"{path}: a run config is a mapping (ops:, execution:), not {type(config).__name__}"]
    job = default_route_job()  # what the config jobs run
    try:
        dg.validate_run_config(job, config)
    except DagsterInvalidConfigError as e:
        return [f"{path}: {err.message}" for err in e.errors] or [f"{path}: {e}"]
    assets = job.asset_layer.asset_graph.assets_defs
    elsewhere = other_labels(assets)  # (their labels are another route's, checked when they run)
    classes = {op: cls for op, cls in config_classes(assets).items() if op not in elsewhere}
    return [f"{path}: {p}" for p in check_run_config(config.get("ops") or {}, classes, None)]


def config_path(arg: str) -> Path:
    """A name in configs/ (tiny) or a path to a .yaml file."""
    from pipelines.definitions import CONFIG_DIR

    return Path(arg) if arg.endswith((".yaml", ".yml")) else CONFIG_DIR / f"{arg}.yaml"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m pipelines.check_config <name in configs/ | file.yaml>", file=sys.stderr)
        return 2
    path = config_path(argv[0])
    if not path.is_file():
        print(f"error: no such config: {path}", file=sys.stderr)
        return 2
    found = problems(path)
    for line in found:
        print(f"error: {line}", file=sys.stderr)
    return 2 if found else 0


if __name__ == "__main__":
    sys.exit(main())
