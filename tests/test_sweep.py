"""The learning-rate sweep: it picks the best rate where the best rate is known, and refuses bad grids."""

import pytest
import torch

from components.core.errors import ConfigError
from components.core.studies.sweep import SweepSettings, check_grid, run_sweep


def regression_trial(params: dict) -> dict:
    """Least squares on inputs ±2 by plain SGD: the loss's curvature is mean(x²) = 4, so a step of
    lr = 1/4 lands on the minimum at once; smaller steps creep, larger ones overshoot (lr > 1/2 diverges)."""
    torch.manual_seed(0)
    x = torch.tensor([2.0, -2.0, 2.0, -2.0])
    y = 3.0 * x
    w = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=params["lr"])
    for _ in range(params["max_steps"]):
        opt.zero_grad()
        loss = 0.5 * ((w * x - y) ** 2).mean()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return {"val_loss": float(0.5 * ((w * x - y) ** 2).mean())}


def test_the_sweep_picks_the_known_best_learning_rate():
    seen = []
    result = run_sweep(
        SweepSettings(lrs=[0.05, 0.1, 0.25, 0.4, 0.6], warmup_steps=[0], max_steps=5), regression_trial, log=seen.append
    )
    assert result.best["lr"] == 0.25 and result.best["val_loss"] < 1e-10
    assert (
        len(result.trials) == len(seen) == 5 and result.trials[-1]["val_loss"] > result.trials[0]["val_loss"]
    )  # 0.6 overshoots
    assert "**(chosen)**" in result.markdown() and "sweep" in result.figures
    assert not result.at_edge and "edge" not in result.markdown()


def test_a_choice_at_the_grids_edge_says_so():
    result = run_sweep(SweepSettings(lrs=[0.05, 0.1], warmup_steps=[0], max_steps=5), regression_trial)
    assert result.best["lr"] == 0.1 and result.at_edge  # the best, 0.25, lies beyond the grid
    assert "widen the grid" in result.markdown()


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(lrs=[]), "lrs is empty"),
        (dict(lrs=[1e-3, 0.0]), "lrs holds non-positive"),
        (dict(lrs=[-1e-3]), "lrs holds non-positive"),
        (dict(warmup_steps=[]), "warmup_steps is empty"),
        (dict(max_steps=0), "max_steps=0 is smaller than one step"),
        (dict(warmup_steps=[700]), "warmup_steps=700"),
        (dict(batch_sizes=[]), "batch_sizes is empty"),
        (dict(batch_sizes=[16, 0]), "batch_sizes holds values below 1"),
        (dict(max_steps=40, batch_sizes=[16, 64], warmup_steps=[10]), "max_steps=10 \\(at batch size 64\\)"),
    ],
)
def test_bad_grids_name_the_setting(bad, field):
    with pytest.raises(ConfigError, match=field):
        run_sweep(SweepSettings(**bad), regression_trial, where="tune")


def test_batch_sizes_share_one_token_budget_and_the_best_is_chosen():
    """At equal tokens a smaller batch takes more steps: on least squares with exact gradients (no
    noise to average out) more steps at the same rate get closer, so the smallest batch must win, and
    a larger rate can beat a smaller one only through its steps."""
    seen = []
    s = SweepSettings(lrs=[0.02, 0.05], warmup_steps=[0], max_steps=10, batch_sizes=[4, 2, 8])
    result = run_sweep(s, regression_trial, log=seen.append)
    assert [(t["batch_size"], t["max_steps"]) for t in seen] == [(4, 10), (4, 10), (2, 20), (2, 20), (8, 5), (8, 5)]
    assert result.best["batch_size"] == 2 and result.best["lr"] == 0.05 and result.batch_at_edge
    assert "| 2 | 20 | 0.05 | 0 |" in result.markdown() and "edge of the sizes tried" in result.markdown()
    # with one batch size, the edge note stays out
    assert not run_sweep(SweepSettings(lrs=[0.05], warmup_steps=[0], max_steps=10), regression_trial).batch_at_edge


def test_a_budget_below_one_step_is_refused():
    with pytest.raises(ConfigError, match="smaller than one step"):
        check_grid(SweepSettings(), where="tune", tokens_per_step=16 * 128, budget_tokens=1000)


def test_the_tune_job_is_one_job_away_and_off_the_default_route():
    from pipelines.definitions import DEFAULT_ROUTE, defs

    graph = defs.resolve_asset_graph()
    route = {k.to_user_string() for k in DEFAULT_ROUTE.resolve(graph)}
    assert "lr_sweep" not in route and "ngram_baseline" in route
    job = defs.resolve_job_def("tune")
    assert {n.name for n in job.graph.node_defs} == {"lr_sweep"}


