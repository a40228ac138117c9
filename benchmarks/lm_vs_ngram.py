"""What a language model's settings buy against the n-gram baseline, on a labels folder of a run.

Each trial trains one model (its family's default shape, with the settings given) with a full
schedule ending at its step count, and records the validation loss on the whole validation split
at every evaluation, its wall time and tokens/s; the count ladder (modified Kneser–Ney, the order
chosen on held-out training data) is scored on the same targets. Wall times depend on the machine
and its load: the result records both.

    python benchmarks/lm_vs_ngram.py --labels .state/artifacts/labels/<run id> \\
        --trial transformer:steps=1500,lr=4e-3 --trial rnn:steps=1500,lr=5e-3 \\
        --out benchmarks/results/lm_vs_ngram_cpu.json

Instead of --labels, --tokenizer KIND:VOCAB builds the default corpus (gensim's Wikipedia sample),
a tokenizer of that kind and size on its train split and 256-token labels, in --work; every row
then also gives nats per character of the validation text (loss x targets / characters), the
one unit in which models over different tokenizers compare. A trial's `model.<field>=value`
sets a model field (e.g. model.dropout=0.1); other keys are training settings.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.result_file import emit  # noqa: E402

SHAPES = {
    "transformer": (
        "transformer",
        dict(
            n_layer=4,
            n_head=4,
            n_embd=128,
            block_size=128,
            pos_encoding="rope",
            attention="fused",
            param_budget=1_000_000,
        ),
    ),
    "rnn": (
        "recurrent",
        dict(cell="rnn", n_embd=128, hidden_size=256, n_layer=1, param_budget=1_000_000, block_size=128),
    ),
    "lstm": (
        "recurrent",
        dict(cell="lstm", n_embd=128, hidden_size=256, n_layer=1, param_budget=1_000_000, block_size=128),
    ),
}


def parse_trial(text: str) -> tuple[str, dict]:
    name, _, rest = text.partition(":")
    if name not in SHAPES:
        raise SystemExit(f"--trial {text!r}: model must be one of {sorted(SHAPES)}")
    kv = dict(p.split("=", 1) for p in rest.split(",") if p)
    return name, kv


def build(spec: str, work: Path) -> tuple[Path, int]:
    """The labels folder for tokenizer `spec` (KIND:VOCAB) over the default corpus, and the number of
    characters in its validation split; reused from `work` when already built."""
    from components.core.corpus import CorpusSettings, build_corpus, iter_texts, load_corpus
    from components.core.labels import LabelSettings, build_labels
    from components.core.tokenizer import TokenizerSettings, train_tokenizer

    kind, _, vocab = spec.partition(":")
    if not vocab.isdigit():
        raise SystemExit(f"--tokenizer {spec!r}: give KIND:VOCAB, e.g. bpe:2048 or char:512")
    settings = TokenizerSettings(kind=kind, vocab_size=int(vocab))
    if not (work / "corpus").exists():
        build_corpus(CorpusSettings(), work / "corpus")
    dd = load_corpus(work / "corpus")
    out = work / f"{kind}{settings.vocab_size}"
    if not (out / "labels" / "meta.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        train_tokenizer(iter_texts(dd["train"]["text"]), settings).save(str(out / "tokenizer.json"))
        texts = {split: iter_texts(dd[split]["text"]) for split in ("train", "validation")}
        build_labels(texts, out / "tokenizer.json", LabelSettings(block_size=256), out / "labels")
    return out / "labels", sum(len(t) for t in iter_texts(dd["validation"]["text"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--labels", help="a labels folder of a run")
    src.add_argument(
        "--tokenizer", help="KIND:VOCAB (bpe:2048, char:512, ...): build corpus, tokenizer, labels in --work"
    )
    ap.add_argument("--work", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "lm_vs_ngram"))
    ap.add_argument(
        "--trial",
        action="append",
        default=[],
        help="model:steps=N,lr=X[,batch_size=..,warmup_steps=..,eval_interval=..]",
    )
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out")
    args = ap.parse_args()

    from components.core.labels import load_labels
    from components.core.lm import SamplingSettings, train_lm
    from components.core.studies.ngram import NgramSettings, ngram_baseline
    from components.core.train_settings import TrainSettings

    labels, val_chars = (args.labels, None) if args.labels else build(args.tokenizer, Path(args.work))
    tr, va, meta = load_labels(labels)
    V = int(meta["vocab_size"])
    ngram = ngram_baseline(tr, va, V, NgramSettings(block_size=128))
    trials = []
    for spec in args.trial:
        name, kv = parse_trial(spec)
        family, model = SHAPES[name]
        steps, lr = int(kv.pop("steps", 500)), float(kv.pop("lr", 2e-3))
        model = dict(model, **{k[6:]: type(model.get(k[6:], 0.0))(v) for k, v in kv.items() if k.startswith("model.")})
        kv = {k: v for k, v in kv.items() if not k.startswith("model.")}
        train = dict(
            max_steps=steps,
            batch_size=16,
            lr=lr,
            min_lr=lr / 10,
            warmup_steps=30,
            eval_interval=max(steps // 6, 1),
            eval_batches=None,
            threads=args.threads,
        )
        train.update({k: type(train.get(k, 0))(v) if k in train else v for k, v in kv.items()})
        t0 = time.perf_counter()
        res = train_lm(
            family,
            model,
            TrainSettings(**train),
            tr,
            va,
            V,
            Path(os.environ.get("TMPDIR", "/tmp")) / f"lm_vs_ngram_{name}",
            sampling=SamplingSettings(num_samples=0),
            resume=False,
        )
        m = res.metrics
        trials.append(
            {
                "model": name,
                "train": train,
                "model_settings": model,
                "val_loss": m["val/loss"],
                "val_targets": m["val/targets"],
                "margin_over_count_model": ngram.chosen.val_loss - m["val/loss"],
                "params": m["params"],
                "tokens": steps * train["batch_size"] * 128,
                "tokens_per_s": m["train/tokens_per_s_mean"],
                "wall_s": time.perf_counter() - t0,
                "dtype": res.dtype if hasattr(res, "dtype") else m.get("dtype"),
                "val_nats_per_char": m["val/loss"] * m["val/targets"] / val_chars if val_chars else None,
                "curve": [(h["step"], h["val/loss"]) for h in res.history if "val/loss" in h],
            }
        )
        print(trials[-1], file=sys.stderr, flush=True)
    per_char = (lambda loss: loss * meta["validation_targets"] / val_chars) if val_chars else (lambda loss: None)
    emit(
        {
            "benchmark": "lm_vs_ngram",
            "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0],
            "labels": meta,
            "tokenizer": args.tokenizer,
            "validation_chars": val_chars,
            "count_model": ngram.chosen.model,
            "ngram": [dict(vars(r), val_nats_per_char=per_char(r.val_loss)) for r in ngram.rows],
            "trials": trials,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
