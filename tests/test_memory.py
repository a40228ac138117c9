"""Memory tasks: the generators (answers recoverable from the sequence, validation disjoint from
training, bad settings refused by name), and each memory claim's counterexample."""

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from components.core import claims
from components.core import manifests as M
from components.core.data import IGNORE_INDEX
from components.core.studies.memory import delay_study, recall_study
from components.core.studies.memory_tasks import (
    DelaySettings,
    RecallSettings,
    delay_task,
    disjoint_validation,
    recall_task,
)


def test_delay_answer_is_the_symbol_delay_positions_back():
    s = DelaySettings(delays=[3, 7, 20], seq_len=24, n_symbols=5, n_noise=4)
    d = delay_task(s, 200, seed=1)
    sym0, noise0, query = 1, 1 + s.n_symbols, 1 + s.n_symbols + s.n_noise
    assert set(np.unique(d.condition)) == {3, 7, 20}
    for x, y, delay in zip(d.x, d.y, d.condition):
        assert x[-1] == query
        symbols = np.flatnonzero((x >= sym0) & (x < noise0))
        assert symbols.tolist() == [len(x) - 1 - delay]  # exactly one symbol, delay positions before the query
        assert y[-1] == x[len(x) - 1 - delay]
        assert (y[:-1] == IGNORE_INDEX).all()
        assert x.max() < s.vocab_size and x.min() >= 1


def test_recall_answer_is_the_value_after_the_queried_key():
    s = RecallSettings(pairs=[2, 5, 9], seq_len=40, n_keys=12, n_values=6)
    d = recall_task(s, 200, seed=2)
    asked = 0
    for x, y, p, dist in zip(d.x, d.y, d.condition, d.distance):
        q = np.flatnonzero(y != IGNORE_INDEX)
        assert len(q) == p and q[-1] == len(x) - 1  # every key queried once, the queries end the sequence
        for t in q:
            k = np.flatnonzero(x[:t] == x[t])
            assert len(k) == 1  # the key occurs once before its query: keys are distinct
            assert y[t] == x[k[0] + 1] and dist[t] == t - k[0]
            asked += 1
        keys = x[(x >= 1) & (x <= s.n_keys)]
        assert len(keys) == 2 * p
    assert asked == d.condition.sum()
    assert d.distance.max() > 20  # filler between pairs and queries spreads the distances


def test_generators_are_seeded_and_validation_disjoint_from_training():
    s = RecallSettings(pairs=[1, 2], seq_len=6, n_keys=2, n_values=2)  # tiny space: many duplicates
    a, b = recall_task(s, 300, seed=0), recall_task(s, 300, seed=0)
    assert (a.x == b.x).all() and (a.y == b.y).all()
    val = recall_task(s, 300, seed=1)
    clean = disjoint_validation(a, val)
    seen = {r.tobytes() for r in a.x}
    assert len(clean) < len(val)  # the tiny space does repeat sequences ...
    assert not any(r.tobytes() in seen for r in clean.x)  # ... and none of them stays in validation
    ds = DelaySettings(delays=[5, 50], seq_len=64)
    dt, dv = delay_task(ds, 500, 0), delay_task(ds, 500, 1)
    assert len(disjoint_validation(dt, dv)) == 500 and not (dt.x == dv.x).all()


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: DelaySettings(delays=[8, 300], seq_len=258), "delay"),
        (lambda: RecallSettings(pairs=[4, 50], seq_len=128, n_keys=64), "seq_len"),
        (lambda: RecallSettings(pairs=[4, 16], seq_len=128, n_keys=10), "n_keys"),
        (lambda: RecallSettings(window=0), "window"),
        (lambda: RecallSettings(pairs=[0, 4]), "pairs"),
    ],
)
def test_bad_settings_are_refused_by_name(make, field):
    with pytest.raises(ValidationError, match=field):
        make()


# A recall task small enough to train in seconds: two sizes of the key-value set, one distance bucket.
TINY_RECALL = dict(
    pairs=[1, 2],
    seq_len=12,
    n_keys=4,
    n_values=4,
    window=2,
    train_sequences=256,
    val_per_pairs=32,
    distance_buckets=[12],
)


def _fast(settings_cls, **kw):
    base = dict(steps=120, batch_size=16, param_budget=4000)
    return settings_cls(**{**base, **kw})


