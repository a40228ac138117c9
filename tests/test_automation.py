"""Schedules and declarative automation, evaluated without a daemon."""

import datetime as dt

import dagster as dg

from pipelines.definitions import defs

ALL = [k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()]


def test_weekly_schedule_requests_the_default_pipeline():
    schedule = defs.resolve_schedule_def("weekly_default_pipeline")
    assert schedule.job_name == "default_pipeline"
    ctx = dg.build_schedule_context(scheduled_execution_time=dt.datetime(2026, 11, 30, 3, 0, tzinfo=dt.timezone.utc))
    requests = schedule.evaluate_tick(ctx).run_requests
    assert len(requests) == 1
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING


def test_downstream_follows_an_upstream_update():
    instance = dg.DagsterInstance.ephemeral()
    first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
    requested = {k for k in ALL if first.get_num_requested(dg.AssetKey(k))}
    # Nothing exists yet and nothing changed: eager requests nothing (the root is never "newly
    # updated", and downstream waits for its parents).
    assert requested == set()
    # Record a new `corpus` materialization: everything downstream is requested (in one run,
    # parents before children), and `corpus` itself is not.
    instance.report_runless_asset_event(dg.AssetMaterialization("corpus"))
    second = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
    requested = {k for k in ALL if second.get_num_requested(dg.AssetKey(k))}
    # Exactly what lies downstream of it in the asset graph, but for what also reads another root
    # (`attention_cost`, the memory tasks): those roots read no upstream (they time attention on random
    # q, k, v, or train on generated sequences), so a corpus update does not rerun them, and eager waits
    # for a parent that was never materialized (long_context_cost, attention_heads); and but for the
    # learning-rate sweep, which has no automation condition (it is run on purpose, as the `tune` job).
    graph = defs.resolve_asset_graph()
    below = dg.AssetSelection.assets("corpus").downstream(include_self=False).resolve(graph)
    roots = [k for k in graph.get_all_asset_keys() if not graph.get(k).parent_keys and k != dg.AssetKey("corpus")]
    waiting = dg.AssetSelection.assets(*roots).downstream().resolve(graph)
    manual = {k for k in graph.get_all_asset_keys() if graph.get(k).automation_condition is None}
    assert dg.AssetKey("lr_sweep") in manual and {
        dg.AssetKey("attention_cost"),
        dg.AssetKey("memory_induction"),
    } <= set(roots)
    downstream = {k.to_user_string() for k in below - waiting - manual}
    assert requested == downstream and {"tokenizer", "labels", "model_comparison", "context_usage"} <= requested
    assert not {"attention_cost", "long_context_cost"} & requested
