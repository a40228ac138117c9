"""word2vec (skip-gram or CBOW with negative sampling) in PyTorch, fast on CPU.

The settings use gensim's names and meanings. What makes word2vec work is kept: frequent-word
subsampling, a dynamic (shrunk) window, negatives drawn from unigram counts^0.75, plain SGD with a
linearly decaying learning rate, gensim's initialisation. What makes it fast is that nothing runs
per pair (or per token) in Python:

- Each epoch is subsampled and its windows drawn in vectorised numpy, and the kept tokens are cut
  into overlapping fixed-size chunks: a chunk owns the centres in its middle and holds their whole
  windows, so every pair is trained exactly once.
- A worker gathers a chunk's rows once (one `index_select` of [input | output] rows) and trains on
  that copy. A pair at distance o lines up row i+o with row i, so one batched dot product per offset
  scores every pair at that distance, in both directions; 0/1 masks draw the window and sentence
  ends. Offsets run one after the other, updating the copy in place, so a centre's later pairs see
  its earlier updates as in word2vec's sequential SGD. CBOW has one update per centre: its windows
  are two bands, so all the means are one batched product of each centre's 2W+1 weights with a
  strided view of the rows around it, and the context rows' gradient one more. The net change of
  every row goes back with one `index_add_` (sparse SGD: only the chunk's rows are touched).
- Negatives (drawn from unigram counts^0.75 by an alias table, O(1) a sample): each block of 16
  tokens draws K samples that its tokens share, and each token shares them among its pairs (a
  negative's gradient depends on the input word only), weighted so that each pair keeps `negative`
  samples in expectation; scores and gradients are three batched matmuls. A
  skip-gram block is 16 consecutive tokens; a CBOW block is every (C/16)-th token, since neighbouring
  centres share most of their context and would meet the same samples with nearly the same mean.
- `workers` forked processes train on their share of the corpus at once and update one matrix in
  shared memory without locks (Hogwild, like word2vec's and gensim's threads). Processes, because
  threads would take turns on the GIL: an update is dozens of small torch calls.

A chunk is trained from a copy of its rows, so a word that occurs many times in one chunk sums
changes made from one stale value: the first batches are small (`batch_size`: 256 tokens for
skip-gram, 512 for CBOW, which makes one update per centre) and grow as the
learning rate decays (`batch_growth`); `row_update_cap` bounds the sum (a safety net for large batches).

Row 0 is [PAD]. The special tokens never occur in the training ids nor among the negatives; [PAD]
rows only pad the chunks, so their change is exactly zero and [PAD] stays the zero vector.

The chunks and the update are in `word2vec_chunks`; this module holds the settings, the workers
that run them, `train_word2vec` and the files.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np
import torch

from ..artifacts import atomic_dir, set_weights_mode
from ..errors import ConfigError, PipelineInputError
from .vocab import N_SPECIAL, Vocab, build_vocab
from .word2vec_chunks import (
    CbowWorker,
    Corpus,
    SkipGramWorker,
    UnigramSampler,
    Worker,
    epoch_chunks,
    flatten,
    keep_probability,
    negative_cdf,
)
from .word2vec_settings import Word2VecSettings

if TYPE_CHECKING:
    from multiprocessing.queues import Queue as ProcessQueue

LogMetrics = Callable[[dict[str, float], int], None]
FORMAT = "word2vec-safetensors-v1"


@dataclass
class Word2VecResult:
    vectors: np.ndarray  # (V, D) float32 input vectors, the word embeddings; row 0 ([PAD]) is zero
    context: np.ndarray  # (V, D) float32 output ("context") vectors, trainable state only
    vocab: Vocab
    settings: Word2VecSettings
    metrics: dict[str, float]
    history: list[dict[str, float]] = field(default_factory=list)  # one entry per epoch

    @property
    def words(self) -> list[str]:
        return self.vocab.words


# --- training -----------------------------------------------------------------------------------


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("word2vec device='cuda' but no CUDA device is available; set device to 'auto' or 'cpu'")
    return torch.device(device)


def split_shards(corpus: Corpus, n: int) -> list[Corpus]:
    """`n` contiguous runs of whole sentences with about equal token counts, one per worker."""
    if n == 1:
        return [corpus]
    starts = np.flatnonzero(np.r_[True, corpus.sentence[1:] != corpus.sentence[:-1]])  # sentence starts
    at = np.minimum(np.searchsorted(starts, np.arange(1, n) * len(corpus.ids) / n), len(starts) - 1)
    cuts = starts[at]
    bounds = [0, *sorted(set(int(c) for c in cuts) - {0}), len(corpus.ids)]
    return [Corpus(corpus.ids[a:b], corpus.sentence[a:b]) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _train_shard(
    index: int,
    shard: Corpus,
    Wt: torch.Tensor,
    s: Word2VecSettings,
    keep_p: np.ndarray,
    sampler: UnigramSampler,
    report: Callable[[tuple], None],
    report_every: int = 16,
) -> None:
    """One worker: all epochs over its shard, updating the shared `Wt` in place (Hogwild).

    Reports ("progress", epoch, raw words, kept tokens, pairs, loss sum, loss pairs, lr) tuples.
    """
    if Wt.device.type == "cpu":
        torch.set_num_threads(1)  # the workers are the parallelism; one op stream each
    torch.set_flush_denormal(True)  # tiny early updates must not fall into slow denormal arithmetic
    rng = np.random.default_rng([s.seed, index])
    worker_class = SkipGramWorker if s.sg == 1 else CbowWorker
    buffers: dict[int, Worker] = {}  # one set per chunk size
    lr = s.alpha
    for epoch in range(s.epochs):
        acc = [0, 0.0, 0.0, 0.0, 0.0]  # raw words, kept, pairs, loss sum, loss pairs
        reported = 0
        for k, ch in enumerate(epoch_chunks(shard, keep_p, sampler, s, epoch, rng, Wt.device, loss_every=8)):
            C = ch.ids.shape[0]
            if C not in buffers:
                buffers[C] = worker_class(Wt, s, C)
            loss = buffers[C].step(ch)
            acc[0] += ch.raw_words
            acc[1] += ch.kept
            acc[2] += ch.pairs
            if loss is not None:
                acc[3] += loss
                acc[4] += ch.pairs
            lr = ch.lr
            if (k + 1) % report_every == 0:
                report(("progress", epoch, *acc, lr))
                reported += acc[0]
                acc = [0, 0.0, 0.0, 0.0, 0.0]
        acc[0] = len(shard.ids) - reported  # the rest of the epoch (all of it if subsampling left nothing)
        report(("progress", epoch, *acc, lr))


def _run_in_process(index, shard, Wt, s, keep_p, sampler, messages) -> None:
    try:
        _train_shard(index, shard, Wt, s, keep_p, sampler, messages.put)
        messages.put(("done", index))
    except BaseException:  # the parent re-raises it
        import traceback

        messages.put(("error", index, traceback.format_exc()))


def _start_workers(shards, Wt, s, keep_p, sampler) -> tuple[list, queue.Queue | ProcessQueue]:
    """One forked process per shard, all updating the shared-memory `Wt`: no GIL between them
    (threads would serialise on it, since an update is dozens of small torch calls). Falls back to
    threads where fork is unavailable or this process may not have children (a daemon)."""
    import multiprocessing as mp

    if "fork" in mp.get_all_start_methods() and not mp.current_process().daemon:
        ctx = mp.get_context("fork")
        messages = ctx.Queue()
        Wt.share_memory_()
        procs = [
            ctx.Process(target=_run_in_process, args=(i, sh, Wt, s, keep_p, sampler, messages), daemon=True)
            for i, sh in enumerate(shards)
        ]
        for p in procs:
            p.start()
        return procs, messages
    messages = queue.Queue()
    threads = [
        threading.Thread(target=_run_in_process, args=(i, sh, Wt, s, keep_p, sampler, messages), daemon=True)
        for i, sh in enumerate(shards)
    ]
    for t in threads:
        t.start()
    return threads, messages


def _train_shards(shards, Wt, s, keep_p, sampler, on_progress: Callable[[tuple], None]) -> None:
    """Train every shard into `Wt`: in this thread when there is one, else in workers whose
    progress messages go to `on_progress` in this thread (a worker's failure or death is re-raised here).
    Restores the torch thread count and flush-denormal mode it found."""
    threads_before = torch.get_num_threads()
    flush_before = torch.set_flush_denormal(True)
    try:
        if len(shards) == 1:
            _train_shard(0, shards[0], Wt, s, keep_p, sampler, on_progress)
        else:
            workers, messages = _start_workers(shards, Wt, s, keep_p, sampler)
            running = len(workers)
            try:
                while running:
                    try:
                        msg = messages.get(timeout=0.5)
                    except queue.Empty:
                        dead = [w for w in workers if getattr(w, "exitcode", None) not in (None, 0)]
                        if dead:
                            raise RuntimeError(
                                f"a word2vec worker process died (exit code {dead[0].exitcode})"
                            ) from None
                        continue
                    if msg[0] == "progress":
                        on_progress(msg)
                    elif msg[0] == "done":
                        running -= 1
                    else:
                        raise RuntimeError(f"word2vec worker {msg[1]} failed:\n{msg[2]}")
            finally:
                for w in workers:
                    if hasattr(w, "terminate") and w.is_alive():
                        w.terminate()
                    w.join()
    finally:
        torch.set_num_threads(threads_before)
        torch.set_flush_denormal(flush_before)


def _initial_weights(V: int, D: int, seed: int, device: torch.device) -> torch.Tensor:
    """The (V, 2D) matrix training starts from, on `device`."""
    # One (V, 2D) matrix holds [input | output] rows, so a token's two rows are one gather and one
    # index_add_. Inputs start uniform in [-1, 1)/D (gensim 4; word2vec.c uses half that), outputs at 0.
    gen = torch.Generator().manual_seed(seed)
    Wt = torch.zeros(V, 2 * D)
    Wt[N_SPECIAL:, :D] = (torch.rand(V - N_SPECIAL, D, generator=gen) * 2 - 1) / D
    return Wt.to(device)


def _empty_history(epochs: int) -> list[dict]:
    """One entry per epoch: its loss (NaN until its last chunk), kept tokens and pairs, and the running
    sums the progress messages add to (words seen, loss sum and the pairs it was measured on)."""
    return [
        {
            "epoch": e + 1,
            "loss": math.nan,
            "kept_tokens": 0.0,
            "pairs": 0.0,
            "words": 0,
            "loss_sum": 0.0,
            "loss_pairs": 0.0,
        }
        for e in range(epochs)
    ]


def train_word2vec(
    sentences: list[np.ndarray],
    vocab: Vocab,
    settings: Word2VecSettings,
    *,
    log_metrics: Optional[LogMetrics] = None,
) -> Word2VecResult:
    """Train word vectors on `sentences` (arrays of vocabulary ids, from `vocab.encode`).

    `workers` > 1 (CPU) splits the corpus into that many runs of sentences, trained at once by forked
    processes on one shared matrix; `workers=1` trains in this thread and is deterministic.
    `log_metrics(metrics, step)` receives the learning rate, loss and speed every 2% of training,
    with step = raw words processed; it is called from the calling thread only.
    """
    s = settings
    device = resolve_device(s.device)
    corpus = flatten(sentences, vocab, s.window)
    V, D = len(vocab), s.vector_size
    keep_p = keep_probability(vocab.counts, s.sample)
    sampler = UnigramSampler(negative_cdf(vocab.counts))  # the negatives: unigram^0.75, O(1) a draw

    Wt = _initial_weights(V, D, s.seed, device)

    n = len(corpus.ids)
    total_words = n * s.epochs
    shards = split_shards(corpus, s.workers if device.type == "cpu" else 1)
    history = _empty_history(s.epochs)
    log_every = max(total_words // 50, 1)
    words_done, next_log = 0, log_every
    t0 = time.perf_counter()

    def on_progress(msg: tuple) -> None:
        nonlocal words_done, next_log
        _, epoch, raw, kept, pairs, loss_sum, loss_pairs, lr = msg
        h = history[epoch]
        words_done += raw
        h["words"] += raw
        h["kept_tokens"] += kept
        h["pairs"] += pairs
        h["loss_sum"] += loss_sum
        h["loss_pairs"] += loss_pairs
        if not math.isfinite(loss_sum):
            raise FloatingPointError(
                f"word2vec diverged in epoch {epoch + 1} (non-finite loss); lower alpha or batch_size"
            )
        if log_metrics is not None and words_done >= next_log:
            next_log += log_every
            log_metrics(
                {
                    "word2vec/lr": lr,
                    "word2vec/loss": h["loss_sum"] / max(h["loss_pairs"], 1.0),
                    "word2vec/words_per_s": words_done / max(time.perf_counter() - t0, 1e-9),
                    "word2vec/progress": words_done / total_words,
                },
                words_done,
            )
        if h["words"] == n:  # the epoch's last chunk
            h["loss"] = h["loss_sum"] / max(h["loss_pairs"], 1.0)
            h["seconds"] = time.perf_counter() - t0
            if log_metrics is not None:
                log_metrics({"word2vec/epoch_loss": h["loss"], "word2vec/epoch": float(h["epoch"])}, words_done)

    _train_shards(shards, Wt, s, keep_p, sampler, on_progress)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if not torch.isfinite(Wt).all():
        raise FloatingPointError("word2vec diverged (non-finite weights); lower alpha or batch_size")
    return _result(Wt, vocab, s, history, seconds, n)


def _result(
    Wt: torch.Tensor, vocab: Vocab, s: Word2VecSettings, history: list[dict], seconds: float, n: int
) -> Word2VecResult:
    """The trained [input | output] matrix split into the vectors and the context vectors, each epoch's
    history without its running sums, and the run's metrics (`n`: the corpus' tokens in one epoch)."""
    V, D = len(vocab), s.vector_size
    total_words = n * s.epochs
    for h in history:
        del h["loss_sum"], h["loss_pairs"], h["words"]
    kept_total = sum(h["kept_tokens"] for h in history)
    pairs_total = sum(h["pairs"] for h in history)

    W_all = Wt.cpu().numpy()
    vectors = np.ascontiguousarray(W_all[:, :D])
    context = np.ascontiguousarray(W_all[:, D:])
    metrics = {
        "train_seconds": seconds,
        "words_per_s": total_words / seconds,
        "vocab_size": float(V),
        "corpus_tokens": float(n),
        "kept_share": kept_total / total_words,
        "pairs_per_epoch": pairs_total / s.epochs,
        "final_loss": history[-1]["loss"],
        "pad_row_max_abs": float(np.abs(vectors[0]).max()),
    }
    return Word2VecResult(vectors, context, vocab, s, metrics, history)


# --- files --------------------------------------------------------------------------------------


@dataclass
class LoadedEmbeddings:
    vectors: np.ndarray  # (V, D) float32
    vocab: Vocab
    settings: dict
    metadata: dict

    @property
    def words(self) -> list[str]:
        return self.vocab.words


def save_embeddings(result: Word2VecResult, out_dir: str | Path) -> dict[str, Path]:
    """Write `vectors.safetensors` (+ model config in its metadata) and `vocab.tsv` beside it; the
    trainable state (context vectors, schedule) goes apart to `trainable/state.safetensors`.
    The folder is replaced atomically."""
    import json

    from safetensors.numpy import save_file

    out_dir = Path(out_dir)
    V, D = result.vectors.shape
    meta = {
        "format": FORMAT,
        "vocab_size": str(V),
        "vector_size": str(D),
        "pad_id": "0",
        "settings": json.dumps(result.settings.model_dump(), sort_keys=True),
        "metrics": json.dumps(result.metrics, sort_keys=True),
    }
    with atomic_dir(out_dir) as tmp:
        save_file(
            {"vectors": np.ascontiguousarray(result.vectors, dtype=np.float32)},
            str(tmp / "vectors.safetensors"),
            metadata=meta,
        )
        set_weights_mode(tmp / "vectors.safetensors")
        result.vocab.save_tsv(tmp / "vocab.tsv")
        (tmp / "trainable").mkdir()
        # Plain SGD has no optimizer moments: the state is the two matrices and where the schedule stopped.
        state_meta = dict(
            meta, optimizer="sgd", lr_at_end=str(result.settings.min_alpha), epochs_done=str(len(result.history))
        )
        save_file(
            {
                "input": np.ascontiguousarray(result.vectors, dtype=np.float32),
                "output": np.ascontiguousarray(result.context, dtype=np.float32),
            },
            str(tmp / "trainable" / "state.safetensors"),
            metadata=state_meta,
        )
        set_weights_mode(tmp / "trainable" / "state.safetensors")
    return {
        "vectors": out_dir / "vectors.safetensors",
        "vocab": out_dir / "vocab.tsv",
        "trainable": out_dir / "trainable" / "state.safetensors",
    }


def load_embeddings(path: str | Path) -> LoadedEmbeddings:
    """Read what `save_embeddings` wrote: the vectors, the vocabulary and the settings."""
    import json

    from safetensors import SafetensorError, safe_open

    path = Path(path)
    vec_file, vocab_file = path / "vectors.safetensors", path / "vocab.tsv"
    for f in (vec_file, vocab_file):
        if not f.is_file():
            raise PipelineInputError(
                f"{f} not found; materialize `word_embeddings` first (or point at its output folder)"
            )
    try:
        with safe_open(str(vec_file), framework="numpy") as fh:
            meta = fh.metadata() or {}
            vectors = fh.get_tensor("vectors")
    except (SafetensorError, OSError, KeyError) as e:
        raise PipelineInputError(f"{vec_file}: not a readable embedding file ({e})") from e
    if meta.get("format") != FORMAT:
        raise PipelineInputError(f"{vec_file}: unknown format {meta.get('format')!r}, expected {FORMAT!r}")
    vocab = Vocab.load_tsv(vocab_file)
    if len(vocab) != vectors.shape[0]:
        raise PipelineInputError(f"{vocab_file} has {len(vocab)} words but {vec_file} has {vectors.shape[0]} rows")
    return LoadedEmbeddings(vectors, vocab, json.loads(meta.get("settings", "{}")), meta)


def train_from_tokens(
    token_lists: list[list[str]], settings: Word2VecSettings, *, log_metrics: Optional[LogMetrics] = None
) -> Word2VecResult:
    """Convenience: build the vocabulary with `settings.min_count`, encode and train."""
    vocab = build_vocab(token_lists, settings.min_count)
    return train_word2vec(vocab.encode(token_lists), vocab, settings, log_metrics=log_metrics)
