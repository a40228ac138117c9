"""Embedding evaluators: they reproduce gensim's numbers on gensim's vectors, skip [PAD], report
coverage when a test set barely overlaps the vocabulary, and fail clearly on bad files."""

from __future__ import annotations

import io
import math
import zlib

import numpy as np
import pytest
from gensim.models import KeyedVectors, Word2Vec
from gensim.test.utils import datapath
from gensim.utils import simple_preprocess

from components.core.embeddings.evaluate import EmbeddingEvalSettings, evaluate_embeddings, evaluate_with_settings
from components.core.embeddings.vocab import SPECIAL_TOKENS
from components.core.embeddings.word_tasks import WordIndex, evaluate_analogies, evaluate_word_pairs
from components.core.errors import PipelineInputError

ANALOGIES, WORDSIM, SIMLEX = datapath("questions-words.txt"), datapath("wordsim353.tsv"), datapath("simlex999.txt")


def stable_hash(word: str) -> int:
    """gensim seeds each initial vector with hash(word); Python's str hash changes per process."""
    return zlib.crc32(word.encode("utf-8"))


@pytest.fixture(scope="module")
def gensim_kv() -> KeyedVectors:
    """gensim's own word2vec on the Lee corpus of gensim's test data (about 60k words), reproducibly."""
    with open(datapath("lee_background.cor"), encoding="utf-8") as fh:
        sentences = [simple_preprocess(line) for line in fh]
    model = Word2Vec(
        sentences, vector_size=50, window=5, min_count=2, sg=1, epochs=20, workers=1, seed=7, hashfxn=stable_hash
    )
    return model.wv


def test_analogies_reproduce_gensim(gensim_kv):
    score, sections = gensim_kv.evaluate_word_analogies(ANALOGIES, restrict_vocab=30000)
    ours = evaluate_analogies(gensim_kv.index_to_key, gensim_kv.vectors, ANALOGIES, restrict_vocab=30000)
    gensim_sections = {s["section"]: s for s in sections[:-1]}
    assert [s["section"] for s in ours.sections] == list(gensim_sections)
    for s in ours.sections:
        g = gensim_sections[s["section"]]
        assert s["correct"] == len(g["correct"]), s["section"]
        assert s["answered"] == len(g["correct"]) + len(g["incorrect"]), s["section"]
    assert ours.answered > 100 and ours.correct > 0  # enough overlap for the comparison to mean something
    assert ours.accuracy == pytest.approx(score, abs=1e-12)
    assert ours.total == 19544 and ours.coverage == pytest.approx(ours.answered / 19544)


@pytest.mark.parametrize("path", [WORDSIM, SIMLEX])
def test_word_pairs_reproduce_gensim(gensim_kv, path):
    pearson, spearman, oov_pct = gensim_kv.evaluate_word_pairs(path)
    ours = evaluate_word_pairs(gensim_kv.index_to_key, gensim_kv.vectors, path)
    assert ours.spearman == pytest.approx(spearman.statistic, abs=1e-6)
    assert ours.pearson == pytest.approx(pearson.statistic, abs=1e-5)
    assert 100 * ours.oov_ratio == pytest.approx(oov_pct)


def test_most_similar_reproduces_gensim(gensim_kv):
    index = WordIndex(gensim_kv.index_to_key, gensim_kv.vectors)
    for pos, neg in ((["president"], []), (["government", "police"], ["australia"])):
        expected = gensim_kv.most_similar(positive=pos, negative=neg, topn=5)
        got = index.most_similar(pos, neg, topn=5)
        assert [w for w, _ in got] == [w for w, _ in expected]
        np.testing.assert_allclose([s for _, s in got], [s for _, s in expected], atol=1e-5)


