"""The whole graph on configs/tiny.yaml, in process, with a temporary state folder and MLflow DB;
plus failure cases. (tests/test_safety.py runs the pipeline as separate `dagster` processes with the
multiprocess executor, several at once.)"""

from pathlib import Path

import dagster as dg
import pytest
from cli import TINY, TINY_SCALING, check_evaluations, manifest, materializations, mlflow_runs, step_errors

pytestmark = pytest.mark.slow  # the whole tiny graph through the job, once per module

MLFLOW_UI = "http://127.0.0.1:5999"
DAGSTER_UI = "http://127.0.0.1:3999"


def materialize(cfg, selection=None, inst=None):
    """`selection` of the graph (default: the whole default route, what the config jobs run)."""
    from pipelines.definitions import DEFAULT_ROUTE, defs

    return dg.materialize(
        list(defs.assets) + list(defs.asset_checks),
        resources=defs.resources,
        run_config=cfg,
        selection=DEFAULT_ROUTE if selection is None else selection,
        instance=inst or dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    state = tmp_path_factory.mktemp("tiny") / "state"
    mp = pytest.MonkeyPatch()
    mp.setenv("PIPELINE_STATE_DIR", str(state))
    # Both UIs on ports other than the defaults: the links follow the two settings.
    mp.setenv("MLFLOW_UI_URL", MLFLOW_UI)
    mp.setenv("DAGSTER_UI_URL", DAGSTER_UI)
    inst = dg.DagsterInstance.ephemeral()
    result = materialize(TINY, inst=inst)
    assert result.success, "\n".join(step_errors(inst, result.run_id))
    yield state, inst, result.run_id
    mp.undo()


def test_tiny_graph_materializes_everything(tiny_run):
    state, inst, run_id = tiny_run
    from pipelines.definitions import DEFAULT_ROUTE, defs

    keys = {k.to_user_string() for k in DEFAULT_ROUTE.resolve(defs.resolve_asset_graph())}
    assert set(materializations(inst, run_id)) == keys and {"corpus", "report"} <= keys and "sharded_labels" not in keys
    expected = {
        (k.name, k.asset_key.to_user_string()) for k in DEFAULT_ROUTE.resolve_checks(defs.resolve_asset_graph())
    }
    evs = check_evaluations(inst, run_id)
    checks = {key: ev.passed for key, ev in evs.items()}
    # Findings that need a trained model of some size (warnings): evaluated, with figures, but at
    # 30 steps on 24 articles they may go either way. Wall-time scaling measured on a shared CPU
    # (warnings too) bends under load. Every other check passes.
    size_dependent = {
        "heads_differ",
        "fact_neurons_matter",
        "later_context_helps",
        "soft_attention_trains_better_than_hard",
        "word_vectors_carry_similarity",
        "king_man_woman_queen",
        "residuals_let_depth_train",
        "language_models_beat_the_count_model",
        "rnn_forgets_where_lstm_remembers",
        "lstm_carries_gradient_further",
        "attention_bridges_every_delay",
        "attention_recall_ignores_distance",
        "recurrent_state_runs_out",
        "window_answers_within_field_only",
        "induction_head_copies",
    }
    timing = {"attention_time_scales_as_claimed", "kv_cache_pays", "recurrence_is_the_serial_bottleneck"}
    assert set(checks) == expected and all(
        v for (name, _), v in checks.items() if name not in size_dependent | timing
    ), checks
    warned = [ev for (name, _), ev in evs.items() if name in size_dependent | timing]
    assert {name for (name, _) in evs if name in size_dependent | timing} == size_dependent | timing
    assert all(ev.metadata and ev.severity == dg.AssetCheckSeverity.WARN for ev in warned)
    assert inst.get_run_by_id(run_id).status == dg.DagsterRunStatus.SUCCESS


def test_manifests_point_at_their_own_run_files(tiny_run):
    state, inst, run_id = tiny_run
    labels = manifest(inst, run_id, "labels")
    assert Path(labels["path"]).is_dir() and run_id in labels["path"] and str(state) in labels["path"]
    assert {"train_x", "train_y", "validation_x", "validation_y", "meta"} <= set(labels["files"])
    tok = manifest(inst, run_id, "tokenizer")
    assert Path(tok["path"]).name == "tokenizer.json" and tok["kind"] == "bpe"
    assert tok["sha256"] == tok["files"]["tokenizer"]["sha256"] == labels["tokenizer_sha256"]
    lm = manifest(inst, run_id, "lstm_lm")
    # The final folder holds the weights (config in their header), not the optimizer state.
    assert sorted(p.name for p in Path(lm["weights"]).parent.iterdir()) == [
        "figures",
        "manifest.json",
        "model.safetensors",
        "samples.txt",
    ]
    assert lm["inputs"] == {"labels": run_id, "tokenizer": run_id} and lm["resumed_from_step"] == 0
    # No half-written folders, no checkpoint scratch and no leases are left behind.
    assert not list((state / "artifacts").rglob(".*partial*"))
    assert not list(state.glob("checkpoints/**/model.safetensors"))


def test_mlflow_has_one_parent_and_a_nested_run_per_asset(tiny_run):
    state, inst, run_id = tiny_run
    client, all_runs = mlflow_runs(state)
    parents = [r for r in all_runs if r.data.tags.get("dagster.role") == "dagster_run"]
    assert len(parents) == 1 and parents[0].data.tags["dagster.run_id"] == run_id
    children = [r for r in all_runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    by_asset = {}
    for r in children:
        by_asset.setdefault(r.data.tags["dagster.asset_key"], []).append(r)
    assert all(len(v) == 1 for v in by_asset.values()), {k: len(v) for k, v in by_asset.items()}
    assert set(by_asset) == set(materializations(inst, run_id))
    assert {r.info.status for r in all_runs} == {"FINISHED"}
    tok = by_asset["tokenizer"][0]
    assert tok.data.params["vocab_size"] == "512" and tok.data.metrics["roundtrip_ok"] == 1.0
    assert len(tok.data.tags["config_hash"]) == 16
    assert "tokenizer.json" in [a.path for a in client.list_artifacts(tok.info.run_id)]
    assert by_asset["corpus"][0].data.metrics["documents"] == 24
    # The parameters say what ran: the steps trained (a FLOPs budget decides the RNN's), the launcher and
    # world size that trained it; what was asked for under `requested.`; no window without a window.
    for name in ("rnn_lm", "lstm_lm", "transformer_lm", "transformer_window_lm"):
        p = by_asset[name][0].data.params
        trained = manifest(inst, run_id, name)["metrics"]["steps"]
        assert p["train.max_steps"] == str(int(trained)) and p["train.launcher"] == "inprocess", name
        assert p["train.world_size"] == "1" and "train.nproc_per_node" not in p and "train.strategy" not in p
        assert "requested.train.max_steps" in p and "requested.train.nproc_per_node" in p
        assert all(v != "None" for k, v in p.items() if k.startswith("resolved.")), name
    rnn = by_asset["rnn_lm"][0].data.params
    assert rnn["requested.train.max_steps"] != rnn["train.max_steps"] and float(rnn["train.flops_budget"]) == 1.99e9
    assert "model.window" not in by_asset["transformer_lm"][0].data.params
    assert "resolved.window" not in by_asset["transformer_lm"][0].data.params
    assert by_asset["transformer_window_lm"][0].data.params["resolved.window"] == "8"
    # The run id and link go back into Dagster's metadata.
    mats = materializations(inst, run_id)
    assert mats["tokenizer"].metadata["mlflow_run_id"].value == tok.info.run_id
    assert mats["tokenizer"].metadata["mlflow_url"].value == (
        f"{MLFLOW_UI}/#/experiments/{tok.info.experiment_id}/runs/{tok.info.run_id}?workflowType=machine_learning"
    )


def test_studies_report_measured_findings(tiny_run):
    state, inst, run_id = tiny_run
    grads = manifest(inst, run_id, "gradient_study")
    f = {(r["model"], r["variant"]): r["step_factor"] for r in grads["rows"]}
    assert f[("rnn", "contractive")] < 1 < f[("rnn", "expansive")]
    cost = manifest(inst, run_id, "recurrent_cost")
    assert {r["model"] for r in cost["rows"]} == {"rnn", "lstm"}
    comparison = manifest(inst, run_id, "model_comparison")
    assert {r["model"] for r in comparison["rows"]} == {
        "rnn",
        "lstm",
        "transformer",
        "transformer_window",
        "transformer_1head",
    }  # every defs.yaml model
    params = [r["params"] for r in comparison["rows"]]
    assert max(params) / min(params) < 1.1  # sized to one parameter budget
    assert comparison["matched_time_s"] > 0
    # The count ladder (orders 1-4 here) sits in the table as rows of its own, the order chosen on held-out data
    # marked; every model's parameters split into embedding, head and core.
    assert [r["model"] for r in comparison["baseline"]] == ["kn_1gram", "kn_2gram", "kn_3gram", "kn_4gram"]
    ngram = manifest(inst, run_id, "ngram_baseline")
    assert [r["model"] for r in comparison["baseline"] if r["count_model"]] == [ngram["chosen"]["model"]]
    assert all(r["params_embedding"] + r["params_head"] + r["params_core"] == r["params"] for r in comparison["rows"])
    assert len(comparison["pairs"]) == 10 and {p["verdict"] for p in comparison["pairs"]} <= {"better", "tied", "worse"}
    assert abs(comparison["accounting"]["transformer"]["ffn_share"] - 2 / 3) < 0.05
    ev = manifest(inst, run_id, "embedding_eval")["metrics"]
    assert 0 < ev["analogy/coverage"] <= 1 and "wordsim353/oov" in ev
    # gensim's Word2Vec trained beside ours on the same sentences, scored by the same evaluators.
    assert 0 < ev["gensim/analogy/coverage"] <= 1 and "gensim/wordsim353/oov" in ev
    assert manifest(inst, run_id, "word_embeddings")["reference_path"].endswith("gensim_vectors.txt")
    # The long-context summary times the Transformer at the recurrent sweep's lengths and checks the
    # KV-cache formula against generation_cost's measured bytes; context_usage covers the three models.
    lc = manifest(inst, run_id, "long_context_cost")
    assert [r["seq_len"] for r in lc["train_rows"] if r["model"] == "transformer"] == [16, 32, 64]
    assert {c["recurrent"] for c in lc["crossovers"]} == {"rnn", "lstm"}
    assert lc["kv_check"] and all(r["measured_over_predicted"] == 1 for r in lc["kv_check"])
    usage = manifest(inst, run_id, "context_usage")
    assert {s["model"] for s in usage["summaries"]} == {"transformer", "transformer_window", "lstm"}
    assert all(len(c) == 32 for c in usage["curves"].values()) and usage["window_gaps"][0]["window"] == 8
    heads = manifest(inst, run_id, "attention_heads")
    assert (
        len(heads["heads"]) == 2 * 4
        and heads["one_head_loss"] > 0
        and heads["metrics"]["heads/max_row_sum_error"] < 1e-5
    )
    memories = manifest(inst, run_id, "ffn_memories")
    assert len(memories["neurons"]) == 3 and all(n["value_tokens"] for n in memories["neurons"])
    # The 24 documents name three facts of one relation (France → French, Greece → Greek, Spain → Spanish);
    # a fact model per seed, each probed with its untrained twin, its weights recorded.
    assert memories["facts_found"] == 3 and [s["seed"] for s in memories["seeds"]] == [0, 1]
    assert all(s["steps"] == 20 and s["facts"] == 3 for s in memories["seeds"])
    assert {"fact_tokenizer", "fact_model_seed0", "fact_model_seed1"} <= set(memories["files"])
    assert len(memories["fact_rows"]) == 6 and len(memories["made_up"]) == 3
    # Tables are sortable Dagster tables.
    assert isinstance(materializations(inst, run_id)["gradient_study"].metadata["factors"], dg.TableMetadataValue)


def test_new_claims_are_checks_with_their_figures(tiny_run):
    state, inst, run_id = tiny_run
    evs = check_evaluations(inst, run_id)
    for lm in ("rnn_lm", "lstm_lm", "transformer_lm", "transformer_window_lm", "transformer_1head_lm"):
        m = evs[("clipping_bounds_gradient", lm)].metadata
        assert m["max_grad_norm_clipped"].value <= m["grad_clip"].value * (1 + 1e-4) and m["log_points"].value == 6
        assert "points_over_clip" in m and "max_grad_norm" in m
        # Judged against the n-gram on the very targets the model was scored on (at 30 steps it may not beat it).
        m = evs[("language_models_beat_the_count_model", lm)].metadata
        assert (
            m["same_targets"].value
            and m["same_block_size"].value
            and m["val_targets"].value == m["count_model_targets"].value > 0
        )
        assert m["on_the_ladder"].value.startswith(("between the", "above every rung", "below every rung"))
    # At 30 steps some Transformer's gradient norm exceeds grad_clip at a log point: the bound was needed
    # there, and the clipped norm still kept to it. (Which one depends on the rounding of the run: with
    # bfloat16 RoPE rounded once, transformer_lm peaked at 0.94 and transformer_1head_lm at 2.0.)
    over = [
        m
        for lm in ("transformer_lm", "transformer_window_lm", "transformer_1head_lm")
        if (m := evs[("clipping_bounds_gradient", lm)].metadata)["points_over_clip"].value > 0
    ]
    assert over and all(m["max_grad_norm"].value > m["grad_clip"].value for m in over)  # clipped: checked above
    m = evs[("word_vectors_carry_similarity", "embedding_eval")].metadata  # one-hot distances beside it
    assert m["onehot_min"].value == m["onehot_max"].value == pytest.approx(2**0.5) and m["learned_cv"].value > 0
    m = evs[("pad_excluded_from_similarity", "word_embeddings")].metadata
    assert m["pad_in_neighbours"].value == 0 and m["words_probed"].value == 200 and m["pad_row_norm"].value == 0
    assert evs[("attention_rows_sum_to_one", "attention_heads")].metadata["max_row_sum_error"].value < 1e-5
    m = evs[("heads_differ", "attention_heads")].metadata  # per-head ablation on validation text, held out
    assert m["heldout_blocks"].value > 0 and "layer0_low" in m and "one_head_minus_multi_head" in m
    assert evs[("clipping_tames_exploding_gradients", "gradient_study")].metadata["unclipped_diverges"].value
    m = evs[("attention_scales_as_claimed", "attention_cost")].metadata
    assert 3.6 <= m["reference_memory_ratio_last_doubling"].value <= 4.4
    assert evs[("kv_cache_grows_recurrent_state_does_not", "generation_cost")].passed


def test_report_names_every_stage_and_claim_and_sits_on_the_mlflow_parent(tiny_run):
    state, inst, run_id = tiny_run
    from pipelines.definitions import DEFAULT_ROUTE, defs

    graph = defs.resolve_asset_graph()
    report = manifest(inst, run_id, "report")
    page = Path(report["path"]).read_text(encoding="utf-8")
    assert Path(report["path"]).parent.name == run_id
    for key in DEFAULT_ROUTE.resolve(graph):
        node = graph.get(key)
        if key.to_user_string() != "report":
            assert f'id="stage-{node.group_name}"' in page and f'id="asset-{key.to_user_string()}"' in page
    assert page.count("data:image/png;base64,") >= 20  # the stages' plots, in the page itself
    # Every check of the run that judges a claim is in the report, with the same verdict.
    evs = check_evaluations(inst, run_id)
    data_checks = {"tokenizer_is_healthy", "labels_are_shifted_inputs", "val_loss_holds_since_previous_run"}
    claims = {(c["claim"], c["asset"]): c["status"] for c in report["claims"]}
    # The thesis at scale is judged from the scaling job's latest run: none yet, so not judged (never a pass).
    at_scale = ("transformer_overtakes_lstm_with_compute", "scaling_laws")
    assert claims.pop(at_scale) == "not judged"
    assert set(claims) == {k for k in evs if k[0] not in data_checks}
    for (name, asset), status in claims.items():
        assert (status == "passed") == evs[(name, asset)].passed, (name, asset, status)
        assert f'id="claim-{name}-{asset}"' in page
        assert f'<tr class="{status.replace(" ", "_")}" id="claim-{name}-{asset}">' in page
    assert all(name in page for name in data_checks)  # as Dagster recorded them
    # The page's counts are Dagster's: this run's assets and its check evaluations.
    assert f"<th>assets in this run</th><td>{len(materializations(inst, run_id))}</td>" in page
    assert f"<th>checks in this run</th><td>{len(evs)}</td>" in page
    # On the MLflow parent run: the page, the headline metrics, the summary as its description.
    client, all_runs = mlflow_runs(state)
    parent = next(r for r in all_runs if r.data.tags.get("dagster.role") == "dagster_run")
    assert report["mlflow_parent_run_id"] == parent.info.run_id
    assert "report.html" in [a.path for a in client.list_artifacts(parent.info.run_id)]
    assert parent.data.metrics["claims/passed"] == report["counts"]["passed"] > 5  # the article's claims, each once
    assert parent.data.metrics["invariants/failed"] == report["invariant_counts"]["failed"] == 0
    # The headline counts the evidence alone; demonstrations and invariants apart.
    assert sum(report["counts"].values()) == len({c["claim"] for c in report["claims"] if c["kind"] == "evidence"})
    assert (
        sum(report["demonstration_counts"].values())
        == len({c["claim"] for c in report["claims"] if c["kind"] == "demonstration"})
        == 7
    )
    assert parent.data.metrics["demonstrations/passed"] == report["demonstration_counts"]["passed"]
    assert (
        parent.data.metrics["transformer_lm/val/loss"]
        == manifest(inst, run_id, "transformer_lm")["metrics"]["val/loss"]
    )
    note = parent.data.tags["mlflow.note.content"]
    assert "`heads_differ`" in note and "report.html" in note and note.startswith("Dagster run [")
    # Linked from Dagster: the file and its view in the MLflow UI.
    meta = materializations(inst, run_id)["report"].metadata
    assert meta["report_path"].value == report["path"]
    assert meta["report_url"].value.endswith(
        f"/runs/{parent.info.run_id}/artifacts/report.html?workflowType=machine_learning"
    )


def test_comparison_children_line_up_in_mlflow(tiny_run):
    state, inst, run_id = tiny_run
    client, all_runs = mlflow_runs(state)
    comp = next(
        r
        for r in all_runs
        if r.data.tags.get("dagster.asset_key") == "model_comparison" and r.info.run_name == "model_comparison"
    )
    children = [r for r in all_runs if r.data.tags.get("mlflow.parentRunId") == comp.info.run_id]
    # Named so they cannot be taken for the models' own runs (`rnn` beside `rnn_lm`).
    assert sorted(r.info.run_name for r in children) == [
        f"model_comparison/{m}" for m in ("lstm", "rnn", "transformer", "transformer_1head", "transformer_window")
    ]
    for r in children:
        assert {"val/loss", "val/ppl", "train/tokens_per_s_mean", "params"} <= set(r.data.metrics)
    lm_runs = {
        r.data.tags["dagster.asset_key"]: r
        for r in all_runs
        if r.data.tags.get("dagster.asset_key", "").endswith("_lm")
    }
    for name in ("rnn_lm", "lstm_lm", "transformer_lm"):
        history = client.get_metric_history(lm_runs[name].info.run_id, "train/loss")
        assert len(history) >= 3  # step-wise training metrics under the shared names
        # ... and only the loop's points: the headline figure does not add a point at step 0.
        steps = [m.step for m in history]
        assert steps == sorted(steps) and steps[0] > 0 and len(set(steps)) == len(steps)
        val = client.get_metric_history(lm_runs[name].info.run_id, "val/loss")
        assert val[0].step > 0 and val[-1].value == lm_runs[name].data.metrics["val/loss"]


def test_bad_input_fails_without_materialization_and_marks_mlflow_failed(state_dir, tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n")
    cfg = {"ops": {"corpus": {"config": {"source": "files", "path": str(tmp_path / "empty.txt")}}}}
    result = materialize(cfg, selection="corpus")
    assert not result.success
    assert not result.get_asset_materialization_events()
    errors = [e.event_specific_data.error.to_string() for e in result.all_events if e.is_step_failure]
    assert any("empty.txt is empty" in e for e in errors), errors
    _, all_runs = mlflow_runs(state_dir)
    corpus_runs = [r for r in all_runs if r.data.tags.get("dagster.asset_key") == "corpus"]
    assert [r.info.status for r in corpus_runs] == ["FAILED"]
    assert "PipelineInputError" in corpus_runs[0].data.tags["error"]
    parents = [r for r in all_runs if r.data.tags.get("dagster.role") == "dagster_run"]
    assert [r.info.status for r in parents] == ["FAILED"]
    assert not list((state_dir / "artifacts").rglob("*.arrow"))


def test_one_memory_task_selected_alone_materializes_alone(state_dir):
    """The memory tasks are one step (a multi-asset): selecting one trains and publishes that one only,
    with its own MLflow run and its own folder."""
    cfg = {"ops": {"memory_tasks": TINY["ops"]["memory_tasks"]}}
    result = materialize(cfg, selection=["memory_recall"])
    assert result.success
    assert [e.asset_key.to_user_string() for e in result.get_asset_materialization_events()] == ["memory_recall"]
    assert {p.name for p in (state_dir / "artifacts").iterdir()} == {"memory_recall"}
    _, all_runs = mlflow_runs(state_dir)
    assets = sorted(r.data.tags["dagster.asset_key"] for r in all_runs if "dagster.asset_key" in r.data.tags)
    assert assets == ["memory_recall"]
    assert all(r.info.status == "FINISHED" for r in all_runs)


def test_missing_upstream_fails_with_a_clear_message(state_dir):
    result = materialize({"ops": {"tokenizer": TINY["ops"]["tokenizer"]}}, selection="tokenizer")
    errors = [e.event_specific_data.error.to_string() for e in result.all_events if e.is_step_failure]
    assert not result.success and any("upstream asset `corpus` has never been materialized" in e for e in errors), (
        errors
    )


def test_dagster_and_mlflow_link_both_ways(tiny_run):
    """The Dagster run carries its MLflow parent's id and URL; every MLflow run carries its Dagster
    run's URL (nested: also its asset page), MLflow's source fields, the git commit and the user."""
    import re
    import subprocess

    from components.orchestration.state import PROJECT_ROOT

    state, inst, run_id = tiny_run
    _, all_runs = mlflow_runs(state)
    parent = next(r for r in all_runs if r.data.tags.get("dagster.role") == "dagster_run")
    exp = parent.info.experiment_id
    tags = inst.get_run_by_id(run_id).tags
    assert tags["mlflow/parent_run_id"] == parent.info.run_id
    assert (
        tags["mlflow/parent_run_url"]
        == f"{MLFLOW_UI}/#/experiments/{exp}/runs/{parent.info.run_id}?workflowType=machine_learning"
    )
    # A run of an asset selection (not a config job) is named after the selection and its start.
    created = inst.get_run_record_by_id(run_id).create_timestamp
    assert re.fullmatch(r"assets:\w+,\w+,\w+ \+\d+ @ \d{4}-\d\d-\d\d \d\d:\d\d UTC", parent.info.run_name), (
        parent.info.run_name
    )
    assert parent.info.run_name.endswith(f"{created:%Y-%m-%d %H:%M} UTC")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True).stdout.strip()
    for r in all_runs:
        t = r.data.tags
        assert t["dagster.run_url"] == f"{DAGSTER_UI}/runs/{run_id}"
        assert t["mlflow.source.type"] == "JOB" and t["mlflow.user"] and r.info.user_id == t["mlflow.user"]
        assert t.get("mlflow.source.git.commit") == (head if (PROJECT_ROOT / ".git").exists() else None)
        if r is not parent:
            asset = t["dagster.asset_key"]
            assert t["dagster.asset_url"] == f"{DAGSTER_UI}/assets/{asset}"
            module, name = t["mlflow.source.name"].split(":")
            assert name == asset and module.startswith(("pipelines.", "components.orchestration."))
            if t.get("dagster.role") != "comparison_child":  # (one per model under model_comparison's run)
                assert f"]({DAGSTER_UI}/assets/{asset})" in t["mlflow.note.content"]
    # A run of an asset selection (Dagster's implicit `__ASSET_JOB`, or the ephemeral job of an
    # in-process materialize) reads as one, not by that name.
    job = inst.get_run_by_id(run_id).job_name
    assert parent.data.tags["mlflow.source.name"] == "pipelines.definitions:" + (
        "asset selection" if job.startswith("__") else job
    )
    assert "__ASSET_JOB" not in parent.data.tags["mlflow.note.content"]


def test_experiment_opens_in_the_model_training_view(tiny_run):
    state, _, _ = tiny_run
    client, _ = mlflow_runs(state)
    exp = client.get_experiment_by_name("wordvec-to-transformer")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert "one parent run per Dagster run" in exp.tags["mlflow.note.content"]


def test_every_language_model_is_registered_with_links_back(tiny_run):
    """One registered model per language-model asset, named after it; its version is the logged model
    of this run's nested run, tagged with the Dagster run, and loads and generates through pyfunc."""
    import mlflow

    from components.orchestration.language_model import LM_TAG
    from pipelines.definitions import defs

    state, inst, run_id = tiny_run
    client, all_runs = mlflow_runs(state)
    graph = defs.resolve_asset_graph()
    lms = sorted(k for k in materializations(inst, run_id) if LM_TAG in graph.get(dg.AssetKey.from_user_string(k)).tags)
    assert lms == ["lstm_lm", "rnn_lm", "transformer_1head_lm", "transformer_lm", "transformer_window_lm"]
    nested = {
        r.data.tags["dagster.asset_key"]: r
        for r in all_runs
        if r.data.tags.get("dagster.role") != "comparison_child" and "dagster.asset_key" in r.data.tags
    }
    registered = {m.name for m in client.search_registered_models()}
    assert set(lms) | {"transformer_lm_fp16"} <= registered
    for name in lms:
        (mv,) = client.search_model_versions(f"name = '{name}'")
        assert mv.run_id == nested[name].info.run_id and mv.tags["dagster.run_id"] == run_id
        assert (
            mv.tags["dagster.run_url"] == f"{DAGSTER_UI}/runs/{run_id}"
            and mv.tags["dagster.asset_url"] == f"{DAGSTER_UI}/assets/{name}"
        )
        assert mv.source.startswith("models:/m-")  # the logged model of the run, as MLflow's log_model registers
        logged = client.get_logged_model(mv.source.removeprefix("models:/"))
        assert str(logged.status) in ("READY", "LoggedModelStatus.READY") and logged.source_run_id == mv.run_id
        assert manifest(inst, run_id, name)["registered_model"]["uri"] == f"models:/{name}/{mv.version}"
    mlflow.set_tracking_uri(f"sqlite:///{state / 'mlflow' / 'mlflow.db'}")
    try:
        model = mlflow.pyfunc.load_model("models:/rnn_lm/1")
        assert [c.name for c in model.metadata.signature.inputs] == ["prompt"]
        out = model.predict({"prompt": ["The history of", "A"]}, params={"max_new_tokens": 4, "temperature": 0.0})
        assert len(out) == 2 and all(isinstance(t, str) and t for t in out)
    finally:
        mlflow.set_tracking_uri("")


def test_params_non_embedding_is_params_minus_the_embedding(tiny_run):
    state, inst, run_id = tiny_run
    comparison = manifest(inst, run_id, "model_comparison")
    for name in ("rnn_lm", "lstm_lm", "transformer_lm", "transformer_window_lm", "transformer_1head_lm"):
        lm = manifest(inst, run_id, name)
        m = lm["metrics"]
        assert m["params"] - m["params_non_embedding"] == lm["vocab_size"] * lm["model_config"]["n_embd"], name
        if name.startswith("transformer"):
            assert comparison["accounting"][name.removesuffix("_lm")]["non_embedding"] == m["params_non_embedding"]


def test_a_rerun_says_what_moved_since_the_run_before(tiny_run):
    """A second tiny run in the same instance, started as a schedule starts it: each language model and
    the report carry the previous run's figures and the change, the regression check judges it, the
    report opens on the result and links MLflow's compare view, the parent run's description gives the
    table, and the registry's aliases point at the best and at the scheduled version."""
    state, inst, first = tiny_run

    def run_materialize(tags):
        from pipelines.definitions import DEFAULT_ROUTE, defs

        return dg.materialize(
            list(defs.assets) + list(defs.asset_checks),
            resources=defs.resources,
            run_config=TINY,
            selection=DEFAULT_ROUTE,
            instance=inst,
            raise_on_error=False,
            tags=tags,
        )

    second = run_materialize({"dagster/schedule_name": "weekly_default"})
    assert second.success, "\n".join(step_errors(inst, second.run_id))
    mats = materializations(inst, second.run_id)
    for name in ("rnn_lm", "transformer_lm"):
        meta = mats[name].metadata
        before = materializations(inst, first)[name].metadata["val_loss"].value
        assert meta["previous_run_id"].value == first and meta["val_loss_previous"].value == before
        assert meta["val_loss_change"].value == pytest.approx(meta["val_loss"].value - before)
        assert meta["val_loss_verdict"].value in ("unchanged", "within noise", "better", "worse", "changed")
        assert "| val/loss |" in meta["since_previous_run"].value
        ev = check_evaluations(inst, second.run_id)[("val_loss_holds_since_previous_run", name)]
        assert ev.passed == (meta["val_loss_verdict"].value != "worse") and "val/loss" in ev.metadata["reason"].value
    # The first run had nothing to compare with.
    assert "first materialization" in materializations(inst, first)["rnn_lm"].metadata["since_previous_run"].value
    report = manifest(inst, second.run_id, "report")
    changes = {c["name"]: c for c in report["published"]["changes"]}
    assert changes["claims/passed"]["previous"] == manifest(inst, first, "report")["counts"]["passed"]
    page = Path(report["path"]).read_text(encoding="utf-8")
    assert page.index('id="result"') < page.index('id="claims"') and "since the previous run" in page
    assert "count model (" in page.split('id="claims"')[0]
    meta = mats["report"].metadata
    assert "compare-runs?runs=" in meta["mlflow_compare_url"].value
    assert "orderByKey=metrics.%60val%2Floss%60" in meta["mlflow_models_by_val_loss_url"].value
    client, all_runs = mlflow_runs(state)
    parent = next(
        r
        for r in all_runs
        if r.data.tags.get("dagster.role") == "dagster_run" and r.data.tags.get("dagster.run_id") == second.run_id
    )
    note = parent.data.tags["mlflow.note.content"]
    assert "| model | val loss |" in note and "previous run" in note and "compare-runs" in note
    # The registry: `champion` on the lowest validation loss, `latest-scheduled` on the scheduled run's version.
    for name in ("rnn_lm", "transformer_lm"):
        versions = client.search_model_versions(f"name = '{name}'")
        scheduled = manifest(inst, second.run_id, name)["registered_model"]["version"]
        assert str(client.get_model_version_by_alias(name, "latest-scheduled").version) == scheduled
        best = min(float(v.tags["val_loss"]) for v in versions)
        assert float(client.get_model_version_by_alias(name, "champion").tags["val_loss"]) == best
    assert "latest-scheduled" not in materializations(inst, first)["rnn_lm"].metadata["registry_aliases"].value


def test_the_scaling_job_trains_each_family_at_each_budget_and_the_next_report_judges_it(tiny_run):
    """Last in this module: it adds a scaling run (and a report) to the tiny run's instance."""
    state, inst, run_id = tiny_run
    result = materialize(TINY_SCALING, selection=dg.AssetSelection.assets("scaling_laws"), inst=inst)
    assert result.success, "\n".join(step_errors(inst, result.run_id))
    m = manifest(inst, result.run_id, "scaling_laws")
    budgets = TINY_SCALING["ops"]["scaling_laws"]["config"]["budgets"]
    assert (
        m["budgets"] == budgets
        and m["count_model"]["model"] == manifest(inst, run_id, "ngram_baseline")["chosen"]["model"]
    )
    for name in ("rnn_lm", "lstm_lm", "transformer_lm"):
        mine = [t for t in m["trials"] if t["model"] == name]
        points = sorted((t for t in mine if t["role"] == "point"), key=lambda t: t["budget"])  # run: ends first
        assert [t["budget"] for t in points] == budgets
        assert points[0]["params"] < points[1]["params"] < points[2]["params"]  # the size grows with the budget
        assert all(abs(t["flops"] - t["budget"]) <= 0.2 * t["budget"] and t["train_seconds"] > 0 for t in points)
        # Swept (two learning rates each, trained on the training split less its tail and scored on that tail) at
        # the smallest and the largest budget, the chosen one trained again on the whole split; interpolated between.
        assert [sum(t["budget"] == b for t in mine) for b in budgets] == [3, 1, 3]
        assert all((t["scored_on"] == "heldout") == (t["role"] == "sweep") for t in mine)
        fam = m["families"][name]
        assert fam["fit_flops"]["x0"] == pytest.approx(points[0]["flops"]) and fam["noise"] > 0
    assert m["versus"]["transformer"] == "transformer_lm" and m["versus"]["lstm"] == "lstm_lm"
    # Every training is a nested MLflow run under the asset's run.
    client, all_runs = mlflow_runs(state)
    children = [r for r in all_runs if r.data.tags.get("mlflow.parentRunId") == m["mlflow_run_id"]]
    assert len(children) == len(m["trials"])
    assert sorted("val/loss" in r.data.metrics for r in children) == sorted(t["role"] == "point" for t in m["trials"])
    ev = check_evaluations(inst, result.run_id)[("transformer_overtakes_lstm_with_compute", "scaling_laws")]
    assert ev.severity == dg.AssetCheckSeverity.WARN and "z" in ev.metadata
    # The next report judges the thesis from that run, and gives each model's compute to pass the count model.
    report_only = {**TINY, "ops": {k: v for k, v in TINY["ops"].items() if k == "report"}}
    again = materialize(report_only, selection=dg.AssetSelection.assets("report"), inst=inst)
    assert again.success, "\n".join(step_errors(inst, again.run_id))
    report = manifest(inst, again.run_id, "report")
    status = {(c["claim"], c["asset"]): c["status"] for c in report["claims"]}
    assert status[("transformer_overtakes_lstm_with_compute", "scaling_laws")] in ("passed", "warning")
    page = Path(report["path"]).read_text(encoding="utf-8")
    assert "scaling_passes_at_flops" in page
