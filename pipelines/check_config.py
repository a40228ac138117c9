"""Check an experiment file of configs/ before anything launches: Dagster's schema (unknown keys,
wrong types, missing fields) and the config classes' own rules (`validation.check_run_config`),
every problem on one line naming its path, no traceback. Exit 0 when the file is valid, 2 if not.
A file may also configure the jobs off the default route: `lr_sweep` (the `tune` job) and `scaling_laws`
(the `scaling` job).

    python -m pipelines.check_config tiny                 # configs/tiny.yaml, as the job tiny_pipeline runs it
    python -m pipelines.check_config path/to/other.yaml   # any run-config file, against the default route

scripts/run_pipeline.sh runs the same check inside the launch (`pipelines.launch --check-config`), before the
run is created.
"""

from __future__ import annotations

import sys
from pathlib import Path

OWN_JOBS = ("tune", "scaling")  # jobs off the default route whose ops a config file may also configure


def problems(path: str | Path) -> list[str]:
    """Every problem of the run-config file at `path`, as 'path: where: what' lines. Each op section is
    checked against the job that runs it: the default route (the file's `<name>_pipeline`), or the
    `tune` job (`lr_sweep`) or the `scaling` job (`scaling_laws`)."""
    import dagster as dg
    import yaml
    from dagster._core.errors import DagsterInvalidConfigError

    from components.orchestration.validation import check_run_config, config_classes, other_labels
    from pipelines.definitions import default_route_job, defs

    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        return [f"{path}: cannot be read as YAML ({e})"]
    if not isinstance(config, dict):
        return [f"{path}: a run config is a mapping (ops:, execution:), not {type(config).__name__}"]
    ops = config.get("ops") or {}
    if not isinstance(ops, dict):
        return [f"{path}: ops: a mapping of asset names to their config, not {type(ops).__name__}"]
    jobs = [default_route_job(), *(defs.resolve_job_def(name) for name in OWN_JOBS)]
    parts: dict[str, dict] = {j.name: {} for j in jobs}
    found: list[str] = []
    for op, section in ops.items():
        job = next((j for j in jobs if op in j.graph.node_dict), None)
        if job is None:
            found.append(
                f"{path}: ops.{op}: no asset of that name in the default route or the {' or '.join(OWN_JOBS)} job"
            )
        else:
            parts[job.name][op] = section
    rest = {k: v for k, v in config.items() if k != "ops"}
    for job in jobs:
        if job.name != jobs[0].name and not parts[job.name]:
            continue
        try:
            dg.validate_run_config(job, {**rest, "ops": parts[job.name]})
        except DagsterInvalidConfigError as e:
            found += [f"{path}: {err.message}" for err in e.errors] or [f"{path}: {e}"]
            continue
        assets = job.asset_layer.asset_graph.assets_defs
        elsewhere = other_labels(assets)  # (their labels are another route's, checked when they run)
        classes = {op: cls for op, cls in config_classes(assets).items() if op not in elsewhere}
        if job.name != jobs[0].name:  # only the ops this file configures: the job's upstream assets are a default run's
            classes = {op: cls for op, cls in classes.items() if op in parts[job.name]}
        found += [f"{path}: {p}" for p in check_run_config(parts[job.name], classes, None)]
    return found


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
