"""Every experiment file in configs/ validates against the config classes, so none can drift."""

import re
from pathlib import Path

import dagster as dg
import pytest
import yaml

from pipelines.definitions import defs

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def whole_graph_job():
    from pipelines.definitions import default_route_job

    return default_route_job()


def test_required_configs_exist():
    assert {"tiny", "default", "gpu"} <= {p.stem for p in CONFIGS}


def load(path: Path) -> dict:
    """A config file as its `<name>_pipeline` runs it (the sections of jobs of their own left out)."""
    from pipelines.definitions import route_config

    return route_config(yaml.safe_load(path.read_text()))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_file_validates(path):
    cfg = load(path)
    result = dg.validate_run_config(whole_graph_job(), cfg)
    assert result["ops"].keys() >= {"corpus", "tokenizer", "labels"}
    # The whole-run check (every section's ranges and the limits between assets) finds nothing.
    from components.orchestration.validation import check_run_config

    assert check_run_config(cfg["ops"], _config_classes(), None) == []


@pytest.mark.parametrize(
    "patch, message",
    [
        (
            {"tokenizer": {"config": {"vocab_sise": 512}}},
            'unexpected config entry "vocab_sise" at path root:ops:tokenizer:config',
        ),
        ({"labels": {"config": {"block_size": "big"}}}, r'root:ops:labels:config:block_size'),
        ({"corpus": {"config": {"source": "web"}}}, r"root:ops:corpus:config:source"),
    ],
)
def test_bad_config_names_the_field(patch, message):
    cfg = load(CONFIGS[0].parent / "tiny.yaml")
    cfg["ops"].update(patch)
    with pytest.raises(dg.DagsterInvalidConfigError) as err:
        dg.validate_run_config(whole_graph_job(), cfg)
    assert message in str(err.value) or re.search(message, str(err.value)), str(err.value)


def test_default_yaml_is_the_config_class_defaults():
    """The main job, scheduled reruns and automation (which uses class defaults) train the same thing."""
    from pipelines.default_config import default_run_config

    on_disk = yaml.safe_load((CONFIGS[0].parent / "default.yaml").read_text())
    assert on_disk == default_run_config(), "regenerate: python -m pipelines.default_config > configs/default.yaml"


def test_component_yaml_rejects_unknown_settings():
    from components.orchestration.language_model import language_model_asset

    with pytest.raises(ValueError, match=r"language model `bad_lm`: unknown setting\(s\) \['hidden'\]"):
        language_model_asset("bad_lm", "recurrent", {"hidden": 3}, {}, {}, "x", "g")
    with pytest.raises(ValueError, match="n_embd"):
        language_model_asset("bad_lm", "transformer", {"n_embd": 30, "n_head": 4}, {}, {}, "x", "g")


def _config_classes():
    """Op → config class of the default route (what a config file configures)."""
    from components.orchestration.validation import config_classes
    from pipelines.definitions import DEFAULT_ROUTE

    route = DEFAULT_ROUTE.resolve(defs.resolve_asset_graph())
    return config_classes(a for a in defs.assets if set(a.keys) & route)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_section_passes_the_core_validators(path):
    """Dagster checks names and types; the core's validators (cross-field rules) run here too."""
    classes = _config_classes()
    ops = load(path)["ops"]
    assert set(ops) <= set(classes), set(ops) - set(classes)
    for name, section in ops.items():
        classes[name](**section.get("config", {}))


def test_whole_run_check_lists_every_problem():
    from components.orchestration.validation import check_run_config

    cfg = load(CONFIGS[0].parent / "tiny.yaml")["ops"]
    cfg["lstm_lm"]["config"]["train"]["lr"] = -1
    cfg["transformer_lm"]["config"]["model"]["block_size"] = 48
    cfg["rnn_lm"]["config"]["model"]["block_size"] = 40
    cfg["gradient_study"]["config"]["seq_len"] = 33
    problems = check_run_config(cfg, _config_classes(), None)
    assert any(p.startswith("ops.lstm_lm.config.train.lr:") for p in problems), problems
    assert any(
        p.startswith("ops.transformer_lm.config.model.block_size=48 exceeds labels.block_size=32: ") for p in problems
    ), problems
    assert any(p.startswith("ops.rnn_lm.config.model.block_size=40 exceeds labels.block_size=32: ") for p in problems)
    assert any("ops.gradient_study.config.seq_len=33 exceeds labels.block_size=32" in p for p in problems)
    assert len(problems) == 4, problems
    # The context has one owner: a training block_size is refused, naming where it belongs.
    cfg = load(CONFIGS[0].parent / "tiny.yaml")["ops"]
    cfg["transformer_lm"]["config"]["train"]["block_size"] = 32
    problems = check_run_config(cfg, _config_classes(), None)
    assert len(problems) == 1 and "model.block_size" in problems[0], problems


