"""configs/default.yaml is every asset's config-class default, written out in full.

So the main job, scheduled reruns and declarative automation (which launches with the class
defaults) all train the same thing. Regenerate after changing a default:

    python -m pipelines.default_config > configs/default.yaml

A test fails when the file and the classes disagree.
"""

import sys
from typing import Any

import yaml

HEADER = """\
# The main job: the whole graph on a 2-core CPU (the README gives measured times on each CPU kind).
# Generated from the config classes' defaults (python -m pipelines.default_config > configs/default.yaml);
# copy it to a new file in configs/ to make another experiment (a job <name>_pipeline appears for it).
"""

# Steps run one at a time in the run's own process: every training step has both cores, so tokens/s
# figures are comparable, and no step pays for a subprocess that loads the code location again
# (about 5 s each on 2 cores, for some 40 steps and checks).
EXECUTION = {"config": {"in_process": {}}}


def default_run_config() -> dict[str, Any]:
    from dagster._config import process_config

    from pipelines.definitions import default_route_job

    job = default_route_job()
    result = process_config(job.run_config_schema.run_config_schema_type, {})
    if not result.success or result.value is None:
        raise RuntimeError(f"the config classes have no complete defaults: {result.errors}")
    ops = {name: {"config": op["config"]} for name, op in sorted(result.value["ops"].items()) if op.get("config")}
    return {"execution": EXECUTION, "ops": ops}


def main() -> None:
    sys.stdout.write(HEADER + yaml.safe_dump(default_run_config(), sort_keys=False, allow_unicode=True))


if __name__ == "__main__":
    main()
