"""The code location for a Kubernetes cluster: the same assets, jobs, schedule and sensors as
`pipelines.definitions`, with every step of every run launched as its own Kubernetes Job by
dagster-k8s's `k8s_job_executor`, configured once from configs/deploy/k8s_executor.yaml (namespace,
image, shared state volume, a GPU for each step that configs/gpu.yaml puts on CUDA). Another file:
PIPELINE_K8S_EXECUTOR=/path/to/file.yaml. Needs the deploy extra (pip install -e '.[deploy]').

    dagster code-server start -m pipelines.cluster -h 0.0.0.0 -p 4000   # or the Helm chart's user deployment
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from dagster_k8s import k8s_job_executor

from components.orchestration.state import PROJECT_ROOT

from .definitions import build_defs

EXECUTOR_ENV = "PIPELINE_K8S_EXECUTOR"
EXECUTOR_YAML = PROJECT_ROOT / "configs" / "deploy" / "k8s_executor.yaml"


def executor_config(path: Path | None = None) -> dict[str, Any]:
    """The `execution.config` section of the executor file."""
    path = Path(path or os.environ.get(EXECUTOR_ENV) or EXECUTOR_YAML)
    data = yaml.safe_load(path.read_text()) or {}
    try:
        return data["execution"]["config"]
    except (KeyError, TypeError):
        raise ValueError(
            f"{path}: expected the run-config shape `execution: config: {{...}}` of k8s_job_executor"
        ) from None


defs = build_defs(executor=k8s_job_executor.configured(executor_config(), name="k8s_job_executor"))