@pytest.mark.parametrize("name", ["../../x", "a/b", "x..y", "", " lead", "-x"])
def test_a_registry_name_that_reads_as_a_path_is_refused_with_the_config(name):
    """Refused before anything runs, naming the field (MLflow would refuse it only after the export)."""
    from components.orchestration.validation import check_run_config

    cfg = load(CONFIGS[0].parent / "tiny.yaml")["ops"]
    cfg.setdefault("model_export", {}).setdefault("config", {})["registered_model_name"] = name
    problems = check_run_config(cfg, _config_classes(), None)
    assert len(problems) == 1 and problems[0].startswith("ops.model_export.config.registered_model_name"), problems
    cfg["model_export"]["config"]["registered_model_name"] = "transformer_lm.fp16-v2"
    assert check_run_config(cfg, _config_classes(), None) == []


def test_core_validator_error_names_the_field():
    classes = _config_classes()
    with pytest.raises(ValueError, match="n_embd"):
        classes["transformer_lm"](model={"n_embd": 30, "n_head": 4, "param_budget": None})


def test_an_unknown_key_is_one_line_naming_it_without_a_traceback(tmp_path):
    """The project's own entry point (`python -m pipelines.check_config`, which scripts/run_pipeline.sh
    runs before launching) prints Dagster's message alone for an unknown key, and passes a good file."""
    import subprocess
    import sys

    import yaml

    root = Path(__file__).resolve().parents[1]
    cfg = yaml.safe_load((root / "configs" / "tiny.yaml").read_text())
    cfg["ops"]["corpus"]["config"]["max_docs"] = 3
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.check_config", str(bad)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(root)},
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "max_docs" in lines[0] and "bad.yaml" in lines[0], proc.stderr
    from pipelines.check_config import main

    assert main(["tiny"]) == 0
    # The launch scripts/run_pipeline.sh runs checks the same file first, in its own process: the same
    # line, exit 2, and no run created (the instance under PIPELINE_STATE_DIR stays empty).
    from pipelines import launch

    state = tmp_path / "state"
    env = {
        **__import__("os").environ,
        "PYTHONPATH": str(root),
        "PIPELINE_STATE_DIR": str(state),
        "DAGSTER_HOME": str(state / "dagster"),
    }
    (state / "dagster").mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.launch", "--check-config", str(bad), "tiny_pipeline"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == lines
    assert not any((state / "dagster").iterdir()) and "Run " not in proc.stdout
    assert launch.main(["--check-config", str(tmp_path / "none.yaml"), "tiny_pipeline"]) == 2


def test_run_job_names_the_jobs_there_are_for_one_that_is_not(tmp_path):
    """`scripts/run_job.sh` (the entry point of the jobs off the default route: scaling, tune) refuses an
    unknown job with exit 2 and the list of jobs, and creates no run."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    state = tmp_path / "state"
    env = {
        **os.environ,
        "VENV": str(Path(sys.executable).parents[1]),
        "PIPELINE_STATE_DIR": str(state),
        "DAGSTER_HOME": str(state / "dagster"),
    }
    proc = subprocess.run(
        ["bash", "scripts/run_job.sh", "scaling_law"], cwd=root, capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no job 'scaling_law'" in proc.stderr and "scaling" in proc.stderr.split("have:")[1], proc.stderr
    assert "Run " not in proc.stdout


def test_the_readme_results_are_generated_from_the_profile_they_name():
    """The README's results block is `benchmarks/readme_results.py`'s output for the committed run
    profile its marker names: a figure edited by hand, or a profile replaced without regenerating,
    fails here."""
    import importlib.util

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("readme_results", root / "benchmarks" / "readme_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import json

    readme = (root / "README.md").read_text(encoding="utf-8")
    named, block, _, _ = mod.block(readme)
    profile = json.loads((root / named).read_text())
    assert block == mod.render(profile, named)
    assert f"{profile['figures']['count_model']['val_loss']:.3f}" in block
