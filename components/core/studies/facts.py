"""Facts in FFN neurons, on word-sized units: a fact is a multi-token answer (a capital given its
country, the state of a city, a country's adjective), its subject named in the prompt.

The facts (`corpus_facts`). Candidate pairs are the relations of the standard analogy set that name
facts (gensim's questions-words.txt: capital-common-countries and capital-world, city-in-state,
gram6-nationality-adjective). A pair is a fact of this corpus when the training text names subject
and answer in one sentence at least `min_cooccurrences` times; the count is reported per fact.

The prompts (`TEMPLATES`). Each relation has prompts that select neurons and other prompts, of other
wording, that test them (held out: the selection never saw them); the prompts the training text holds
word for word are reported (`prompts_in_text`; none for the default corpus).

Knowing a fact (`knowledge`): the answer's log-probability (summed over its tokens, teacher-forced)
after the prompt about its own subject, minus its mean log-probability after the same prompt about
the relation's other subjects, so that the answer's own prior cancels. A model that learned nothing
of the corpus, or one trained where the facts do not hold, scores about 0 or below.

Neurons (`attribute`, `matched_draw`). A neuron (layer l, index i) is a GELU output of layer l's FFN.
Its attribution to a fact is activation × gradient of the knowledge (the first-order estimate of what
zeroing it at every position takes), summed over positions and selection prompts; the top `ablate_k`
are zeroed on the held-out prompts (about every subject), against as many neurons of the same layers
matched in activation on the prompt (each drawn among the 10 nearest in |activation| rank). The extra
drop is what the chosen neurons take from the knowledge beyond what the matched ones take.

The direct path from a neuron to an answer is a property of its weights (W_U · γ ⊙ w_out), and an
untrained model's neurons respond to its subject's tokens too, so the same selection finds an extra
drop in a model that knows nothing. Each seed's model is therefore probed beside its untrained twin
(same shape, same initial weights; `summarize`): the verdict needs the model to know the facts
(knowledge above 0) and its chosen neurons to take more than the twin's do (paired over facts).
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field

from ..checkpoint import WEIGHTS_FILE
from ..device import seed_everything
from ..embeddings import gensim_test_file
from ..errors import ConfigError
from ..labels import pack_blocks, token_stream
from ..models.transformer import Transformer
from ..tokenizer import TokenizerSettings, train_tokenizer
from ..training import train
from ..workers import cpu_workers, one_thread_each, run_jobs, weights_in, weights_out

Encode = Callable[[str], list[int]]

# questions-words.txt section → (relation, which side is the subject): capital pairs are (capital, country).
RELATIONS: dict[str, tuple[str, int]] = {
    "capital-common-countries": ("capital", 1),
    "capital-world": ("capital", 1),
    "city-in-state": ("state_of_city", 0),
    "gram6-nationality-adjective": ("adjective_of_country", 0),
}

# relation → (selection prompts, held-out test prompts); {s} is the subject, the answer follows the prompt.
TEMPLATES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "capital": (
        ("The capital of {s} is", "{s} has its capital at"),
        ("The capital city of {s} is", "The seat of government of {s} is in"),
    ),
    "state_of_city": (
        ("{s} is a city in the state of", "The city of {s} lies in"),
        ("{s} is located in the U.S. state of", "The people of {s} live in the state of"),
    ),
    "adjective_of_country": (
        ("A person from {s} is", "The people of {s} are called the"),
        ("Someone born in {s} is", "The culture of {s} is"),
    ),
}


class FactSettings(BaseModel):
    """The facts, the fact model's units and seeds, and the probe."""

    model_config = ConfigDict(extra="forbid")

    vocab_size: int = Field(
        default=2048,
        ge=260,
        description="The fact model's byte-level BPE vocabulary, trained on the training split (a "
        "country or a capital is one to four tokens).",
    )
    seeds: list[int] = Field(
        default=[0, 1], min_length=1, description="Training seeds of the fact model, each judged apart."
    )
    workers: int = Field(
        default=2,
        ge=1,
        description="Processes the seeds train in side by side on a CPU, one torch thread each (workers.py).",
    )
    min_cooccurrences: int = Field(
        default=2,
        ge=1,
        description="A pair is a fact of the corpus when its two words share a training sentence this often.",
    )
    sentence_chars: int = Field(
        default=200,
        ge=10,
        description="Longest stretch between subject and answer in one sentence (no period or newline).",
    )
    min_per_relation: int = Field(
        default=3,
        ge=2,
        description="A relation enters with at least this many facts (each compared with the other subjects).",
    )
    ablate_k: int = Field(
        default=8, ge=1, description="Neurons zeroed per fact (top by attribution; as many matched ones)."
    )
    random_draws: int = Field(default=5, ge=1, description="Draws of activation-matched neurons per held-out prompt.")
    bootstrap: int = Field(default=2000, ge=100, description="Bootstrap resamples over facts for the 95 % intervals.")
    seed: int = Field(default=0, description="Seed of the matched draws, the made-up names and the bootstrap.")


