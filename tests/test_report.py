"""The run report's page (`components.core.report`): claims with their verdicts, each stage's figures,
tables and plots embedded, text escaped, and the run's summary for MLflow's run description."""

from __future__ import annotations

import base64
import dataclasses
import html

from matplotlib.figure import Figure

from components.core import claims as C
from components.core import manifests as M
from components.core.report import (
    DataCheck,
    Section,
    headline_metrics,
    render_report,
    section_from_manifest,
    summary_markdown,
)


def judgements():
    baseline = M.NgramReference(val_loss=4.5, model="kn_3gram", block_size=32, n_targets=100, tokenizer_sha256="t")
    lm = M.LanguageModel(
        name="rnn_lm",
        family="recurrent",
        weights="",
        vocab_size=100,
        metrics={"val/loss": 4.0, "val/targets": 100},
        history=[{"grad_norm": 2.0, "grad_norm_clipped": 1.0}],
        train_settings={"grad_clip": 1.0, "block_size": 32},
        tokenizer_sha256="t",
        baseline=baseline,
    )
    bad_lm = dataclasses.replace(
        lm,
        name="lstm_lm",
        metrics={"val/loss": 9.0, "val/targets": 100},
        history=[{"grad_norm": 2.0, "grad_norm_clipped": 2.0}],
    )
    return C.judge_all(
        {"rnn_lm": lm, "lstm_lm": bad_lm},
        ["rnn_lm", "lstm_lm"],
        [C.claim("language_models_beat_the_count_model"), C.claim("clipping_bounds_gradient"), C.claim("heads_differ")],
    )


def test_the_page_holds_every_stage_claim_and_plot_and_escapes_text(tmp_path):
    fig = Figure(figsize=(2, 2))
    fig.add_subplot().plot([0, 1], [1, 0])
    png = tmp_path / "loss.png"
    fig.savefig(png)
    manifest = M.EmbeddingEval(
        figures={"loss": M.FileRecord(path=str(png), bytes=png.stat().st_size, sha256="")},
        published=M.Published(
            metrics={"val/loss": 4.0, "params": 60000.0},
            tables={"rows": [{"step": i, "loss": 1 / (i + 1)} for i in range(50)]},
            table_rows={"rows": 120},
            texts={"notes": "| a | b |\n|---|---|\n| <script>alert(1)</script> | **x** |"},
            warnings=["ranking not settled"],
            mlflow_url="http://127.0.0.1:5000/#/experiments/1/runs/abc",
        ),
    )
    sections = [
        section_from_manifest("rnn_lm", "recurrent", manifest, "An RNN."),
        Section("lstm_lm", "recurrent"),
        Section("corpus", "ingest", metrics={"documents": 24.0}),
    ]
    js = judgements()
    page = render_report(
        "Run report: tiny",
        {"Dagster run": "r1", "MLflow parent run": "http://x/parent"},
        sections,
        js,
        [DataCheck(name="labels_are_shifted_inputs", asset="labels", passed=True, severity="ERROR")],
    )
    for stage in ("recurrent", "ingest"):
        assert f'id="stage-{stage}"' in page
    for asset in ("rnn_lm", "lstm_lm", "corpus"):
        assert f'id="asset-{asset}"' in page
    # Every claim with its verdict, on every model it judges.
    assert {(j.claim.name, j.asset, j.status) for j in js} == {
        ("language_models_beat_the_count_model", "rnn_lm", "passed"),
        ("language_models_beat_the_count_model", "lstm_lm", "warning"),
        ("clipping_bounds_gradient", "rnn_lm", "passed"),
        ("clipping_bounds_gradient", "lstm_lm", "failed"),
        ("heads_differ", "attention_heads", "not judged"),
    }
    for j in js:
        assert f'<tr class="{j.status.replace(" ", "_")}" id="claim-{j.claim.name}-{j.asset}">' in page
        assert html.escape(j.claim.statement) in page
    # The headline counts the article's claims only, each once with its worst verdict
    # (language_models_beat_the_count_model:
    # a warning on the LSTM; heads_differ, not judged: never a pass); the per-model invariant is listed apart,
    # counted once with its worst verdict.
    assert (
        '<p class="summary"><span>0 passed</span><span class="fail">0 failed</span><span class="warn">1 '
        'warnings</span><span>1 not judged</span>' in page
    )
    assert '<span>0 held</span><span class="fail">1 broken</span><span class="warn">0 warnings</span>' in page
    assert (
        page.index('id="claims"')
        < page.index("claim-heads_differ-attention_heads")
        < page.index('id="invariants"')
        < page.index("claim-clipping_bounds_gradient-rnn_lm")
    )
    assert (
        html.escape(C.claim("heads_differ").statement_zh) in page
        and html.escape(C.claim("heads_differ").falsifier) in page
    )
    # Each evidence claim shows the test of its counterexample and what kind of world it is.
    assert html.escape(C.claim("heads_differ").counterexample) in page and "counterexample (measured)" in page
    # The statements measured nowhere, with why, after the evidence and before the demonstrations.
    assert page.index('id="claims"') < page.index('id="not-measured"') < page.index('id="demonstrations"')
    assert all(html.escape(n.reason) in page and html.escape(n.statement_zh) in page for n in C.NOT_MEASURED)
    assert "labels_are_shifted_inputs" in page
    # The plot is in the page itself; text is escaped; markdown tables are tables; long tables say so.
    assert "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode() in page
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<td><strong>x</strong></td>" in page
    assert "first 50 of 120 rows" in page and "ranking not settled" in page and "60,000" in page


