"""The whole graph on configs/tiny.yaml with a temporary instance, state folder and MLflow DB."""

from pathlib import Path

import dagster as dg
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def materialize(cfg, selection=None):
    from pipelines.definitions import defs

    return dg.materialize(
        list(defs.assets) + list(defs.asset_checks),
        resources=defs.resources,
        run_config=cfg,
        selection=selection,
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    state = tmp_path_factory.mktemp("state")
    mp = pytest.MonkeyPatch()
    mp.setenv("PIPELINE_STATE_DIR", str(state))
    cfg = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    result = materialize(cfg)
    yield result, state
    mp.undo()


def _mlflow_runs(state):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{state / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("wordvec-to-transformer")
    return client, client.search_runs([exp.experiment_id], max_results=1000)


def test_tiny_graph_materializes_everything(tiny_run):
    result, state = tiny_run
    failures = [e.event_specific_data.error.to_string() for e in result.all_events if e.is_step_failure]
    assert result.success, "\n".join(failures)
    from pipelines.definitions import defs

    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    done = {m.asset_key.to_user_string() for m in result.get_asset_materialization_events() for m in [m.event_specific_data.materialization]}
    assert done == keys
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    assert checks and all(checks.values()), checks


def test_manifests_point_at_real_files(tiny_run):
    result, state = tiny_run
    labels = result.output_for_node("labels")
    assert Path(labels["path"]).is_dir() and str(state) in labels["path"]
    assert (Path(labels["path"]) / "train_x.npy").exists()
    tok = result.output_for_node("tokenizer")
    assert Path(tok["path"]).name == "tokenizer.json" and tok["kind"] == "bpe"
    # No half-written folders are left behind.
    assert not list((state / "artifacts").rglob(".*partial*"))


def test_mlflow_has_one_parent_and_a_nested_run_per_asset(tiny_run):
    result, state = tiny_run
    client, runs = _mlflow_runs(state)
    parents = [r for r in runs if r.data.tags.get("dagster.role") == "dagster_run"]
    assert len(parents) == 1 and parents[0].data.tags["dagster.run_id"] == result.run_id
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    by_asset = {r.data.tags["dagster.asset_key"]: r for r in children}
    assert {"corpus", "tokenizer", "labels"} <= set(by_asset)
    assert all(r.info.status == "FINISHED" for r in children + parents)
    tok = by_asset["tokenizer"]
    assert tok.data.params["vocab_size"] == "512" and tok.data.metrics["roundtrip_ok"] == 1.0
    assert len(tok.data.tags["config_hash"]) == 16
    assert [a.path for a in client.list_artifacts(tok.info.run_id)] == ["tokenizer.json"]
    assert by_asset["corpus"].data.metrics["documents"] == 24
    # The run id and link go back into Dagster's metadata.
    mats = {e.event_specific_data.materialization.asset_key.to_user_string(): e.event_specific_data.materialization for e in result.get_asset_materialization_events()}
    assert mats["tokenizer"].metadata["mlflow_run_id"].value == tok.info.run_id


def test_bad_input_fails_without_materialization_and_marks_mlflow_failed(state_dir, tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n")
    cfg = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    cfg = {"ops": {"corpus": {"config": {"source": "files", "path": str(tmp_path / "empty.txt")}}}}
    result = materialize(cfg, selection="corpus")
    assert not result.success
    assert not result.get_asset_materialization_events()
    errors = [e.event_specific_data.error.to_string() for e in result.all_events if e.is_step_failure]
    assert any("empty.txt is empty" in e for e in errors), errors
    _, runs = _mlflow_runs(state_dir)
    corpus_runs = [r for r in runs if r.data.tags.get("dagster.asset_key") == "corpus"]
    assert [r.info.status for r in corpus_runs] == ["FAILED"]
    assert "PipelineInputError" in corpus_runs[0].data.tags["error"]
    assert not list((state_dir / "artifacts").rglob("*.arrow"))


def test_step_level_config_error_names_the_field(state_dir):
    cfg = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    cfg["ops"]["tokenizer"]["config"]["vocab_size"] = 100
    cfg["ops"] = {k: cfg["ops"][k] for k in ("corpus", "tokenizer")}
    result = materialize(cfg, selection=["corpus", "tokenizer"])
    errors = [e.event_specific_data.error.to_string() for e in result.all_events if e.is_step_failure]
    assert any("tokenizer.vocab_size=100 is too small" in e for e in errors), errors
    done = {e.event_specific_data.materialization.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert done == {"corpus"}


def test_studies_report_measured_findings(tiny_run):
    result, state = tiny_run
    grads = result.output_for_node("gradient_study")
    f = {(r["model"], r["variant"]): r["step_factor"] for r in grads["rows"]}
    assert f[("rnn", "contractive")] < 1 < f[("rnn", "expansive")]
    cost = result.output_for_node("recurrent_cost")
    assert {r["model"] for r in cost["rows"]} == {"rnn", "lstm"}
    comparison = result.output_for_node("model_comparison")
    assert {r["model"] for r in comparison["rows"]} == {"rnn", "lstm", "transformer"}
    params = [r["params"] for r in comparison["rows"]]
    assert max(params) / min(params) < 1.1  # sized to one parameter budget
    assert comparison["matched_time_s"] > 0
    assert abs(comparison["accounting"]["ffn_share"] - 2 / 3) < 0.05
    ev = result.output_for_node("embedding_eval")["metrics"]
    assert 0 < ev["analogy/coverage"] <= 1 and "wordsim353/oov" in ev


def test_comparison_children_line_up_in_mlflow(tiny_run):
    result, state = tiny_run
    client, runs = _mlflow_runs(state)
    comp = next(r for r in runs if r.data.tags.get("dagster.asset_key") == "model_comparison" and r.info.run_name == "model_comparison")
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == comp.info.run_id]
    assert sorted(r.info.run_name for r in children) == ["lstm", "rnn", "transformer"]
    for r in children:
        assert {"val/loss", "val/ppl", "tokens_per_s", "params"} <= set(r.data.metrics)
    lm_runs = {r.data.tags["dagster.asset_key"]: r for r in runs if r.data.tags.get("dagster.asset_key", "").endswith("_lm")}
    for name in ("rnn_lm", "lstm_lm", "transformer_lm"):
        history = client.get_metric_history(lm_runs[name].info.run_id, "train/loss")
        assert len(history) >= 3  # step-wise training metrics under the shared names
