"""One HTML page for a whole run: the article's claims with their measured verdicts, then every
stage's headline figures, tables, plots and notes, as each asset published them.

Everything comes from the run's manifests: what `Stage.publish` keeps in each (`published`: headline
metrics, the first rows of each table, texts; `figures`: PNG files beside the outputs) and the
claims judged on them by `components.core.claims`, the same functions the asset checks call. The
page is one self-contained file (plots embedded as data URIs, no scripts, no external resources), so
it opens as it is from disk or in MLflow's artifact viewer. Text is escaped with the standard
library's `html`; the stages' markdown notes are rendered with markdown-it with raw HTML off.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .claims import NOT_MEASURED, SECTIONS, Judgement
from .manifests import LanguageModel, Manifest, ModelComparison
from .report_format import anchor, data_uri, esc, figures_html, fmt, markdown_html, table_html
from .rerun import Change

STATUS_ORDER = ("failed", "warning", "not judged", "passed")
STATUS_MARK = {"passed": "✔ passed", "failed": "✘ failed", "warning": "⚠ warning", "not judged": "– not judged"}


@dataclass
class Section:
    """One asset's part of the report."""

    asset: str
    group: str
    description: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    tables: dict[str, list[dict]] = field(default_factory=dict)
    table_rows: dict[str, int] = field(default_factory=dict)  # full row counts (the manifest keeps the first rows)
    figures: dict[str, Path] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    link: str = ""  # the asset's MLflow run


def section_from_manifest(
    asset: str, group: str, manifest: Manifest | dict[str, Manifest], description: str = ""
) -> Section:
    """What the asset published, as its manifest keeps it (a partitioned asset, read as
    {partition: manifest}, publishes per partition: its section has the description alone)."""
    if not isinstance(manifest, Manifest):
        return Section(asset=asset, group=group, description=description)
    pub = manifest.published
    return Section(
        asset=asset,
        group=group,
        description=description,
        metrics=dict(pub.metrics),
        tables=dict(pub.tables),
        table_rows=dict(pub.table_rows),
        figures={name: Path(rec.path) for name, rec in manifest.figures.items()},
        texts=dict(pub.texts),
        warnings=list(pub.warnings),
        link=pub.mlflow_url,
    )


def headline_metrics(sections: Iterable[Section]) -> dict[str, float]:
    """Every stage's headline metrics under `<asset>/<metric>`: the run's summary on its parent run."""
    return {f"{s.asset}/{k}": float(v) for s in sections for k, v in s.metrics.items()}


def grouped_status(judgements: list[Judgement]) -> dict[str, str]:
    """One status per check name: a check judged on several assets (each language model) counts once,
    with its worst verdict (failed, warning, not judged, passed in that order)."""
    out: dict[str, str] = {}
    for j in judgements:
        prev = out.get(j.claim.name)
        out[j.claim.name] = j.status if prev is None else min(prev, j.status, key=STATUS_ORDER.index)
    return out


@dataclass(frozen=True)
class StatusCounts:
    """How many checks of one kind ended in each status (each check once, with its worst verdict)."""

    failed: int = 0
    warning: int = 0
    not_judged: int = 0
    passed: int = 0

    def as_dict(self) -> dict[str, int]:
        """Keyed by status as shown ("not judged"), in STATUS_ORDER: the report manifest's stored form."""
        return dict(zip(STATUS_ORDER, (self.failed, self.warning, self.not_judged, self.passed)))


def _counts(judgements: list[Judgement], kind: str) -> StatusCounts:
    statuses = list(grouped_status([j for j in judgements if j.claim.kind == kind]).values())
    return StatusCounts(*(statuses.count(status) for status in STATUS_ORDER))


def claim_counts(judgements: list[Judgement]) -> StatusCounts:
    """The headline: the evidence only, each claim once (demonstrations and invariants are counted apart)."""
    return _counts(judgements, "evidence")


def demonstration_counts(judgements: list[Judgement]) -> StatusCounts:
    return _counts(judgements, "demonstration")


def invariant_counts(judgements: list[Judgement]) -> StatusCounts:
    return _counts(judgements, "invariant")