def test_case_variants_are_resolved_like_gensim(tmp_path):
    """case_insensitive: the first (most frequent) of 'Paris'/'paris' stands for the word; variants of the
    question words are no answers."""
    rng = np.random.default_rng(0)
    words = [
        "Paris",
        "France",
        "paris",
        "Berlin",
        "Germany",
        "germany",
        "Rome",
        "Italy",
        "Madrid",
        "Spain",
        "spain",
        "tokyo",
    ]
    vectors = rng.normal(size=(len(words), 6)).astype(np.float32)
    kv = KeyedVectors(6)
    kv.add_vectors(words, vectors)
    questions = tmp_path / "q.txt"
    lines = [": capitals"]
    for a, b in [("paris", "france"), ("berlin", "germany"), ("rome", "italy"), ("madrid", "spain")]:
        for c, d in [
            ("paris", "france"),
            ("berlin", "germany"),
            ("rome", "italy"),
            ("madrid", "spain"),
            ("tokyo", "japan"),
        ]:
            if a != c:
                lines.append(f"{a} {b} {c} {d}")
    questions.write_text("\n".join(lines) + "\n")
    _, sections = kv.evaluate_word_analogies(str(questions), restrict_vocab=30000)
    ours = evaluate_analogies(words, vectors, questions)
    assert ours.correct == len(sections[-1]["correct"]) and ours.answered == ours.correct + len(
        sections[-1]["incorrect"]
    )
    assert ours.total == len(lines) - 1 and ours.answered < ours.total  # "japan" is unknown