@dataclass(frozen=True)
class Fact:
    relation: str
    subject: str
    answer: str
    cooccurrences: int  # training sentences naming both


def analogy_pairs(path: str | Path) -> dict[str, set[tuple[str, str]]]:
    """relation → {(subject, answer)} from the fact sections of a questions-words file."""
    out: dict[str, set[tuple[str, str]]] = {}
    section = None
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith(":"):
            section = line[1:].strip()
            continue
        if section not in RELATIONS or not line.strip():
            continue
        words = line.split()
        if len(words) != 4:
            raise ConfigError(f"{path}, line {n}: an analogy line holds 4 words, this one {len(words)}: {line!r}")
        relation, subj = RELATIONS[section]
        for a, b in ((words[0], words[1]), (words[2], words[3])):
            pair = (a, b) if subj == 0 else (b, a)
            out.setdefault(relation, set()).add(pair)
    return out


def corpus_facts(texts: Iterable[str], pairs: dict[str, set[tuple[str, str]]], s: FactSettings) -> list[Fact]:
    """The pairs the training text names together in one sentence at least `min_cooccurrences` times;
    relations with fewer than `min_per_relation` such facts are left out (too few other subjects to compare with)."""
    gap = rf"[^.\n]{{0,{s.sentence_chars}}}"
    # A match never crosses a '.' or a line end, so it lies in one sentence: each pair is searched in the
    # sentences that hold both its words (an index of words to sentences), not in the whole text.
    sentences = re.split(r"[.\n]", "\n".join(texts))
    where: dict[str, set[int]] = {}
    for i, sentence in enumerate(sentences):
        for w in set(re.findall(r"\w+", sentence)):
            where.setdefault(w, set()).add(i)

    def holding(word: str) -> set[int] | None:  # None: a word the index does not hold whole (not all \w)
        return where.get(word, set()) if re.fullmatch(r"\w+", word) else None

    facts = []
    for relation in sorted(pairs):
        found = []
        for subject, answer in sorted(pairs[relation]):
            a, b = re.escape(subject), re.escape(answer)
            hs, ha = holding(subject), holding(answer)
            ids = range(len(sentences)) if hs is None or ha is None else sorted(hs & ha)
            pattern = re.compile(rf"\b{a}\b{gap}\b{b}\b|\b{b}\b{gap}\b{a}\b")
            n = sum(len(pattern.findall(sentences[i])) for i in ids)
            if n >= s.min_cooccurrences:
                found.append(Fact(relation, subject, answer, n))
        answers = {f.answer for f in found}
        if len(answers) >= s.min_per_relation:
            facts += found
    return facts


def prompts_in_text(texts: Iterable[str], facts: list[Fact]) -> list[str]:
    """Prompts of these facts that occur in `texts` (a held-out prompt must not)."""
    text = "\n".join(texts)
    return [p for f in facts for group in TEMPLATES[f.relation] for t in group if (p := t.format(s=f.subject)) in text]