# --------------------------------------------------------------------------------------------------
# The result: the models against the count model, and what moved since the previous run


@dataclass(frozen=True)
class ResultRow:
    """One language model in the result table."""

    model: str
    val_loss: float
    seeds: str  # "min–max (n seeds)" where it trained with several
    minus_count_model: float | None
    on_the_count_ladder: str
    previous: float | None  # its previous materialization's validation loss
    change: float | None
    since_previous_run: str  # the verdict against seed noise, or "new"


@dataclass(frozen=True)
class DataCheck:
    """A data check Dagster recorded in the run (not a claim: the report does not judge it)."""

    name: str
    asset: str
    passed: bool
    severity: str = ""


def result_rows(lms: dict[str, LanguageModel], comparison: ModelComparison | None = None) -> list[ResultRow]:
    """One row per language model, best first: its validation loss (with its seeds), the gap to the
    count model on the same targets and its place on the count ladder, and its change since the
    previous materialization (`Published.changes`) with the verdict against seed noise."""
    from .studies.ngram import ladder_position

    seeds = comparison.seeds if comparison is not None else {}
    rows = []
    for name, lm in lms.items():
        model = name.removesuffix("_lm")
        base = lm.baseline
        change = lm.published.change_of("val/loss")
        s = seeds.get(model)
        rows.append(
            ResultRow(
                model=model,
                val_loss=lm.val_loss,
                seeds=f"{s.min:.3f}–{s.max:.3f} ({s.seeds} seeds)" if s is not None and s.seeds > 1 else "",
                minus_count_model=lm.val_loss - base.val_loss if base else None,
                on_the_count_ladder=ladder_position(lm.val_loss, base.ladder) if base else "",
                previous=change.previous if change else None,
                change=change.delta if change else None,
                since_previous_run=change.verdict if change else "new",
            )
        )
    return sorted(rows, key=lambda r: r.val_loss)


def _signed(v: Any) -> str:
    return "" if v is None else f"{v:+.3f}"


def result_html(
    rows: list[ResultRow],
    count_model: tuple[str, float] | None,
    counts: dict[str, StatusCounts],
    count_changes: list[Change],
) -> str:
    """The page's first screen: the models against the count model, their change since the previous
    run, and the claims' counts by kind with their change."""
    head = (
        "<th>model</th><th>val loss</th><th>seeds</th><th>− count model</th><th>on the count ladder</th>"
        "<th>previous run</th><th>change</th><th>since the previous run</th>"
    )
    body = []
    if count_model:
        body.append(
            f"<tr><td><strong>count model ({html.escape(count_model[0])})</strong></td>"
            f"<td><strong>{count_model[1]:.3f}</strong></td>" + "<td></td>" * 6 + "</tr>"
        )
    for r in rows:
        prev = "" if r.previous is None else f"{r.previous:.3f}"
        body.append(
            f"<tr><td>{html.escape(r.model)}</td><td>{r.val_loss:.3f}</td><td>{html.escape(r.seeds)}</td>"
            f"<td>{_signed(r.minus_count_model)}</td><td>{html.escape(r.on_the_count_ladder)}</td>"
            f"<td>{prev}</td><td>{_signed(r.change)}</td><td>{html.escape(r.since_previous_run)}</td></tr>"
        )
    moved = {c.name: c for c in count_changes}

    def line(kind: str, label: str, verbs: tuple[str, ...]) -> str:
        c = counts.get(kind, StatusCounts())
        parts = []
        for status, n, verb in zip(
            ("passed", "warning", "failed", "not_judged"), (c.passed, c.warning, c.failed, c.not_judged), verbs
        ):
            ch = moved.get(f"{kind}/{status}")
            delta = f" ({ch.delta:+.0f})" if ch is not None and ch.delta else ""
            parts.append(f"{n} {verb}{delta}")
        return f"<li><strong>{label}</strong>: {', '.join(parts)}</li>"

    return (
        '<h2 id="result">The result</h2>'
        f'<table class="data result"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
        "<ul>"
        + line("claims", "evidence (the headline)", ("passed", "warnings", "failed", "not judged"))
        + line(
            "demonstrations",
            "demonstrations (by construction, not counted)",
            ("shown", "warnings", "broken", "not judged"),
        )
        + line("invariants", "invariants", ("held", "warnings", "broken", "not judged"))
        + "</ul><p class=\"desc\">Change: against each model's previous materialization; a verdict beyond noise "
        "compares it with the seed spread model_comparison measured. Counts in brackets: the change since the "
        "previous report.</p>"
    )