def with_specials(words: list[str], vectors: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Our layout: [PAD] (zero), [UNK], [BOS], [EOS], then the words."""
    rng = np.random.default_rng(1)
    specials = np.vstack([np.zeros((1, vectors.shape[1])), rng.normal(size=(3, vectors.shape[1]))]).astype(np.float32)
    return list(SPECIAL_TOKENS) + list(words), np.vstack([specials, vectors])


def test_pad_and_specials_are_excluded_from_every_search(gensim_kv):
    words, vectors = with_specials(gensim_kv.index_to_key, gensim_kv.vectors)
    # the specials in front do not change any number: they are not searched and not counted
    a = evaluate_analogies(words, vectors, ANALOGIES, restrict_vocab=30000)
    b = evaluate_analogies(gensim_kv.index_to_key, gensim_kv.vectors, ANALOGIES, restrict_vocab=30000)
    assert (a.correct, a.answered) == (b.correct, b.answered)
    # a restrict_vocab counts words, not specials: 100 words searched either way
    c = evaluate_analogies(words, vectors, ANALOGIES, restrict_vocab=100)
    d = evaluate_analogies(gensim_kv.index_to_key, gensim_kv.vectors, ANALOGIES, restrict_vocab=100)
    assert (c.correct, c.answered) == (d.correct, d.answered)
    index = WordIndex(words, vectors)
    assert not set(SPECIAL_TOKENS) & set(index.words)
    report = evaluate_embeddings(words, vectors, ["government", "police"])
    for neighbours in report.neighbours.values():
        assert not {w for w, _ in neighbours} & set(SPECIAL_TOKENS)
        assert all(math.isfinite(s) for _, s in neighbours)
    assert all(math.isfinite(v) for v in report.metrics().values())


def test_report_metrics_tables_and_figure(gensim_kv):
    words, vectors = with_specials(gensim_kv.index_to_key, gensim_kv.vectors)
    report = evaluate_embeddings(words, vectors, ["government", "police", "australia", "president", "notaword"])
    m = report.metrics()
    for key in (
        "analogy/accuracy",
        "analogy/coverage",
        "wordsim353/spearman",
        "wordsim353/oov",
        "simlex999/spearman",
        "simlex999/oov",
    ):
        assert key in m and math.isfinite(m[key]), key
    V, D = vectors.shape
    assert m["onehot/dense_bytes"] == V * V * 4
    assert m["onehot/sparse_bytes"] == V * 4 + V * 4 + (V + 1) * 4  # CSR: data, column indices, row pointers
    assert m["embedding/dense_bytes"] == V * D * 4
    assert m["onehot/max_offdiag_cosine"] == 0.0
    tables = report.tables()
    assert set(tables) == {"analogy_sections", "neighbours", "king_man_woman", "onehot_vs_learned"}
    assert tables["analogy_sections"].count("\n") == 14 + 2  # header, rule, 14 sections, total
    assert "notaword" not in tables["neighbours"] and "| government |" in tables["neighbours"]
    # one-hot: every scored probe pair has cosine 0, related or not; learned vectors tell them apart
    scored = [t for t in report.onehot["triples"] if "missing" not in t]
    assert scored and all(t["onehot_related"] == 0.0 == t["onehot_unrelated"] for t in scored)
    assert all(t["learned_related"] != t["learned_unrelated"] for t in scored)
    fig = report.figure
    assert len(fig.axes) == 1 and len(fig.axes[0].texts) == 4  # the 4 probe words in the vocabulary
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    assert buf.getvalue()[:4] == b"\x89PNG"


def test_king_man_woman_table():
    rng = np.random.default_rng(0)
    words = ["king", "man", "woman", "queen", "apple", "river"]
    vectors = rng.normal(size=(6, 8)).astype(np.float32)
    vectors[3] = vectors[0] - vectors[1] + vectors[2]  # plant the answer
    kv = KeyedVectors(8)
    kv.add_vectors(words, vectors)
    report = evaluate_embeddings(words, vectors, words, min_analogy_questions=1, min_similarity_pairs=1)
    assert report.king_man_woman[0][0] == "queen"
    expected = kv.most_similar(positive=["king", "woman"], negative=["man"], topn=3)
    np.testing.assert_allclose([s for _, s in report.king_man_woman], [s for _, s in expected], atol=1e-6)
    assert "| 1 | queen |" in report.tables()["king_man_woman"]


def test_few_covered_words_report_coverage_not_accuracy():
    rng = np.random.default_rng(0)
    words = ["king", "queen", "man", "woman", "boy", "girl", "cat", "dog"]
    vectors = rng.normal(size=(len(words), 10)).astype(np.float32)
    report = evaluate_embeddings(words, vectors, words)
    m = report.metrics()
    assert 0 < m["analogy/coverage"] < 0.01  # a handful of family questions are answerable
    assert "analogy/accuracy" not in m and math.isnan(report.analogy.accuracy)
    assert "wordsim353/spearman" not in m and m["wordsim353/oov"] > 0.9
    assert any("coverage" in n for n in report.notes) and any("OOV" in n for n in report.notes)
    assert "n/a" in report.tables()["analogy_sections"]


def test_missing_and_malformed_files_are_clear_errors(tmp_path, gensim_kv):
    words, vectors = gensim_kv.index_to_key, gensim_kv.vectors
    with pytest.raises(PipelineInputError, match="nope.txt"):
        evaluate_analogies(words, vectors, tmp_path / "nope.txt")
    bad = tmp_path / "bad_analogies.txt"
    bad.write_text("athens greece baghdad iraq\n")
    with pytest.raises(PipelineInputError, match="section"):
        evaluate_analogies(words, vectors, bad)
    empty = tmp_path / "empty.txt"
    empty.write_text(": only-a-header\n")
    with pytest.raises(PipelineInputError, match="no analogy questions"):
        evaluate_analogies(words, vectors, empty)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("# comment\nthis line has no tabs\nneither,does,this\n")
    with pytest.raises(PipelineInputError, match="pairs.tsv"):
        evaluate_word_pairs(words, vectors, pairs)
    binary = tmp_path / "binary.tsv"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(PipelineInputError, match="UTF-8"):
        evaluate_word_pairs(words, vectors, binary)
    with pytest.raises(PipelineInputError, match="nope.tsv"):
        evaluate_embeddings(words, vectors, ["government"], wordsim_path=tmp_path / "nope.tsv")


def test_malformed_lines_are_skipped_and_counted_like_gensim(tmp_path, gensim_kv):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(open(WORDSIM, encoding="utf-8").read() + "one\ttwo\nbad\tline\tscore\n")
    ours = evaluate_word_pairs(gensim_kv.index_to_key, gensim_kv.vectors, pairs)
    _, spearman, _ = gensim_kv.evaluate_word_pairs(str(pairs))
    assert ours.invalid_lines == 2 and ours.spearman == pytest.approx(spearman.statistic, abs=1e-6)


def test_eval_settings_validate_and_drive_the_evaluation(gensim_kv):
    with pytest.raises(ValueError, match="topn"):
        EmbeddingEvalSettings(topn=0)
    with pytest.raises(ValueError, match="restrict_vocab"):
        EmbeddingEvalSettings(restrict_vocab=0)
    with pytest.raises(ValueError, match="probe_triples"):
        EmbeddingEvalSettings(probe_triples=["only two"])
    settings = EmbeddingEvalSettings(probe_words=["police", "government"], topn=3, restrict_vocab=5000)
    report = evaluate_with_settings(gensim_kv.index_to_key, gensim_kv.vectors, settings)
    assert set(report.neighbours) == {"police", "government"}
    assert all(len(n) == 3 for n in report.neighbours.values())