# ----------------------------------------------------------------------------------------------
# Measuring


@contextmanager
def ffn_activations(
    model: Transformer, zero: dict[int, list[int]] | None = None, keep: list[torch.Tensor] | None = None
) -> Iterator[list[torch.Tensor]]:
    """Each layer's GELU output (B, T, 4C), kept in the graph (for gradients); `zero` {layer: [i, ...]}
    zeroes those neurons at every position; `keep` (a (B, 1, 4C) 0/1 mask per layer) zeroes neurons
    row by row, so that several zeroings run as one batch."""
    acts: list[torch.Tensor] = []
    handles = []
    for layer, block in enumerate(model.blocks):

        def hook(mod, args, out, layer=layer):
            if zero and layer in zero:
                out = out.clone()
                out[..., zero[layer]] = 0
            if keep is not None:
                out = out * keep[layer].to(out.dtype)
            acts.append(out)
            return out

        handles.append(block.mlp.gelu.register_forward_hook(hook))
    try:
        yield acts
    finally:
        for h in handles:
            h.remove()


def _batch(prompts: list[list[int]], answer: list[int], device) -> tuple[torch.Tensor, list[int]]:
    """Each prompt + the answer, right-padded (causal: padding after a sequence changes nothing before it)."""
    seqs = [p + answer for p in prompts]
    x = torch.zeros(len(seqs), max(len(q) for q in seqs), dtype=torch.long)
    for i, q in enumerate(seqs):
        x[i, : len(q)] = torch.tensor(q)
    return x.to(device), [len(p) for p in prompts]


def answer_logprobs(
    model: Transformer,
    prompts: list[list[int]],
    answer: list[int],
    device,
    zero: dict[int, list[int]] | None = None,
    grad: bool = False,
):
    """((n_prompts,) the answer's log-probability after each prompt, summed over its tokens; the
    layers' activations (B, T, 4C), in the gradient graph with `grad`)."""
    x, starts = _batch(prompts, answer, device)
    with torch.set_grad_enabled(grad), ffn_activations(model, zero) as acts:
        lp = F.log_softmax(model(x)[0].float(), -1)
        ans = torch.tensor(answer, device=lp.device)
        out = torch.stack(
            [
                lp[i, torch.arange(st - 1, st - 1 + len(answer), device=lp.device), ans].sum()
                for i, st in enumerate(starts)
            ]
        )
    return out, acts


def knowledge(lp: torch.Tensor) -> torch.Tensor:
    """The subject's own prompt (row 0) against the same prompt about the other subjects of its relation:
    how much naming the subject raises its answer (the answer's own prior cancels)."""
    return lp[0] - lp[1:].mean()


def attribute(model: Transformer, prompt_sets: list[list[list[int]]], answer: list[int], device) -> torch.Tensor:
    """(n_layer, 4C): Σ over prompt sets and positions of activation × ∂knowledge/∂activation."""
    total = None
    for prompts in prompt_sets:
        lp, acts = answer_logprobs(model, prompts, answer, device, grad=True)
        grads = torch.autograd.grad(knowledge(lp), acts)
        a = torch.stack([(act * g).sum((0, 1)) for act, g in zip(acts, grads)]).detach()  # (L, 4C)
        total = a if total is None else total + a
    if total is None:
        raise ValueError("attribute needs at least one set of prompts")
    return total


def matched_draw(
    acts: list[torch.Tensor], neurons: list[tuple[int, int]], rng: np.random.Generator
) -> list[tuple[int, int]]:
    """As many neurons as `neurons`, per layer as many, each among the 10 nearest in mean |activation|
    on this prompt (rank order) to the one it replaces, none of `neurons` and none twice."""
    chosen = set(neurons)
    draw: list[tuple[int, int]] = []
    for layer, i in neurons:
        order = torch.argsort(acts[layer].abs().mean(0), descending=True).tolist()
        r, width, near = order.index(i), 10, []
        while not near:
            near = [n for n in order[max(0, r - width) : r + width + 1] if (layer, n) not in chosen | set(draw)]
            width *= 2
        draw.append((layer, int(rng.choice(near))))
    return draw


