"""Run one job of the Definitions from the command line so the Dagster UI files it under its job and
code location, then wait for it: what `scripts/run_pipeline.sh` runs.

    python -m pipelines.launch tiny_pipeline

`dg launch --job` (and `dagster job execute`) execute a job from its Python module alone: the run
records no repository origin, so the UI lists it only among all runs, as "Manually launched", never
on its job's page or the timeline. Here the run is created from the code location the UI loads
(`LOCATION_NAME`, the name workspace.yaml and `[tool.dg.project] code_location_name` give it) and
carries that origin (tag `.dagster/repository` = `__repository__@wordvec_to_transformer`); it then
executes in this process, with the job's own executor, as `dg launch` would. Exit status 0 when the
run succeeds, 1 when it fails, 2 for an unknown job or (with `--check-config`) a bad config file.
"""

from __future__ import annotations

import argparse
import sys

from components.orchestration.state import PROJECT_ROOT

LOCATION_NAME = "wordvec_to_transformer"
MODULE = "pipelines.definitions"


def location_origin():
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    target = LoadableTargetOrigin(
        executable_path=sys.executable, module_name=MODULE, working_directory=str(PROJECT_ROOT)
    )
    return InProcessCodeLocationOrigin(target, location_name=LOCATION_NAME)


def create_run(instance, job_name: str, tags: dict[str, str] | None = None):
    """A NOT_STARTED run of `job_name` carrying the code location's origin (remote and Python)."""
    from dagster._core.definitions.selector import JobSubsetSelector

    location = location_origin().create_location(instance)
    try:
        (repo,) = location.get_repositories().values()
        if not repo.has_job(job_name):
            jobs = sorted(j.name for j in repo.get_all_jobs() if not j.name.startswith("__"))
            raise KeyError(f"no job {job_name!r} in code location {LOCATION_NAME!r} (have: {', '.join(jobs)})")
        remote_job = location.get_job(
            JobSubsetSelector(
                location_name=LOCATION_NAME, repository_name=repo.name, job_name=job_name, op_selection=None
            )
        )
        run_config: dict = {}  # a config job's YAML is its default config (dg.config_from_files), as under `dg launch`
        plan = location.get_execution_plan(
            remote_job, run_config, step_keys_to_execute=None, known_state=None, instance=instance
        )
        return instance.create_run(
            job_name=job_name,
            run_id=None,
            run_config=run_config,
            resolved_op_selection=None,
            step_keys_to_execute=plan.execution_plan_snapshot.step_keys_to_execute,
            op_selection=None,
            status=None,
            root_run_id=None,
            parent_run_id=None,
            tags={**remote_job.tags, **(tags or {})},
            job_snapshot=remote_job.job_snapshot,
            execution_plan_snapshot=plan.execution_plan_snapshot,
            parent_job_snapshot=remote_job.parent_job_snapshot,
            remote_job_origin=remote_job.get_remote_origin(),
            job_code_origin=remote_job.get_python_origin(),
            asset_selection=None,
            asset_check_selection=None,
            asset_graph=repo.asset_graph,
        )
    finally:
        location.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.launch", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("job", help="a job of the Definitions, e.g. default_pipeline")
    parser.add_argument(
        "--check-config",
        metavar="CONFIG",
        help="first check this experiment file (a name in configs/ or a .yaml path) as `pipelines.check_config` does, "
        "in this process (one import of the Definitions, not two); exit 2 on any problem, before a run is created",
    )
    args = parser.parse_args(argv)
    if args.check_config:
        from pipelines.check_config import config_path, problems

        path = config_path(args.check_config)
        found = [f"no such config: {path}"] if not path.is_file() else problems(path)
        for line in found:
            print(f"error: {line}", file=sys.stderr)
        if found:
            return 2

    import dagster as dg
    from dagster._core.execution.api import execute_run
    from dagster._utils.hosted_user_process import recon_job_from_origin

    with dg.DagsterInstance.get() as instance:
        try:
            run = create_run(instance, args.job)
        except KeyError as e:
            print(e.args[0], file=sys.stderr)
            return 2
        print(f"Run {run.run_id} of {args.job} in code location {LOCATION_NAME}", flush=True)
        if run.job_code_origin is None:  # create_run gives every run the code location's Python origin
            raise RuntimeError(f"run {run.run_id} of {args.job} has no job code origin to execute")
        result = execute_run(recon_job_from_origin(run.job_code_origin), run, instance)
        return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main())
