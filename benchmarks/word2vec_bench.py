"""Speed and quality of our PyTorch word2vec against gensim's `Word2Vec`, same corpus, same settings.

    .venv/bin/python benchmarks/word2vec_bench.py [--text corpus.txt] [--repeats 3] [--out results.json]

Both get the exact same token lists (our `word_tokenize`, one sentence per line/paragraph) and the
same settings (100 dims, window 5, 5 negatives, min_count 5, 5 epochs, sample 1e-3, 2 threads).
Each repeat trains both with the same seed, in alternating order, and times `train` only
(vocabulary building excluded for both). words/s = in-vocabulary tokens x epochs / wall seconds.
Quality is measured with our evaluators, which reproduce gensim's own numbers. Prints one JSON
object; `--profile` adds the top torch ops of one single-worker epoch of ours to stderr.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from result_file import emit  # noqa: E402

from components.core.embeddings import (  # noqa: E402
    Word2VecSettings,
    build_vocab,
    evaluate_analogies,
    evaluate_word_pairs,
    gensim_test_file,
    train_word2vec,
    word_tokenize,
)
from components.core.embeddings.reference import gensim_word2vec  # noqa: E402

SETTINGS = dict(vector_size=100, window=5, min_count=5, negative=5, epochs=5, sample=1e-3, workers=2)


def load_sentences(text_path: str | None) -> tuple[list[list[str]], dict]:
    """Token lists, one per line (a sentence or a paragraph), from the wiki sample or a text file."""
    if text_path:
        lines = Path(text_path).read_text(encoding="utf-8").splitlines()
        source = {"corpus": str(Path(text_path).resolve()), "documents": None}
    else:
        from components.core.corpus import default_wiki_dump, iter_wiki_articles

        articles = list(iter_wiki_articles(default_wiki_dump()))
        lines = [line for a in articles for line in a["text"].splitlines()]
        source = {"corpus": str(default_wiki_dump()), "documents": len(articles)}
    sentences = [t for t in (word_tokenize(line) for line in lines) if t]
    source.update(sentences=len(sentences), tokens=sum(map(len, sentences)))
    return sentences, source


def quality(words: list[str], vectors: np.ndarray) -> dict[str, float]:
    a = evaluate_analogies(words, vectors, gensim_test_file("questions-words.txt"), restrict_vocab=30000)
    ws = evaluate_word_pairs(words, vectors, gensim_test_file("wordsim353.tsv"))
    sl = evaluate_word_pairs(words, vectors, gensim_test_file("simlex999.txt"))
    return {
        "analogy": a.correct / a.answered if a.answered else float("nan"),
        "analogy_answered": a.answered,
        "wordsim353": ws.spearman_raw,
        "simlex999": sl.spearman_raw,
    }


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (our workers are forked processes)."""
    import resource

    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + c.ru_utime + c.ru_stime


def run_ours(encoded, vocab, settings: Word2VecSettings) -> dict:
    cpu0 = cpu_seconds()
    result = train_word2vec(encoded, vocab, settings)
    cpu = cpu_seconds() - cpu0
    assert np.all(result.vectors[0] == 0)
    return {
        "seconds": result.metrics["train_seconds"],
        "cpu_seconds": cpu,
        **quality(vocab.words, result.vectors),
    }


def run_gensim(sentences, settings: Word2VecSettings) -> dict:
    model = gensim_word2vec(settings)  # the same construction the pipeline's reference uses
    model.build_vocab(sentences)
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    model.train(sentences, total_examples=model.corpus_count, epochs=model.epochs)
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    return {"seconds": seconds, "cpu_seconds": cpu, **quality(model.wv.index_to_key, model.wv.vectors)}, model


