"""Where all state lives: one folder, overridable by the PIPELINE_STATE_DIR environment variable.

Inside it: `dagster/` (DAGSTER_HOME: the instance, SQLite), `mlflow/` (tracking DB and artifacts)
and `artifacts/` (asset files, laid out by asset / run). Paths are absolute so every step
process shares them.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
ENV_VAR = "PIPELINE_STATE_DIR"


def state_root() -> Path:
    root = Path(os.environ.get(ENV_VAR) or PROJECT_ROOT / ".state").expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    return root


def artifacts_root() -> Path:
    return state_root() / "artifacts"


def mlflow_root() -> Path:
    return state_root() / "mlflow"