@pytest.mark.parametrize("training", ["per_delay", "mixed"])
def test_rnn_that_bridges_every_short_delay_fails_the_delay_claims(training):
    """Counterexample: with delays the RNN can bridge there is no delay where it is at chance, and the
    gradient reaches the symbol in the RNN about as well as in the LSTM."""
    s = _fast(
        DelaySettings,
        delays=[1, 2],
        seq_len=10,
        n_symbols=4,
        n_noise=4,
        train_sequences=512,
        val_per_delay=64,
        models=["rnn", "lstm"],
        training=training,
    )
    r = delay_study(s)
    rnn = [x for x in r.rows if x["model"] == "rnn"]
    assert min(x["accuracy"] for x in rnn) > 0.9  # the RNN does solve them
    m = M.MemoryDelay(**r.manifest())
    assert m.training == training
    v = claims.rnn_forgets_where_lstm_remembers(m)
    assert not v.passed and not v.checks["some_delay_rnn_at_chance_lstm_solves"]
    g = claims.lstm_carries_gradient_further(m)
    assert not g.passed and g.checks == {"rnn_and_lstm_measured": True, "lstm_gradient_at_least_10x_rnns": False}


def test_rnn_trained_on_a_long_delay_alone_stays_at_chance_where_the_lstm_solves_it():
    """Each model trained on one delay: the RNN learns delay 2 but not 40, whose gradient vanishes on the
    way back to the symbol; the LSTM (forget bias 3) solves both, and its gradient reaches the symbol."""
    s = DelaySettings(delays=[2, 40], steps=400, train_sequences=2048, val_per_delay=128, models=["rnn", "lstm"])
    r = delay_study(s)
    acc = {(x["model"], x["delay"]): x for x in r.rows}
    assert acc[("rnn", 2)]["low"] > 0.9 and acc[("rnn", 40)]["high"] < 0.25, acc
    assert [m["seq_len"] for m in r.models] == [12, 12, 42, 42]  # each delay in its own short sequences
    m = M.MemoryDelay(**r.manifest())
    v = claims.rnn_forgets_where_lstm_remembers(m)
    assert v.passed and v.figures["delays_where_they_part"] == "40", v
    g = claims.lstm_carries_gradient_further(m)
    assert g.passed and g.figures["lstm_over_rnn_at_longest"] > 100, g


def test_a_model_that_solved_its_task_stops_early():
    """solved_accuracy: the RNN solves delays 1 and 2 well inside 400 steps; it stops once every one of
    `solved_steps` training batches in a row is answered right, and still answers validation; with
    solved_accuracy null it trains every step."""
    kw = dict(
        delays=[1, 2],
        seq_len=10,
        n_symbols=4,
        n_noise=4,
        train_sequences=512,
        val_per_delay=64,
        models=["rnn"],
        steps=400,
        solved_steps=20,
    )
    early = delay_study(_fast(DelaySettings, **kw))
    m = early.models[0]
    assert m["solved_at"] is not None and m["train_steps"] == m["solved_at"] < 400, m
    assert min(x["accuracy"] for x in early.rows if x["model"] == "rnn") > 0.9
    full = delay_study(_fast(DelaySettings, solved_accuracy=None, **kw)).models[0]
    assert full["train_steps"] == 400 and full["solved_at"] is None


def test_untrained_models_fail_the_delay_claims():
    """Counterexample: a model that learned nothing is at chance everywhere: the LSTM solves no delay and
    the Transformer bridges none."""
    s = _fast(
        DelaySettings, steps=1, delays=[2, 6], seq_len=8, n_symbols=4, n_noise=2, train_sequences=64, val_per_delay=64
    )
    m = M.MemoryDelay(**delay_study(s).manifest())
    assert not claims.rnn_forgets_where_lstm_remembers(m).passed
    assert not claims.attention_bridges_every_delay(m).passed


@pytest.fixture(scope="module")
def recall_run():
    s = _fast(
        RecallSettings,
        steps=150,
        pairs=[1, 4],
        train_pairs=[1, 4],
        seq_len=24,
        n_keys=8,
        n_values=4,
        window=2,
        train_sequences=1024,
        val_per_pairs=64,
        distance_buckets=[4, 24],
        models=["transformer", "window"],
        n_layer=2,
        n_head=1,
    )
    return M.MemoryRecall(**recall_study(s).manifest())