@torch.no_grad()
def zeroed_knowledge(model, prompts, answer, device, neuron_sets: list[list[tuple[int, int]]]) -> list[float]:
    """The knowledge score with each set of neurons zeroed: one batch, the prompts repeated per set."""
    x, starts = _batch(prompts, answer, device)
    n_layer, width = len(model.h), model.h[0].mlp.c_fc.out_features
    keep = torch.ones(len(neuron_sets), n_layer, width, device=device)
    for v, neurons in enumerate(neuron_sets):
        for layer, i in neurons:
            keep[v, layer, i] = 0
    keep = keep.repeat_interleave(len(prompts), 0)  # (V·B, L, 4C): set v's rows are v·B … v·B + B − 1
    with ffn_activations(model, keep=[keep[:, layer, None] for layer in range(n_layer)]):
        lp = F.log_softmax(model(x.repeat(len(neuron_sets), 1))[0].float(), -1)
    ans = torch.tensor(answer, device=lp.device)
    span = torch.arange(len(answer), device=lp.device)
    scores = torch.stack([lp[r, span + starts[r % len(prompts)] - 1, ans].sum() for r in range(lp.shape[0])])
    return [float(knowledge(v)) for v in scores.view(len(neuron_sets), len(prompts))]


def probe_fact(
    model: Transformer, fact: Fact, others: list[str], encode: Encode, s: FactSettings, rng: np.random.Generator, device
) -> dict:
    """One fact: its neurons chosen on the selection prompts, judged on the held-out ones. `others`:
    the other subjects of its relation, whose prompts the knowledge score compares against (zeroing
    applies to every prompt: a neuron that lowers the answer whoever the subject is takes nothing)."""
    select, test = TEMPLATES[fact.relation]
    answer = encode(" " + fact.answer)
    sets = lambda t: [encode(t.format(s=x)) for x in [fact.subject, *others]]  # noqa: E731
    width = model.blocks[0].mlp.c_fc.out_features
    attr = attribute(model, [sets(t) for t in select], answer, device)
    neurons = [divmod(i, width) for i in torch.topk(attr.reshape(-1), s.ablate_k).indices.tolist()]
    rows = []
    for t in test:
        prompts = sets(t)
        with torch.no_grad():
            lp, acts = answer_logprobs(model, prompts, answer, device)
        own = [a[0, : len(prompts[0])].float() for a in acts]  # (T_prompt, 4C): the own prompt's positions
        draws = [matched_draw(own, neurons, rng) for _ in range(s.random_draws)]
        k_top, *k_rand = zeroed_knowledge(model, prompts, answer, device, [neurons, *draws])
        rows.append((float(knowledge(lp)), k_top, float(np.mean(k_rand))))
    base, top_k, rand_k = (float(np.mean(c)) for c in zip(*rows))
    return {
        "relation": fact.relation,
        "subject": fact.subject,
        "answer": fact.answer,
        "cooccurrences": fact.cooccurrences,
        "answer_tokens": len(answer),
        "other_subjects": len(others),
        "knowledge": base,
        "knowledge_top_k_zeroed": top_k,
        "knowledge_matched_zeroed": rand_k,
        "extra_drop": rand_k - top_k,
        "neurons": " ".join(f"L{layer}.{i}" for layer, i in neurons),
    }


def _interval(d: np.ndarray, n: int, rng: np.random.Generator) -> tuple[float, float]:
    boots = rng.choice(d, (n, len(d))).mean(1)
    return float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


