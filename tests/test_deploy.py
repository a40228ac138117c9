"""The files of configs/deploy/ (docs/cluster.md, "Running on a cluster") and the settings that point the
pipeline at services, checked without servers: the PostgreSQL instance's dagster.yaml against
Dagster's instance schema and the embedded instance's settings, the Kubernetes executor example
against dagster-k8s's schema and the Kubernetes Jobs it makes. (tests/test_postgres.py runs the
pipeline on real servers.)"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import dagster as dg
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "configs" / "deploy"
PG_ENV = {
    "DAGSTER_PG_HOST": "db.internal",
    "DAGSTER_PG_PORT": "6543",
    "DAGSTER_PG_DB": "dagster",
    "DAGSTER_PG_USERNAME": "pipeline",
    "DAGSTER_PG_PASSWORD": "s3cret",
}


@pytest.fixture
def pg_home(tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(DEPLOY / "dagster.yaml", home / "dagster.yaml")
    for k, v in PG_ENV.items():
        monkeypatch.setenv(k, v)
    return home


@pytest.mark.services
def test_postgres_dagster_yaml_is_valid_and_keeps_the_embedded_settings(pg_home):
    from dagster._core.instance.config import dagster_instance_config

    from components.orchestration.services import dagster_storage, postgres_url
    from components.orchestration.state import DAGSTER_YAML

    config, _ = dagster_instance_config(str(pg_home))  # Dagster's own schema check of the whole file
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    assert config["concurrency"]["runs"]["max_concurrent_runs"] >= 1
    # Credentials only from the environment: every connection field is an `env:` value.
    db = yaml.safe_load((pg_home / "dagster.yaml").read_text())["storage"]["postgres"]["postgres_db"]
    assert {k: v for k, v in db.items() if isinstance(v, dict) and "env" in v} == {
        "hostname": {"env": "DAGSTER_PG_HOST"},
        "port": {"env": "DAGSTER_PG_PORT"},
        "db_name": {"env": "DAGSTER_PG_DB"},
        "username": {"env": "DAGSTER_PG_USERNAME"},
        "password": {"env": "DAGSTER_PG_PASSWORD"},
    }
    assert "s3cret" not in (pg_home / "dagster.yaml").read_text()
    assert postgres_url(pg_home) == "postgresql+psycopg2://pipeline:s3cret@db.internal:6543/dagster?connect_timeout=10"
    # The same run monitoring, pool and run limits and retention as the embedded instance.
    embedded = yaml.safe_load(DAGSTER_YAML)
    deployed = yaml.safe_load((pg_home / "dagster.yaml").read_text())
    for section in embedded:
        assert deployed[section] == embedded[section], section
    # Its storage is recognised (marker key without the password), the embedded one is not a service.
    storage = dagster_storage(pg_home)
    assert (
        storage["kind"] == "postgres" and storage["env"][-1] == "DAGSTER_PG_PASSWORD" and "s3cret" not in storage["key"]
    )
    (pg_home / "dagster.yaml").write_text(DAGSTER_YAML)
    assert dagster_storage(pg_home) is None


def test_tracking_uri_setting_and_redaction(monkeypatch, tmp_path):
    from components.orchestration.services import redact
    from components.orchestration.state import default_tracking_uri, local_tracking_uri
    from components.orchestration.tracking import MlflowTracker

    monkeypatch.setenv("PIPELINE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_UI_URL", raising=False)
    assert MlflowTracker().resolved_uri() == default_tracking_uri() == local_tracking_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    assert MlflowTracker().resolved_uri() == "http://mlflow.internal:5000"
    assert MlflowTracker().resolved_ui_url() == "http://mlflow.internal:5000"  # links follow the server
    assert MlflowTracker(tracking_uri="http://other:5000").resolved_uri() == "http://other:5000"  # the field wins
    assert redact("postgresql+psycopg2://u:pw@h:5432/db") == "postgresql+psycopg2://u:***@h:5432/db"
    assert redact("http://h:5000") == "http://h:5000"


def _cuda_steps() -> set[str]:
    def on_cuda(node) -> bool:
        if isinstance(node, dict):
            return node.get("device") == "cuda" or any(on_cuda(v) for v in node.values())
        return isinstance(node, list) and any(on_cuda(v) for v in node)

    ops = yaml.safe_load((ROOT / "configs" / "gpu.yaml").read_text())["ops"]
    return {name for name, section in ops.items() if on_cuda(section)}


def test_k8s_executor_example_makes_a_job_per_step_with_a_gpu_where_gpu_yaml_uses_cuda():
    from dagster_k8s.container_context import K8sContainerContext
    from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job

    from pipelines.cluster import defs

    job = defs.resolve_job_def("gpu_pipeline")
    assert job.executor_def.name == "k8s_job_executor"
    # The file against dagster-k8s's executor schema (unknown keys, wrong types fail here), defaults filled in.
    cfg = dg.validate_run_config(job, {})["execution"]["k8s_job_executor"]
    steps = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    per_step = cfg["per_step_k8s_config"]
    assert set(per_step) <= steps, set(per_step) - steps
    gpu_steps = {
        s
        for s, c in per_step.items()
        if "nvidia.com/gpu" in c["container_config"].get("resources", {}).get("limits", {})
    }
    assert gpu_steps == _cuda_steps()  # a CUDA step without a GPU fails; a GPU for a CPU step is wasted

    def k8s_job(step: str):
        """The Kubernetes Job of one step, merged as K8sStepHandler merges it (executor settings,
        step_k8s_config, then the step's own), built by dagster-k8s into kubernetes client models."""
        ctx = K8sContainerContext(
            image_pull_policy=cfg.get("image_pull_policy"),
            service_account_name=cfg.get("service_account_name"),
            env_config_maps=cfg.get("env_config_maps"),
            env_secrets=cfg.get("env_secrets"),
            volume_mounts=cfg.get("volume_mounts"),
            volumes=cfg.get("volumes"),
            namespace=cfg.get("job_namespace"),
            run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(cfg.get("step_k8s_config", {})),
        ).merge(K8sContainerContext(run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(per_step.get(step, {}))))
        job_config = DagsterK8sJobConfig(
            job_image=cfg["job_image"], dagster_home="/opt/dagster/dagster_home", instance_config_map="dagster-instance"
        )
        return construct_dagster_k8s_job(
            job_config,
            args=["dagster", "api", "execute_step"],
            job_name=f"dagster-step-{step.replace('_', '-')}",
            user_defined_k8s_config=ctx.run_k8s_config,
        )

    for step in sorted(steps):
        pod = k8s_job(step).spec.template.spec
        container = pod.containers[0]
        assert container.image == cfg["job_image"]
        assert [(m.name, m.mount_path) for m in container.volume_mounts if m.name == "state"] == [("state", "/state")]
        assert pod.volumes[-1].persistent_volume_claim.claim_name == "wordvec-state"
        assert {e.config_map_ref.name for e in container.env_from if e.config_map_ref} == {"wordvec-env"}
        assert {e.secret_ref.name for e in container.env_from if e.secret_ref} == {"wordvec-postgres"}
        limits = container.resources.limits
        if step in gpu_steps:
            assert limits["nvidia.com/gpu"] == "1" and pod.tolerations[0].key == "nvidia.com/gpu", step
        else:
            assert "nvidia.com/gpu" not in limits and container.resources.requests["cpu"] == "2", step
    # The embedded location keeps Dagster's executors and the files' `execution` sections.
    from pipelines.definitions import defs as embedded

    assert embedded.resolve_job_def("gpu_pipeline").executor_def.name != "k8s_job_executor"


def test_registering_leaves_the_tracking_uri_setting_as_it_was(monkeypatch, tmp_path):
    """Model registration points MLflow's default URI at the run's store for one call; the process's
    MLFLOW_TRACKING_URI (the server an in-process run's later steps track into) survives it."""
    import mlflow

    from components.orchestration.registry import default_tracking_uri

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    with default_tracking_uri(store):
        assert mlflow.get_tracking_uri() == store
    assert (
        os.environ["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5999"
        and mlflow.get_tracking_uri() == "http://127.0.0.1:5999"
    )
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    with default_tracking_uri(store):
        pass
    assert "MLFLOW_TRACKING_URI" not in os.environ
