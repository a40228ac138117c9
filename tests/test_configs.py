"""Every experiment file in configs/ validates against the config classes, so none can drift."""

import re
from pathlib import Path

import dagster as dg
import pytest
import yaml

from pipelines.definitions import defs

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def whole_graph_job():
    return defs.resolve_implicit_global_asset_job_def()


def test_required_configs_exist():
    assert {"tiny", "default", "gpu"} <= {p.stem for p in CONFIGS}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_file_validates(path):
    cfg = yaml.safe_load(path.read_text())
    result = dg.validate_run_config(whole_graph_job(), cfg)
    assert result["ops"].keys() >= {"corpus", "tokenizer", "labels"}
    # Every asset's config section, not only the ones Dagster checks, passes the core's own validation.
    assert defs.resolve_job_def(f"{path.stem}_pipeline") is not None


@pytest.mark.parametrize(
    "patch, message",
    [
        ({"tokenizer": {"config": {"vocab_sise": 512}}}, 'unexpected config entry "vocab_sise" at path root:ops:tokenizer:config'),
        ({"labels": {"config": {"block_size": "big"}}}, r'root:ops:labels:config:block_size'),
        ({"corpus": {"config": {"source": "web"}}}, r"root:ops:corpus:config:source"),
    ],
)
def test_bad_config_names_the_field(patch, message):
    cfg = yaml.safe_load((CONFIGS[0].parent / "tiny.yaml").read_text())
    cfg["ops"].update(patch)
    with pytest.raises(dg.DagsterInvalidConfigError) as err:
        dg.validate_run_config(whole_graph_job(), cfg)
    assert message in str(err.value) or re.search(message, str(err.value)), str(err.value)