def probe_facts(model: Transformer, facts: list[Fact], encode: Encode, s: FactSettings, device="cpu") -> list[dict]:
    """Every fact through `probe_fact`, each compared with the other subjects of its relation."""
    model = model.to(device).eval()
    rng = np.random.default_rng(s.seed)
    subjects: dict[str, list[str]] = {}
    for f in facts:
        subjects.setdefault(f.relation, []).append(f.subject)
    return [
        probe_fact(model, f, [x for x in subjects[f.relation] if x != f.subject], encode, s, rng, device) for f in facts
    ]


def summarize(trained: list[dict], control: list[dict], s: FactSettings) -> dict[str, float]:
    """One seed's figures, intervals bootstrapped over facts (paired where two models are compared):
    the trained model's knowledge, its chosen neurons' extra drop, and the same selection's extra drop in
    the untrained model of the same shape and seed (what the procedure finds where nothing was learned)."""
    rng = np.random.default_rng(s.seed)
    k = np.array([r["knowledge"] for r in trained])
    e = np.array([r["extra_drop"] for r in trained])
    c = np.array([r["extra_drop"] for r in control])
    out: dict = {"facts": len(trained), "known_share": float((k > 0).mean())}
    for name, d in (("knowledge", k), ("extra_drop", e), ("control_extra_drop", c), ("extra_drop_over_control", e - c)):
        lo, hi = _interval(d, s.bootstrap, rng)
        out |= {f"{name}_mean": float(d.mean()), f"{name}_lo": lo, f"{name}_hi": hi}
    out["control_knowledge_mean"] = float(np.mean([r["knowledge"] for r in control]))
    return out


@torch.no_grad()
def made_up_entities(
    model: nn.Module, facts: list[Fact], encode: Encode, known: set[str], s: FactSettings, device="cpu"
) -> list[dict]:
    """Each fact's first held-out prompt about its subject and about a made-up name the corpus never
    contains: the model's top-1 probability and entropy of the next token after each, as measured."""
    from .inside import entropy, made_up_name

    rng = np.random.default_rng(s.seed)
    model = model.to(device).eval()
    rows = []
    for f in facts:
        template = TEMPLATES[f.relation][1][0]
        name = made_up_name(rng, known)
        probs = []
        for subject in (f.subject, name):
            x = torch.tensor([encode(template.format(s=subject))], device=device)
            probs.append(F.softmax(model(x)[0][0, -1].float(), -1))
        rows.append(
            {
                "relation": f.relation,
                "subject": f.subject,
                "made_up": name,
                "prompt": template.format(s=f.subject),
                "top1_p_real": float(probs[0].max()),
                "top1_p_made_up": float(probs[1].max()),
                "entropy_real": entropy(probs[0]),
                "entropy_made_up": entropy(probs[1]),
            }
        )
    return rows


@dataclass
class FactSeedResult:
    seed: int
    val_loss: float
    steps: int
    rows: list[dict]  # the trained model's facts
    control_rows: list[dict]  # the untrained model's (same shape, same seed)
    summary: dict[str, float]
    weights: Path | None = None


@dataclass
class FactStudyResult:
    facts: list[Fact]
    seeds: list[FactSeedResult]
    made_up: list[dict]
    prompts_in_training_text: list[str]
    vocab_size: int
    tokenizer_path: Path | None = None
    figures: dict[str, Figure] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {"facts/count": float(len(self.facts))}
        for r in self.seeds:
            out[f"facts/seed{r.seed}/val_loss"] = r.val_loss
            out |= {f"facts/seed{r.seed}/{k}": float(v) for k, v in r.summary.items()}
        if self.made_up:
            for k in ("top1_p_real", "top1_p_made_up", "entropy_real", "entropy_made_up"):
                out[f"facts/{k}_mean"] = float(np.mean([r[k] for r in self.made_up]))
        return out


def _train_seed(model_settings, vocab_size: int, ts, train_data, val_data, run_dir: Path):
    """One seed of the fact model (in a worker or here): its weights and its TrainResult."""
    seed_everything(ts.seed)
    model = Transformer(model_settings, vocab_size)
    res = train(model, train_data, val_data, ts, run_dir, resume=False)
    return weights_out(model), res


