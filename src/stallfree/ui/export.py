"""``stallfree explain --html FILE``: the explain view as one self-contained file.

The page, its stylesheet and scripts are inlined, and so is the data: the API's explain answer
(:func:`stallfree.ui.explain_view.payload`) for every chunk size of the sweep, each computed by
the same :func:`stallfree.explain.backends.run_explain` as ``stallfree explain --chunk-tokens C``.
The page's chunk slider steps through them; nothing is fetched, no server is needed.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from stallfree.explain.options import SEED, ExplainOptions
from stallfree.ui.api import static_text
from stallfree.ui.explain_view import payload


def _script(text: str) -> str:
    # "</" inside a script element would end it early; "<\/" means the same to JavaScript and JSON.
    return text.replace("</", "<\\/")


def render_html(options: ExplainOptions) -> str:
    """The page for ``options`` (roofline engine: the sweep is precomputed, one view a chunk)."""
    from stallfree.explain import DEFAULT_SWEEP

    chosen = options.chunk_tokens or SEED.chunk_tokens
    chunks = sorted({*(options.sweep or DEFAULT_SWEEP), chosen})
    views = [payload(replace(options, chunk_tokens=chunk)) for chunk in chunks]
    data = {"chunks": chunks, "index": chunks.index(chosen), "views": views}
    page = static_text("index.html")
    pieces = {
        '<link rel="stylesheet" href="static/style.css">': f"<style>\n{static_text('style.css')}</style>",
        '<script src="static/charts.js"></script>': f"<script>\n{_script(static_text('charts.js'))}</script>",
        '<script src="static/app.js"></script>': (
            '<script type="application/json" id="stallfree-data">'
            f"{_script(json.dumps(data, separators=(',', ':'), allow_nan=False))}</script>\n"
            f"<script>\n{_script(static_text('app.js'))}</script>"
        ),
    }
    for tag, inline in pieces.items():
        if page.count(tag) != 1:
            raise RuntimeError(f"index.html should hold {tag!r} exactly once")
        page = page.replace(tag, inline)
    return page


def write_html(options: ExplainOptions, path: str | Path) -> Path:
    """Write :func:`render_html` to ``path`` (parent folders created); return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_html(options), encoding="utf-8")
    return target