def test_window_asked_beyond_its_field_fails(recall_run):
    """Counterexample: a window model judged as if it were full attention: asked about keys beyond its
    receptive field it does not keep its accuracy with distance; and full attention has no field to
    fail beyond, so judged as the window model it fails."""
    assert recall_run.receptive_fields == {"window": 3}  # 2 layers of 2 keys: 2 · (2 − 1) + 1
    far = [r for r in recall_run.rows if r.model == "window" and r.by == "field" and r.at == "beyond"][0]
    assert far.accuracy < 0.5
    assert not claims.attention_recall_ignores_distance(recall_run, model="window").passed
    assert not claims.window_answers_within_field_only(recall_run, model="transformer").passed


def test_window_field_is_where_its_logits_can_change():
    """The receptive field the study uses is the model's: at the last position, a token rf − 1 back moves
    the logits, one further back cannot (so a value at distance d − 1 ≤ rf − 1 is visible: d ≤ rf)."""
    from components.core.studies.memory import build_model, receptive_field

    s = RecallSettings(seq_len=24, n_keys=8, n_values=8, window=3, n_layer=2, n_head=1, param_budget=4000)
    torch.manual_seed(0)
    model = build_model("window", s.vocab_size, s.seq_len, s.train, s.window).eval()
    rf = receptive_field(model)
    assert rf == 5  # 2 · (3 − 1) + 1
    x = torch.randint(1, s.vocab_size, (1, s.seq_len))
    T = s.seq_len

    def moved(back: int) -> bool:
        x2 = x.clone()
        x2[0, T - 1 - back] = 1 + (int(x[0, T - 1 - back]) % (s.vocab_size - 1))
        with torch.no_grad():
            return not torch.allclose(model(x)[0][0, -1], model(x2)[0][0, -1])

    assert moved(rf - 1) and not moved(rf) and not moved(rf + 3)


def _field_manifest(within_ok: int, beyond_ok: int, n: int = 400, chance: float = 1 / 16) -> M.MemoryRecall:
    from components.core.studies.memory import accuracy_row

    rows = [
        {"model": "window", "by": "field", "at": where, **accuracy_row(np.arange(n) < ok)}
        for where, ok in (("within", within_ok), ("beyond", beyond_ok))
    ]
    return M.MemoryRecall(rows=rows, chance=chance, receptive_fields={"window": 15})


def test_window_claim_needs_solving_within_and_chance_beyond():
    """Passes on a window model that solves its in-field queries (lower bound ≥ 0.9, the claim's first
    threshold) and is at chance beyond; counterexamples: answering half of them (above chance, short
    of solving: the threshold is not moved to let it pass), at chance on both sides (it learned
    nothing), and above chance beyond (the mask leaks)."""
    v = claims.window_answers_within_field_only(_field_manifest(390, 25))
    assert v.passed and v.checks["window_solves_within_field"] and v.figures["solved_threshold"] == 0.9
    half = claims.window_answers_within_field_only(_field_manifest(200, 25))
    assert not half.passed and not half.checks["window_solves_within_field"]
    assert half.figures["window_above_chance_within_field"] is True
    nothing = claims.window_answers_within_field_only(_field_manifest(25, 25))
    assert not nothing.passed and nothing.figures["window_above_chance_within_field"] is False
    leak = claims.window_answers_within_field_only(_field_manifest(390, 120))
    assert not leak.passed and not leak.checks["window_at_chance_beyond_field"]


# One pair per sequence, 16 keys and 8 values in 24 tokens; a 2-layer window model of 4 keys per layer
# (receptive field 7): enough distinct validation sequences for about 150 queries within its field.
WINDOW_WORLD = dict(
    batch_size=32,
    param_budget=16000,
    pairs=[1],
    seq_len=24,
    n_keys=16,
    n_values=8,
    window=4,
    train_sequences=2048,
    val_per_pairs=1024,
    distance_buckets=[24],
    models=["window"],
    n_layer=2,
    n_head=1,
    workers=1,
)


def test_window_trained_one_step_fails_within_its_field():
    """Measured counterexample of `window_answers_within_field_only`: a real window model trained one step
    learned nothing, so it does not solve the keys within its receptive field (it is at chance on both
    sides, so the "beyond" check alone would pass it)."""
    m = M.MemoryRecall(**recall_study(RecallSettings(steps=1, **WINDOW_WORLD)).manifest())
    assert m.receptive_fields == {"window": 7}  # 2 · (4 − 1) + 1
    v = claims.window_answers_within_field_only(m)
    assert v.figures["window_within_queries"] >= 100 and v.figures["window_beyond_queries"] >= 100
    assert not v.passed and not v.checks["window_solves_within_field"], v.figures
    assert v.figures["window_above_chance_within_field"] is False


