"""The fact study (studies/facts.py): facts mined from the corpus, and the claim on models that know
facts, that know none (untrained) and that learned other facts (capitals swapped in the text)."""

from __future__ import annotations

import numpy as np
import pytest

from components.core import claims as C
from components.core import manifests as M
from components.core.device import seed_everything
from components.core.errors import ConfigError
from components.core.labels import pack_blocks, token_stream
from components.core.models.transformer import Transformer, TransformerSettings
from components.core.studies.facts import (
    Fact,
    FactSettings,
    analogy_pairs,
    corpus_facts,
    made_up_entities,
    probe_facts,
    prompts_in_text,
    summarize,
)
from components.core.tokenizer import TokenizerSettings, train_tokenizer
from components.core.train_settings import TrainSettings
from components.core.training import train

PAIRS = [
    ("Norway", "Oslo"),
    ("Peru", "Lima"),
    ("Kenya", "Nairobi"),
    ("Chile", "Santiago"),
    ("Egypt", "Cairo"),
    ("Japan", "Tokyo"),
    ("Italy", "Rome"),
    ("Cuba", "Havana"),
]
FORMS = [
    "{a} is the capital of {c}.",
    "In {c}, the largest city is {a}.",
    "{c} is governed from {a}.",
    "The government of {c} sits in {a}.",
    "{c} and its capital {a} lie far apart from here.",
]
FILL = [
    "The river runs to the sea.",
    "Many people live in the towns.",
    "The weather was cold that year.",
    "Trade grew in the next century.",
]


def test_facts_are_the_pairs_the_corpus_names_in_one_sentence(tmp_path):
    q = tmp_path / "questions-words.txt"
    q.write_text(
        ": capital-world\nOslo Norway Lima Peru\nCairo Egypt Rome Italy\n"
        ": city-in-state\nAustin Texas Boston Massachusetts\n: family\nboy girl man woman\n"
    )
    pairs = analogy_pairs(q)
    assert pairs == {
        "capital": {("Norway", "Oslo"), ("Peru", "Lima"), ("Egypt", "Cairo"), ("Italy", "Rome")},
        "state_of_city": {("Austin", "Texas"), ("Boston", "Massachusetts")},
    }
    text = [
        "Oslo is in Norway. Oslo, Norway again. Lima, the capital of Peru. Peru and Lima.",
        "Cairo lies in Egypt. Egypt's Cairo. Rome. Italy. Austin, Texas. Texas has Austin. Boston, Massachusetts. "
        "Massachusetts holds Boston.",
    ]
    facts = corpus_facts(text, pairs, FactSettings(min_per_relation=3))
    # Rome and Italy never share a sentence; the cities' relation has two facts only, too few to compare.
    assert {(f.subject, f.answer, f.cooccurrences) for f in facts} == {
        ("Norway", "Oslo", 2),
        ("Peru", "Lima", 2),
        ("Egypt", "Cairo", 2),
    }
    assert prompts_in_text(text, facts) == []
    q.write_text(": capital-world\nOslo Norway Lima\n")
    with pytest.raises(ConfigError, match=r"questions-words.txt, line 2: .* 4 words"):
        analogy_pairs(q)


def _world(swapped: bool) -> tuple[list[str], list[Fact]]:
    """Documents that state the capitals (or each country with the next country's capital) in varied
    words, among filler; the facts probed are the true ones."""
    rng = np.random.default_rng(0)
    capitals = [a for _, a in PAIRS]
    stated = [(c, capitals[(i + 1) % len(PAIRS)] if swapped else a) for i, (c, a) in enumerate(PAIRS)]
    docs = []
    for _ in range(300):
        sents = []
        for _ in range(6):
            if rng.random() < 0.5:
                c, a = stated[rng.integers(len(stated))]
                sents.append(FORMS[rng.integers(len(FORMS))].format(c=c, a=a))
            else:
                sents.append(FILL[rng.integers(len(FILL))])
        docs.append(" ".join(sents))
    return docs, [Fact("capital", c, a, 1) for c, a in PAIRS]


def _judge(docs: list[str], facts: list[Fact], tmp_path, steps: int) -> tuple[M.FfnMemories, list[dict]]:
    tok = train_tokenizer(docs, TokenizerSettings(kind="bpe", vocab_size=400))
    V = tok.get_vocab_size()
    enc = lambda t: tok.encode(t).ids  # noqa: E731
    tr, va = (pack_blocks(token_stream(tok, d), 32, V) for d in (docs[:270], docs[270:]))
    ms = TransformerSettings(n_layer=2, n_head=2, n_embd=64, block_size=32)
    seed_everything(0)
    control = Transformer(ms, V)
    seed_everything(0)
    model = Transformer(ms, V)
    if steps:
        train(
            model,
            tr,
            va,
            TrainSettings(
                max_steps=steps,
                batch_size=16,
                lr=3e-3,
                min_lr=3e-4,
                warmup_steps=10,
                eval_interval=0,
                dtype="float32",
                device="cpu",
            ),
            tmp_path,
            resume=False,
        )
    s = FactSettings(random_draws=3, bootstrap=500)
    rows, control_rows = probe_facts(model, facts, enc, s), probe_facts(control, facts, enc, s)
    seed = M.FactSeed(seed=0, val_loss=0.0, steps=steps, **summarize(rows, control_rows, s))
    made_up = made_up_entities(model, facts, enc, {w.lower() for d in docs for w in d.split()}, s)
    assert len(made_up) == len(facts) and all(r["made_up"] not in " ".join(docs) for r in made_up)
    return M.FfnMemories(facts_found=len(facts), seeds=[seed, seed]), rows


def test_a_model_that_learned_the_facts_passes_and_its_untrained_twin_does_not(tmp_path):
    docs, facts = _world(swapped=False)
    mem, rows = _judge(docs, facts, tmp_path, steps=150)
    v = C.fact_neurons_matter(mem)
    assert v.passed, v.figures
    assert mem.seeds[0].known_share >= 0.75 and mem.seeds[0].control_extra_drop_mean < 0.1
    untrained, _ = _judge(docs, facts, tmp_path, steps=0)
    v = C.fact_neurons_matter(untrained)
    assert v.judged and not v.passed and not v.checks["seed0_knows_the_facts"]


def test_a_model_trained_where_the_capitals_are_swapped_fails(tmp_path):
    docs, facts = _world(swapped=True)
    mem, rows = _judge(docs, facts, tmp_path, steps=150)
    v = C.fact_neurons_matter(mem)
    assert not v.passed and not v.checks["seed0_knows_the_facts"]
    assert mem.seeds[0].knowledge_mean < 0  # the true capital is less likely after its country


def test_no_facts_is_not_judged():
    v = C.fact_neurons_matter(M.FfnMemories(facts_found=1))
    assert not v.judged and "1 facts" in v.note