def result_markdown(rows: list[ResultRow], count_model: tuple[str, float] | None) -> str:
    """The result table as markdown (the MLflow parent run's description)."""
    lines = [
        "| model | val loss | − count model | on the count ladder | previous run | change | since then |",
        "|---|---:|---:|---|---:|---:|---|",
    ]
    if count_model:
        lines.append(f"| **count model ({count_model[0]})** | **{count_model[1]:.3f}** | | | | | |")
    for r in rows:
        prev = "" if r.previous is None else f"{r.previous:.3f}"
        lines.append(
            f"| {r.model} | {r.val_loss:.3f} | {_signed(r.minus_count_model)} | "
            f"{r.on_the_count_ladder} | {prev} | {_signed(r.change)} | {r.since_previous_run} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# The page

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif,"Report CJK";margin:0 auto;
max-width:1200px;padding:1em 2em;color:#222;line-height:1.4}
h1{margin-bottom:.2em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:1.6em}h3{margin-top:1.4em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
td,th{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f4f4f4}table.metrics td:nth-child(2){text-align:right;font-variant-numeric:tabular-nums}
tr.passed td.verdict{color:#176b2c}tr.failed td.verdict{color:#b00020;font-weight:bold}
tr.warning td.verdict{color:#9a6700;font-weight:bold}
tr.not_judged td.verdict{color:#666}td.verdict{white-space:nowrap}.figures{font-size:.85em;color:#444}
.summary span{display:inline-block;margin-right:1.2em;font-weight:bold}.warn{color:#9a6700}.fail{color:#b00020}
img{max-width:100%;border:1px solid #eee;margin:.3em 0}figure{margin:.6em 0}figcaption{font-size:.85em;color:#555}
details{margin:.4em 0}summary{cursor:pointer;color:#0b5394}nav a{margin-right:1em}.more{font-size:.8em;color:#666}
.desc{color:#444}ul.warnings{color:#9a6700}
table{display:block;max-width:100%;overflow-x:auto}td,th{overflow-wrap:break-word}a{overflow-wrap:anywhere}img{height:auto}
pre{white-space:pre-wrap;overflow-wrap:anywhere}nav{display:flex;flex-wrap:wrap;gap:.2em 0}
span.zh,span.en{display:block}#lang-en:checked~main .zh{display:none}#lang-zh:checked~main .en{display:none}
p.lang{float:right;margin:0}input[name=lang]{position:absolute;opacity:0;pointer-events:none}
p.lang label{cursor:pointer;color:#0b5394}#lang-en:checked~p.lang label[for=lang-en],
#lang-zh:checked~p.lang label[for=lang-zh]{font-weight:bold;color:#222}
[lang="zh"]{font-family:"Report CJK","Noto Sans CJK SC","Noto Sans SC","Source Han Sans SC","PingFang SC",
"Microsoft YaHei",sans-serif}
@media (max-width:800px){body{padding:.5em .8em}td,th{padding:.2em .35em}
table.claims{display:table;table-layout:fixed;width:100%}table.claims td,table.claims th{overflow-wrap:anywhere}
table.claims td.verdict{white-space:normal}table.claims th:nth-child(1){width:14%}
table.claims th:nth-child(2){width:20%}table.claims th:nth-child(3){width:15%}table.claims th:nth-child(4){width:28%}}
"""


def _measured(j: Judgement, limit: int = 12) -> str:
    v = j.verdict
    if v is None:
        return html.escape(j.error)
    return figures_html({**v.checks, **v.figures}, limit) + (f"<br><em>{html.escape(v.note)}</em>" if v.note else "")


def _row(j: Judgement, cells: str, with_id: bool = True, before: str = "") -> str:
    rid = f' id="{anchor("claim", j.claim.name, j.asset)}"' if with_id else ""
    return (
        f'<tr class="{j.status.replace(" ", "_")}"{rid}>{before}'
        f'<td class="verdict">{STATUS_MARK[j.status]}</td>{cells}</tr>'
    )


def claims_html(judgements: list[Judgement], with_asset: bool = True, with_id: bool = True) -> str:
    """Checks as a compact table (verdict, name, asset, statement, figures): the invariants, and each
    stage's own checks under its section."""
    head = (
        "<th>verdict</th><th>check</th>"
        + ("<th>asset</th>" if with_asset else "")
        + "<th>statement</th><th>measured</th>"
    )
    rows = []
    for j in judgements:
        asset = f'<td><a href="#{anchor("asset", j.asset)}">{html.escape(j.asset)}</a></td>' if with_asset else ""
        kind = "" if j.claim.kind == "evidence" else f"<em>{html.escape(j.claim.kind)}</em> "
        rows.append(
            _row(
                j,
                f"<td><code>{html.escape(j.claim.name)}</code></td>{asset}<td>{kind}{html.escape(j.claim.statement)}</td>"
                f'<td class="figures">{_measured(j)}</td>',
                with_id,
            )
        )
    return f'<table class="claims"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def counterexample_html(c) -> str:
    """The test that builds a world where an evidence claim must fail, and what kind of world it is."""
    if c.kind != "evidence" or not c.counterexample:
        return ""
    world = "measured" if c.counterexample_measured else "hand-written manifest"
    return f'<br><small>counterexample ({world}): <code>{html.escape(c.counterexample)}</code></small>'


def not_measured_html() -> str:
    """The article's statements this pipeline does not measure, each with why."""
    rows = "".join(
        f'<tr><td>{html.escape(n.section)}</td><td><span lang="zh" class="zh">{html.escape(n.statement_zh)}</span>'
        f'<span class="en">{html.escape(n.statement)}</span></td><td>{html.escape(n.reason)}</td></tr>'
        for n in NOT_MEASURED
    )
    return (
        '<h3 id="not-measured">Not measured here</h3><table class="claims"><thead><tr><th>§</th>'
        f"<th>statement (中文 / English)</th><th>why not</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def article_claims_html(judgements: list[Judgement]) -> str:
    """The article's claims in the article's order: section, statement in Chinese and English, what
    would fail it, the verdict and every measured figure (intervals included)."""
    head = (
        "<th>§</th><th>verdict</th><th>claim</th><th>statement (中文 / English)</th><th>fails if</th><th>measured</th>"
    )
    order = list(SECTIONS)
    rows = []
    for j in sorted(judgements, key=lambda j: order.index(j.claim.section) if j.claim.section in order else len(order)):
        c = j.claim
        section = f'<td title="{html.escape(SECTIONS.get(c.section, ""), quote=True)}">{html.escape(c.section)}</td>'
        rows.append(
            _row(
                j,
                (
                    f'<td><code>{html.escape(c.name)}</code><br><a '
                    f'href="#{anchor("asset", j.asset)}">{html.escape(j.asset)}</a></td>'
                    f'<td><span lang="zh" class="zh">{html.escape(c.statement_zh)}</span>'
                    f'<span class="en">{html.escape(c.statement)}</span></td>'
                    f'<td>{html.escape(c.falsifier)}{counterexample_html(c)}</td>'
                    f'<td class="figures">{_measured(j, 40)}</td>'
                ),
                before=section,
            )
        )
    return f'<table class="claims"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def section_html(s: Section, judgements: list[Judgement]) -> str:
    parts = [f'<h3 id="{anchor("asset", s.asset)}">{html.escape(s.asset)}</h3>']
    if s.description:
        parts.append(f'<p class="desc">{html.escape(s.description)}</p>')
    if s.link:
        parts.append(f'<p><a href="{html.escape(s.link, quote=True)}">MLflow run</a></p>')
    mine = [j for j in judgements if j.asset == s.asset]
    if mine:
        parts.append(claims_html(mine, with_asset=False, with_id=False))
    if s.warnings:
        parts.append('<ul class="warnings">' + "".join(f"<li>{html.escape(w)}</li>" for w in s.warnings) + "</ul>")
    if s.metrics:
        rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{esc(v)}</td></tr>" for k, v in sorted(s.metrics.items()))
        parts.append(
            f'<table class="metrics"><thead><tr><th>metric</th><th>value</th></tr></thead><tbody>{rows}</tbody></table>'
        )
    for name, path in s.figures.items():
        uri = data_uri(path)
        img = f'<img src="{uri}" alt="{html.escape(name)}">' if uri else f"<em>{html.escape(str(path))} is missing</em>"
        parts.append(f"<figure>{img}<figcaption>{html.escape(name)}</figcaption></figure>")
    for name, rows in s.tables.items():
        parts.append(
            f"<details><summary>table: "
            f"{html.escape(name)}</summary>{table_html(rows, s.table_rows.get(name))}</details>"
        )
    for name, text in s.texts.items():
        parts.append(f"<details><summary>{html.escape(name)}</summary>{markdown_html(text)}</details>")
    return "\n".join(parts)


def render_report(
    title: str,
    run_info: dict[str, Any],
    sections: list[Section],
    judgements: list[Judgement],
    data_checks: list[DataCheck] | None = None,
    result: str = "",
) -> str:
    """The whole page. `sections` in stage order (their `group`s are the stages); `run_info` name →
    value shown at the top (values starting with http are links); `data_checks`: further checks of
    the run as Dagster recorded them ({name, asset, passed, severity}), shown after the claims;
    `result` the first screen (`result_html`: the models against the count model, what moved since
    the previous run, the counts). A zh / en switch (CSS only: the page has no scripts) shows the
    claims' statements in one language at a time."""
    groups = list(dict.fromkeys(s.group for s in sections))
    counts, demo, inv = claim_counts(judgements), demonstration_counts(judgements), invariant_counts(judgements)
    info = "".join(
        f"<tr><th>{html.escape(k)}</th><td>"
        + (
            f'<a href="{html.escape(str(v), quote=True)}">{html.escape(str(v))}</a>'
            if str(v).startswith("http")
            else esc(v)
        )
        + "</td></tr>"
        for k, v in run_info.items()
    )
    summary = (
        f'<p class="summary"><span>{counts.passed} passed</span><span class="fail">{counts.failed} failed</span>'
        f'<span class="warn">{counts.warning} warnings</span><span>{counts.not_judged} not judged</span></p>'
    )
    article = [j for j in judgements if j.claim.kind == "evidence"]
    shown = [j for j in judgements if j.claim.kind == "demonstration"]
    integrity = sorted(
        (j for j in judgements if j.claim.kind == "invariant"), key=lambda j: STATUS_ORDER.index(j.status)
    )
    body = [
        f"<h1>{html.escape(title)}</h1>",
        result,
        f"<table>{info}</table>",
        "<nav>"
        + '<a href="#result">result</a><a href="#claims">evidence</a><a href="#demonstrations">demonstrations</a>'
        + '<a href="#invariants">invariants</a>'
        + "".join(f'<a href="#{anchor("stage", g)}">{html.escape(g)}</a>' for g in groups)
        + "</nav>",
        '<h2 id="claims">The article\'s claims: evidence measured on this run</h2>',
        '<p class="desc">Each of these could fail on this run: a plausible wrong model, wrong data or wrong '
        "implementation would fail it, and its falsifier says how. Counted once per claim (a claim judged on "
        "several models counts with its worst verdict); “not judged” means nothing was measured and is never a pass. "
        "The demonstrations and invariants below are not counted here.</p>",
        summary,
        article_claims_html(article),
        not_measured_html(),
        '<h2 id="demonstrations">Demonstrations: the article\'s points where they hold by construction</h2>',
        '<p class="desc">Shown because the article explains them (a spectral radius set to 3.0, unit-variance q·k, '
        "attention without positions, a cache allocated by its formula, a size set by the format); true by "
        "construction or by mathematics, so never evidence. A failure here is a bug.</p>",
        f'<p class="summary"><span>{demo.passed} shown</span><span class="fail">{demo.failed} broken</span>'
        f"<span>{demo.not_judged} not judged</span></p>",
        article_claims_html(shown),
        '<h2 id="invariants">Invariants and sanity checks (true by construction; not evidence for the article)</h2>',
        f'<p class="summary"><span>{inv.passed} held</span><span class="fail">{inv.failed} broken</span>'
        f'<span class="warn">{inv.warning} warnings</span><span>{inv.not_judged} not judged</span></p>',
        claims_html(integrity),
    ]
    if data_checks:
        rows = [{"check": c.name, "asset": c.asset, "passed": c.passed, "severity": c.severity} for c in data_checks]
        body += ("<h3>Data checks recorded in this run</h3>", table_html(rows))
    for g in groups:
        body.append(f'<h2 id="{anchor("stage", g)}">Stage: {html.escape(g)}</h2>')
        body += [section_html(s, judgements) for s in sections if s.group == g]
    # The radios are siblings of <main> (the CSS selects `:checked ~ main`); their labels are the switch.
    switch = (
        '<input type="radio" name="lang" id="lang-en" checked><input type="radio" name="lang" id="lang-zh">'
        '<p class="lang"><label for="lang-en">English</label> · <label for="lang-zh" lang="zh">中文</label></p>'
    )
    main = "\n".join(body)
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
        f'content="width=device-width, initial-scale=1"><title>{html.escape(title)}</title>'
        f"<style>{CSS}{font_face(switch + main)}</style></head><body>\n{switch}<main>\n{main}\n</main></body></html>\n"
    )


def font_face(text: str) -> str:
    """An @font-face for the page's Chinese (`cjk_font.page_font_face`: the packaged CJK font cut to
    the page's characters, embedded), or "" when the font package is not installed (the CSS then
    falls back to the system's CJK fonts)."""
    from .cjk_font import page_font_face

    return page_font_face(text)


def summary_markdown(
    title: str,
    judgements: list[Judgement],
    headline: dict[str, float],
    report_name: str,
    limit: int = 7000,
    result: str = "",
) -> str:
    """The run's summary as markdown (MLflow's run description): claim counts, each claim's verdict,
    then headline figures while the text stays under `limit` characters."""
    counts, demo, inv = claim_counts(judgements), demonstration_counts(judgements), invariant_counts(judgements)
    lines = [
        f"### {title}",
        "",
        *([result, ""] if result else []),
        f"The article's claims, evidence: **{counts.passed} passed**, {counts.failed} failed, "
        f"{counts.warning} warnings, {counts.not_judged} not judged. Demonstrations (by construction, not "
        f"counted): {demo.passed} shown, {demo.failed} broken. "
        f"Invariants (by construction, not counted): {inv.passed} held, "
        f"{inv.failed} broken, "
        f"{inv.warning} warnings, {inv.not_judged} not judged. "
        f"The whole report, with every stage's figures and plots: artifact `{report_name}`.",
        "",
        "| verdict | § | claim | asset |",
        "|---|---|---|---|",
    ]
    kind_order = ("evidence", "demonstration", "invariant")
    ordered = sorted(judgements, key=lambda j: (kind_order.index(j.claim.kind), STATUS_ORDER.index(j.status)))
    lines += [
        f"| {STATUS_MARK[j.status]} | {j.claim.section if j.claim.kind == 'evidence' else j.claim.kind} | "
        f"`{j.claim.name}` | {j.asset} |"
        for j in ordered
    ]
    lines += ("", "| headline metric | value |", "|---|---:|")
    more = "| … | (all metrics on this run) |"
    size = sum(len(x) + 1 for x in lines)
    for k, v in headline.items():
        line = f"| {k} | {fmt(v)} |"
        if size + len(line) + 1 + len(more) > limit:
            lines.append(more)
            break
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)