def test_window_whose_mask_leaks_fails_beyond_its_field(monkeypatch):
    """Measured counterexample of `window_answers_within_field_only`: a leaky mask. The window model's
    config still says 4 keys per layer (receptive field 7), but its band mask is replaced by the plain
    causal one, so every key is seen; trained for real, it answers the queries beyond its stated field
    too, and the claim fails on `window_at_chance_beyond_field` (within it, it solves them)."""
    import components.core.models.attention as attention

    band = attention.window_mask

    def leaky(n_query, n_key, window, n_global=0, device=None):
        return band(n_query, n_key, n_key, n_global, device)  # a window as long as the sequence: causal

    monkeypatch.setattr(attention, "window_mask", leaky)
    m = M.MemoryRecall(**recall_study(RecallSettings(steps=300, **WINDOW_WORLD)).manifest())
    assert m.receptive_fields == {"window": 7}  # what the claim is told the field is
    v = claims.window_answers_within_field_only(m)
    assert not v.passed and not v.checks["window_at_chance_beyond_field"], v.figures
    assert v.figures["window_beyond_low"] > m.chance + 0.5  # far above chance where it should see nothing
    assert v.checks["window_solves_within_field"], v.figures


def test_attention_as_the_recurrent_model_does_not_run_out():
    """Counterexample: full attention that learned the task (one pair: copying answers it), judged as if
    it were the fixed state, is not below itself."""
    s = RecallSettings(
        steps=300,
        batch_size=32,
        pairs=[1, 2],
        train_pairs=[1, 2],
        seq_len=12,
        n_keys=4,
        n_values=4,
        train_sequences=1024,
        val_per_pairs=128,
        distance_buckets=[12],
        models=["transformer"],
    )
    m = M.MemoryRecall(**recall_study(s).manifest())
    v = claims.recurrent_state_runs_out(m, models=("transformer",), reference="transformer")
    assert v.figures["transformer_learned_the_task"], v.figures
    assert not v.passed and not v.checks["transformer_below_transformer_at_most_pairs"]


def test_one_layer_model_has_no_induction_head():
    """Counterexample: one layer cannot hold a previous-token head and an induction head after it."""
    from components.core.studies.induction import InductionSettings, induction_study

    m = M.MemoryInduction(
        **induction_study(
            InductionSettings(
                n_layer=1,
                span=6,
                n_tokens=8,
                steps=60,
                batch_size=16,
                param_budget=4000,
                train_sequences=512,
                val_sequences=64,
            )
        ).manifest()
    )
    v = claims.induction_head_copies(m)
    assert not v.passed and not v.checks["induction_head_in_a_later_layer"]
    assert m.found is not None and m.found.induction_head is None


@pytest.mark.slow
def test_positional_copy_head_is_not_an_induction_head():
    """Counterexample: trained on the fixed-offset task (every span the same length), the model
    copies the repeat by attending a fixed distance back: exact where the offset is the trained one,
    failing where it varies, so the claim, judged on offsets that vary, does not pass."""
    from components.core.studies.induction import (
        InductionSettings,
        induction_eval,
        induction_study,
        induction_task,
        repeat_targets_only,
    )

    s = InductionSettings(min_span=16, steps=300)
    r = induction_study(s)
    m = M.MemoryInduction(**r.manifest())
    assert m.base is not None and m.base.repeat_accuracy < 0.5, m.base
    v = claims.induction_head_copies(m)
    assert not v.passed and not v.checks["copies_the_repeat"]
    # the same training, evaluated where the offset is the one it was trained on, copies
    from components.core.studies.memory import build_model, train_model

    torch.manual_seed(s.seed)
    model = build_model("transformer", s.vocab_size, 2 * s.span, s.train)
    train = repeat_targets_only(induction_task(s, s.train_sequences, s.seed))
    train_model(model, train, s.train, s.lrs["transformer"])
    fixed = induction_eval(model, induction_task(s, 256, s.seed + 1, min_span=16), s)
    assert fixed["repeat_accuracy"] > 0.9 and fixed["first_accuracy"] < 0.15, fixed