def test_summary_for_the_parent_run_fits_mlflows_description():
    js = judgements()
    headline = headline_metrics([Section("rnn_lm", "recurrent", metrics={f"m{i}": float(i) for i in range(2000)})])
    assert headline["rnn_lm/m7"] == 7.0 and len(headline) == 2000
    text = summary_markdown("Run report", js, headline, "report.html")
    assert len(text) <= 7000 and "`clipping_bounds_gradient`" in text and "✘ failed" in text and "report.html" in text
    assert "The article's claims, evidence: **0 passed**, 0 failed, 1 warnings, 1 not judged" in text
    assert "1 broken" in text
    assert "rnn_lm/m0" in text and "rnn_lm/m1999" not in text and "(all metrics on this run)" in text


def _pixels(fig):
    import io

    import matplotlib.image as mpimg

    from components.orchestration.tracking import figure_png

    return mpimg.imread(io.BytesIO(figure_png(fig)), format="png")


def _text_figure(text: str, **kw):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 1), dpi=60)
    fig.text(0.05, 0.3, text, fontsize=24, **kw)
    return fig


def test_chinese_in_a_figure_renders_with_the_packaged_font_not_as_missing_glyph_boxes():
    """On a machine with no CJK font, DejaVu draws every Chinese character as the same box: 我爱你 and
    你爱我 give the same pixels. With the packaged font as the fallback they differ, and differ from the boxes."""
    import warnings

    import numpy as np

    from components.core import cjk_font

    assert cjk_font.available()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Glyph … missing from font(s) DejaVu Sans": the boxes on purpose
        tofu = _pixels(_text_figure("我爱你", family=["DejaVu Sans"]))
        tofu_swapped = _pixels(_text_figure("你爱我", family=["DejaVu Sans"]))
    assert np.array_equal(tofu, tofu_swapped)
    real, swapped = _pixels(_text_figure("我爱你")), _pixels(_text_figure("你爱我"))
    assert real.shape == swapped.shape and not np.array_equal(real, swapped)
    assert not np.array_equal(real, tofu)
    assert (real[..., 0] < 0.5).mean() > 0.3 * (tofu[..., 0] < 0.5).mean()  # regular weight, not hairlines


def test_the_page_embeds_the_chinese_it_shows():
    import base64
    import io
    import re

    from fontTools.ttLib import TTFont

    page = render_report("t", {}, [], judgements())
    m = re.search(r"src:url\(data:font/otf;base64,([A-Za-z0-9+/=]+)\)", page)
    assert m, "no embedded CJK font"
    cmap = TTFont(io.BytesIO(base64.b64decode(m.group(1)))).getBestCmap()
    shown = {c for c in re.sub(r"<style>.*?</style>", "", page, flags=re.S) if "\u4e00" <= c <= "\u9fff"}
    assert shown and all(ord(c) in cmap for c in shown)
    # One language at a time: a CSS switch, no script.
    assert 'id="lang-zh"' in page and "<script" not in page and 'class="zh"' in page and 'class="en"' in page


def test_a_wide_figure_gets_a_preview_scaled_to_the_inline_width():
    """The preview Dagster shows in place is the full-size PNG resampled to INLINE_MAX_PX wide, its
    aspect kept and its ink still there (not a blank or a re-render at another layout)."""
    import io

    import matplotlib.image as mpimg
    from matplotlib.figure import Figure

    from components.orchestration.tracking import INLINE_MAX_PX, figure_png, png_size, scaled_png

    fig = Figure(figsize=(16, 2))
    fig.subplots().plot(range(10), color="black")
    full = figure_png(fig)
    w, h = png_size(full)
    assert w > INLINE_MAX_PX
    small = scaled_png(full, INLINE_MAX_PX)
    sw, sh = png_size(small)
    assert sw == INLINE_MAX_PX and abs(sh - h * INLINE_MAX_PX / w) <= 1
    img = mpimg.imread(io.BytesIO(small), format="png")
    assert img[..., :3].min() < 0.5  # the text is still drawn
