"""Values and HTML fragments for the run report's page (`components.core.report`): numbers as the
page shows them (`fmt`, also the checks' one-line reasons), escaped text, anchors, markdown rendered
with raw HTML off, PNG figures as data URIs, and tables of rows. Nothing here knows about claims,
stages or manifests: those are the report's."""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any


def fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if v == int(v) and abs(v) < 1e15:
            return f"{int(v):,}"
        return f"{v:.4g}"
    return str(v)


def esc(v: Any) -> str:
    return html.escape(fmt(v))


def anchor(*parts: str) -> str:
    return "-".join("".join(c if c.isalnum() else "_" for c in p) for p in parts)


def markdown_html(text: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table").render(text)


def data_uri(path: Path) -> str | None:
    try:
        return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()
    except OSError:
        return None


def table_html(rows: list[dict], total: int | None = None, cls: str = "data") -> str:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{esc(r.get(c, ''))}</td>" for c in cols) + "</tr>" for r in rows)
    more = (
        f'<p class="more">first {len(rows)} of {total} rows (all in the MLflow run\'s tables/)</p>'
        if total and total > len(rows)
        else ""
    )
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}'


def figures_html(v: dict[str, Any], limit: int = 12) -> str:
    items = list(v.items())
    shown = "; ".join(f"{html.escape(k)} {esc(x)}" for k, x in items[:limit])
    return shown + (f"; … {len(items) - limit} more" if len(items) > limit else "")