@pytest.mark.slow
def test_induction_on_varying_offsets_is_content_based():
    """The default task (offsets vary per sequence) trains a real induction circuit: the repeat is
    copied where no fixed-distance head could, the first part stays at chance, a previous-token head
    in layer 0 and a prefix-matching head in layer 1 are found by their scores."""
    from components.core.studies.induction import InductionSettings, induction_study

    m = M.MemoryInduction(**induction_study(InductionSettings()).manifest())
    v = claims.induction_head_copies(m)
    assert v.checks["copies_the_repeat"] and v.checks["first_part_at_chance"], v.figures
    assert v.checks["induction_head_in_a_later_layer"] and v.checks["induction_head_prefix_matching"], v.figures
    assert m.found is not None and m.found.induction_head is not None
    assert m.found.previous_token_head[0] == 0 and m.found.induction_head[0] == 1


def test_a_recurrent_model_that_learned_nothing_is_not_judged():
    """Counterexample: one step of training leaves the RNN at chance at every number of pairs; that is
    not a state running out, so the claim is not judged (never passed) and names the model."""
    s = _fast(
        RecallSettings,
        steps=1,
        pairs=[1, 4],
        seq_len=16,
        n_keys=8,
        n_values=4,
        train_sequences=256,
        val_per_pairs=128,
        distance_buckets=[16],
        models=["rnn", "transformer"],
    )
    m = M.MemoryRecall(**recall_study(s).manifest())
    v = claims.recurrent_state_runs_out(m, models=("rnn",))
    assert not v.passed and not v.judged and v.figures["rnn_learned_the_task"] is False
    assert "rnn" in v.note


def test_models_trained_side_by_side_equal_those_trained_one_after_another():
    """Two worker processes give the very weights one process gives: every accuracy and loss is equal."""
    kw = dict(steps=30, models=["lstm", "transformer", "window"], **TINY_RECALL)
    one, two = (recall_study(_fast(RecallSettings, workers=w, **kw)) for w in (1, 2))
    assert one.rows == two.rows
    assert [m["final_loss"] for m in one.models] == [m["final_loss"] for m in two.models]


@pytest.mark.parametrize("training", ["per_delay", "mixed"])
def test_a_model_without_a_learning_rate_is_refused_by_name(training):
    from components.core.errors import ConfigError

    s = DelaySettings(delays=[2], seq_len=4, lrs={"rnn": 3e-3}, models=["rnn", "lstm"], training=training)
    with pytest.raises(ConfigError, match="lrs has no learning rate for model 'lstm'"):
        delay_study(s)


def test_tasks_trained_in_one_pool_equal_each_task_alone():
    """The memory tasks' trainings in one pool, reordered costliest first across tasks, give every task
    the very result it gets alone (each outcome returned to its own task and model)."""
    from components.core.studies.induction import InductionSettings, induction_study, plan_induction
    from components.core.studies.memory import plan_delay, plan_recall
    from components.core.studies.memory_pool import run_studies

    delay = _fast(DelaySettings, steps=40, delays=[2, 8], seq_len=10, train_sequences=256, val_per_delay=32)
    recall = _fast(RecallSettings, steps=40, **TINY_RECALL)
    induction = _fast(InductionSettings, steps=40, span=6, n_tokens=8, train_sequences=256, val_sequences=32)
    together = run_studies(
        {"delay": plan_delay(delay), "recall": plan_recall(recall), "induction": plan_induction(induction)}
    )
    alone = {"delay": delay_study(delay), "recall": recall_study(recall), "induction": induction_study(induction)}
    for name, r in alone.items():
        assert together[name].rows == r.rows, name
        assert [m["final_loss"] for m in together[name].models] == [m["final_loss"] for m in r.models], name
    assert together["induction"].extra["heads"] == alone["induction"].extra["heads"]
    assert together["delay"].extra["gradients"] == alone["delay"].extra["gradients"]
    # and the tasks differ from one another: a result handed to the wrong task would show
    assert together["delay"].rows != together["recall"].rows


def test_pool_runs_the_costliest_training_first_and_returns_each_outcome_to_its_job():
    from components.core.studies.memory_pool import StudyPlan, run_studies

    started = []

    def job(tag):
        started.append(tag)
        return tag.upper()

    def finish(tag):
        return lambda outcomes: (tag, outcomes)

    plans = {
        "a": StudyPlan([(job, ("a0",)), (job, ("a1",))], [1.0, 5.0], finish("a"), 1, 1),
        "b": StudyPlan([(job, ("b0",))], [3.0], finish("b"), 1, 1),
    }
    out = run_studies(plans)  # one worker: in this process, in the pool's order
    assert started == ["a1", "b0", "a0"]
    assert out == {"a": ("a", ["A0", "A1"]), "b": ("b", ["B0"])}