def profile_ours(encoded, vocab, settings: Word2VecSettings) -> None:
    """Top torch ops of one epoch with one worker (trained in this thread, so the profiler sees it)."""
    from torch.profiler import ProfilerActivity, profile

    s = settings.model_copy(update={"epochs": 1, "workers": 1})
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = train_word2vec(encoded, vocab, s)
    print(f"one epoch, one worker, under the profiler: {result.metrics['words_per_s']:,.0f} words/s", file=sys.stderr)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15), file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--text", help="a local plain-text file (one sentence or paragraph per line); default: gensim's wiki sample"
    )
    ap.add_argument("--repeats", type=int, default=3, help="seeds 1..N, each trains ours and gensim once")
    ap.add_argument("--sg", type=int, default=1, choices=(0, 1), help="1: skip-gram (default), 0: CBOW")
    ap.add_argument("--batch-size", type=int, default=None, help="our batch_size (default: Word2VecSettings')")
    ap.add_argument("--negative-draws", type=int, default=None, help="our negative_draws (default: Word2VecSettings')")
    ap.add_argument("--profile", action="store_true", help="print a torch.profiler table of ours to stderr")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()

    sentences, source = load_sentences(args.text)
    vocab = build_vocab(sentences, SETTINGS["min_count"])
    encoded = vocab.encode(sentences)
    in_vocab = int(sum(len(e) for e in encoded))
    extra = {"batch_size": args.batch_size} if args.batch_size else {}
    if args.negative_draws:
        extra["negative_draws"] = args.negative_draws
    base = Word2VecSettings(**SETTINGS, sg=args.sg, device="cpu", **extra)
    words = in_vocab * base.epochs

    ours_runs, gensim_runs = [], []
    load_before = os.getloadavg()[0]
    for r in range(args.repeats):
        settings = base.model_copy(update={"seed": r + 1})
        order = ("ours", "gensim") if r % 2 == 0 else ("gensim", "ours")
        for who in order:
            if who == "ours":
                ours_runs.append(run_ours(encoded, vocab, settings))
            else:
                res, model = run_gensim(sentences, settings)
                if r == 0:  # the same vocabulary, in the same order
                    assert model.wv.index_to_key == vocab.words[4:], "gensim built a different vocabulary"
                gensim_runs.append(res)
        print(
            f"repeat {r + 1}: ours {words / ours_runs[-1]['seconds']:,.0f} words/s, gensim "
            f"{words / gensim_runs[-1]['seconds']:,.0f} words/s",
            file=sys.stderr,
        )
    load_after = os.getloadavg()[0]
    for run in ours_runs + gensim_runs:
        run["words_per_s"] = words / run["seconds"]
        run["words_per_cpu_s"] = words / run["cpu_seconds"]

    def med(runs, key):
        return statistics.median(r[key] for r in runs)

    def mean(runs, key):
        return statistics.fmean(r[key] for r in runs)

    ratios = [o["words_per_s"] / g["words_per_s"] for o, g in zip(ours_runs, gensim_runs)]
    out = {
        "ours_words_per_s": med(ours_runs, "words_per_s"),
        "gensim_words_per_s": med(gensim_runs, "words_per_s"),
        "speed_ratio": statistics.median(ratios),
        "ours_analogy": mean(ours_runs, "analogy"),
        "gensim_analogy": mean(gensim_runs, "analogy"),
        "ours_wordsim353": mean(ours_runs, "wordsim353"),
        "gensim_wordsim353": mean(gensim_runs, "wordsim353"),
        "ours_simlex999": mean(ours_runs, "simlex999"),
        "gensim_simlex999": mean(gensim_runs, "simlex999"),
        "analogy_questions_answered": ours_runs[0]["analogy_answered"],
        "speed_ratios_per_repeat": ratios,
        "cpu_speed_ratio": med(ours_runs, "words_per_cpu_s") / med(gensim_runs, "words_per_cpu_s"),
        # batch_size / negative_draws 0 mean the model's default: `batch` and `draws` are what ran
        "settings": {
            **base.model_dump(),
            "batch": base.batch,
            "draws": base.draws,
            "seeds": list(range(1, args.repeats + 1)),
        },
        "corpus": {**source, "in_vocab_tokens": in_vocab, "vocab_size": len(vocab) - 4},
        "runs": {"ours": ours_runs, "gensim": gensim_runs},
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "gensim": __import__("gensim").__version__,
            "load_average_before": load_before,
            "load_average_after": load_after,
        },
        "notes": "words_per_s and quality: median speed / mean quality over the seeds; each seed trains both; "
        "train() timed, vocabulary building excluded; analogy = 3CosAdd over the 30k most frequent words.",
    }
    if args.profile:
        profile_ours(encoded, vocab, base)
    emit(out, args.out)  # adds the CPU model, kind and ISA flags under "machine"; writes atomically


if __name__ == "__main__":
    main()