def fact_memories(
    train_texts: list[str],
    val_texts: list[str],
    model_settings,
    train_settings,
    s: FactSettings,
    out_dir: str | Path,
    *,
    known: set[str],
    analogy_path: str | Path | None = None,
    device="cpu",
) -> FactStudyResult:
    """The fact study: a BPE tokenizer and, per seed, a small Transformer trained on the corpus's
    training split; each seed's model and its untrained twin probed on the corpus's facts. A corpus that
    names no fact often enough gives a result without facts (the claim is then not judged)."""
    out_dir = Path(out_dir)
    facts = corpus_facts(train_texts, analogy_pairs(analogy_path or gensim_test_file("questions-words.txt")), s)
    tok = train_tokenizer(train_texts, TokenizerSettings(kind="bpe", vocab_size=s.vocab_size))
    tok_path = out_dir / "tokenizer.json"
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(tok_path))
    vocab = tok.get_vocab_size()
    encode = lambda t: tok.encode(t, add_special_tokens=False).ids  # noqa: E731
    T = model_settings.block_size
    train_data = pack_blocks(token_stream(tok, train_texts), T, vocab)
    val_data = pack_blocks(token_stream(tok, val_texts), T, vocab)
    workers = cpu_workers(s.workers, train_settings.device)
    ts = one_thread_each(train_settings, workers)
    jobs = [
        (model_settings, vocab, ts.model_copy(update={"seed": seed}), train_data, val_data, out_dir / f"seed{seed}")
        for seed in s.seeds
    ]
    trained = run_jobs(_train_seed, jobs, workers)
    seeds = []
    first = None
    for seed, (weights, res) in zip(s.seeds, trained):
        seed_everything(seed)
        control = Transformer(model_settings, vocab)  # the same init the seed trained from
        model = Transformer(model_settings, vocab)
        weights_in(model, weights)
        first = model if first is None else first
        rows = probe_facts(model, facts, encode, s, device) if facts else []
        control_rows = probe_facts(control, facts, encode, s, device) if facts else []
        seeds.append(
            FactSeedResult(
                seed=seed,
                val_loss=float(res.val_loss),
                steps=int(res.steps),
                rows=rows,
                control_rows=control_rows,
                summary=summarize(rows, control_rows, s) if facts else {},
                weights=res.checkpoint_dir / WEIGHTS_FILE,
            )
        )
    made_up = made_up_entities(first, facts, encode, known, s, device) if facts and first is not None else []
    result = FactStudyResult(
        facts=facts,
        seeds=seeds,
        made_up=made_up,
        prompts_in_training_text=prompts_in_text(train_texts, facts),
        vocab_size=vocab,
        tokenizer_path=tok_path,
    )
    if facts:
        result.figures["facts"] = plot_facts(seeds)
    return result


def plot_facts(seeds: list[FactSeedResult]) -> Figure:
    fig = Figure(figsize=(6 * len(seeds), 4.6), layout="constrained")
    axes = fig.subplots(1, len(seeds), squeeze=False)[0]
    for ax, r in zip(axes, seeds):
        x = np.arange(len(r.rows))
        ax.bar(x - 0.27, [q["knowledge"] for q in r.rows], 0.27, label="model")
        ax.bar(x, [q["knowledge_matched_zeroed"] for q in r.rows], 0.27, label="matched neurons zeroed")
        ax.bar(x + 0.27, [q["knowledge_top_k_zeroed"] for q in r.rows], 0.27, label="chosen neurons zeroed")
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xticks(x, [f"{q['subject']}→{q['answer']}" for q in r.rows], rotation=75, fontsize=7)
        ax.set_ylabel("log p(answer | its subject) − mean over other subjects (nats)")
        ax.set_title(f"held-out prompts, fact model seed {r.seed} (val loss {r.val_loss:.3f})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return fig
