import math

from components.core.studies.comparison import compare_models, loss_at_time, training_time_axis


def _history(step_ms: float, losses: list[float], eval_every: int = 10) -> list[dict]:
    h = []
    for i, loss in enumerate(losses, start=1):
        h.append({"step": i * eval_every, "step_ms": step_ms, "train/loss": loss, "val/loss": loss})
    return h


def test_training_time_counts_only_steps():
    pts = training_time_axis(_history(100.0, [3.0, 2.0, 1.5]))
    assert [t for t, _ in pts] == [1.0, 2.0, 3.0]  # 10 steps × 100 ms per eval point
    assert loss_at_time(pts, 1.5) == 2.5 and math.isnan(loss_at_time(pts, 0.5))


def test_matched_wall_clock_favours_the_faster_model():
    # Same losses per step, but "fast" steps take half the time: at the matched time it is further along.
    models = {
        "slow": {"metrics": {"params": 1000, "val/loss": 1.5, "val/ppl": math.exp(1.5), "train/tokens_per_s_mean": 100.0}, "history": _history(100.0, [3.0, 2.0, 1.5])},
        "fast": {"metrics": {"params": 1000, "val/loss": 1.5, "val/ppl": math.exp(1.5), "train/tokens_per_s_mean": 200.0}, "history": _history(50.0, [3.0, 2.0, 1.5])},
    }
    result = compare_models(models)
    assert result.matched_time_s == 1.5  # the longest time both models reached
    by = {r["model"]: r for r in result.rows}
    assert by["fast"]["val_loss_at_matched_time"] == 1.5
    assert by["slow"]["val_loss_at_matched_time"] == 2.5
    assert "| fast |" in result.markdown() and "comparison" in result.figures


def test_tokens_axis_and_ranking_settledness():
    from components.core.studies.comparison import ranking_settledness, tokens_axis

    h = [{"step": 10, "step_ms": 50.0, "tokens_per_s": 2000.0, "val/loss": 3.0}, {"step": 20, "val/loss": 2.5}]
    assert tokens_axis(h) == [(1000.0, 3.0), (2000.0, 2.5)]  # 100 tokens per step, read off the log point
    assert tokens_axis([{"step": 10, "val/loss": 3.0}]) == []
    crossing = {"a": [(1, 3.0), (2, 2.0)], "b": [(1, 2.5), (2, 2.2)]}  # b led, a leads now
    st = ranking_settledness(crossing)
    assert st == {"ranking_last_eval": ["a", "b"], "ranking_previous_eval": ["b", "a"], "ranking_settled": False}
    assert ranking_settledness({"a": [(1, 3.0), (2, 2.0)], "b": [(1, 3.5), (2, 2.2)]})["ranking_settled"]
    models = {n: {"metrics": {"params": 1, "val/loss": c[-1][1], "val/ppl": 1.0, "train/tokens_per_s_mean": 1.0},
                  "history": [{"step": 10 * i, "step_ms": 10.0, "val/loss": v} for i, (_, v) in enumerate(c, 1)]} for n, c in crossing.items()}
    r = compare_models(models)
    assert r.metrics()["ranking_settled"] == 0.0 and "still changing" in r.markdown()