@pytest.mark.parametrize("field", ["models", "lrs_by_model", "batch_sizes_by_model"])
def test_the_tune_job_refuses_a_model_it_does_not_sweep(field):
    # Refused by name when the run's config is read, before any input is loaded or any trial trains.
    from pydantic import ValidationError

    from pipelines.defs.tune import LrSweepConfig

    value = {"models": ["gpt_lm"], "lrs_by_model": {"gpt_lm": [1e-3]}, "batch_sizes_by_model": {"gpt_lm": [8]}}
    with pytest.raises(ValidationError, match=rf"lr_sweep\.{field} names \['gpt_lm'\]; valid: "):
        LrSweepConfig(**{field: value[field]})
    known = {"models": ["lstm_lm"], "lrs_by_model": {"lstm_lm": [1e-3]}, "batch_sizes_by_model": {"lstm_lm": [8]}}
    LrSweepConfig(**{field: known[field]})  # a model it sweeps is taken


@pytest.mark.parametrize(
    "given, field",
    [
        ({"lrs": []}, "lrs"),
        ({"batch_sizes": []}, "batch_sizes"),
        ({"lrs_by_model": {"rnn_lm": []}}, r"lrs_by_model\[rnn_lm\]"),
        ({"batch_sizes_by_model": {"lstm_lm": []}}, r"batch_sizes_by_model\[lstm_lm\]"),
    ],
)
def test_the_tune_job_refuses_an_empty_grid_instead_of_replacing_it(given, field):
    from pydantic import ValidationError

    from pipelines.defs.tune import LrSweepConfig

    with pytest.raises(ValidationError, match=rf"lr_sweep\.{field} is empty"):
        LrSweepConfig(**given)


def test_a_grid_the_user_gives_is_never_replaced_by_a_family_default():
    from pipelines.defs.tune import GRID_BATCH_SIZES, GRID_LRS, LrSweepConfig

    mine = LrSweepConfig(lrs=[1e-3, 2e-3], batch_sizes=[32])
    for name in ("rnn_lm", "lstm_lm", "transformer_lm"):
        assert mine.for_model(name).lrs == [1e-3, 2e-3] and mine.for_model(name).batch_sizes == [32]
    own = LrSweepConfig(lrs=[1e-3], lrs_by_model={"lstm_lm": [5e-2]})
    assert own.for_model("lstm_lm").lrs == [5e-2] and own.for_model("rnn_lm").lrs == [1e-3]
    defaults = LrSweepConfig()  # nothing given: each family's own grid
    assert defaults.for_model("transformer_lm").lrs == GRID_LRS["transformer_lm"]
    assert defaults.for_model("lstm_lm").batch_sizes == GRID_BATCH_SIZES["lstm_lm"]
    assert defaults.for_model("rnn_lm").batch_sizes == [16]


def test_check_config_checks_the_tune_and_scaling_sections_of_a_file(tmp_path):
    from pipelines.check_config import problems

    good = tmp_path / "good.yaml"
    good.write_text(
        "ops:\n  lr_sweep:\n    config: {lrs: [0.001, 0.002]}\n"
        "  scaling_laws:\n    config: {budgets: [1.0e+12, 2.0e+12, 4.0e+12]}\n"
    )
    assert problems(good) == []
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "ops:\n  lr_sweep:\n    config: {lrs: []}\n"
        "  scaling_laws:\n    config: {budgets: [4.0e+12, 2.0e+12, 8.0e+12]}\n"
        "  no_such_asset:\n    config: {}\n"
    )
    found = "\n".join(problems(bad))
    assert "ops.lr_sweep.config" in found and "lr_sweep.lrs is empty" in found
    assert "ops.scaling_laws.config" in found and "is not increasing" in found
    assert "ops.no_such_asset: no asset of that name" in found


def test_the_tune_jobs_trials_are_scored_on_the_training_splits_tail_not_on_validation():
    """Choices are made on data no claim judges: the last tenth of the training blocks, in stream
    order, held out from the trials' training; too few blocks to hold any out is refused."""
    import inspect

    import numpy as np

    from components.core.data import TokenBlocks, split_tail
    from components.core.errors import PipelineInputError
    from pipelines.defs import tune

    x = np.arange(40 * 8, dtype=np.uint16).reshape(40, 8)
    blocks = TokenBlocks(x, x.astype(np.int32) + 1)
    head, tail = split_tail(blocks, 0.1)
    assert head.n_blocks == 36 and tail.n_blocks == 4 and int(tail.x[0, 0]) == 36 * 8
    assert np.array_equal(np.concatenate([head.x, tail.x]), blocks.x)
    with pytest.raises(PipelineInputError, match="cannot hold out"):
        split_tail(TokenBlocks(x[:1], x[:1].astype(np.int32)), 0.1)
    assert tune.LrSweepConfig().heldout_fraction == 0.1
    source = inspect.getsource(tune.lr_sweep.op.compute_fn.decorated_fn)
    assert "split_tail(train_all" in source and ", val," not in source  # the validation split is not read
