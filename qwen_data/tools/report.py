"""The HTML report of a prefix or a blend: one file that works offline (inline CSS, the histogram as
an inline PNG, no script), written by `qwen-data stats --html` and `qwen-data inspect --html`.

It holds what `stats` prints, the sample-length histogram, decoded samples with their trained
tokens highlighted (`show.html_row`), and the manifests the data was made with.
"""

from __future__ import annotations

import base64
import html
import io
import json
import time

from .. import __version__
from ..blend.weights import Budget
from ..formats.manifest import Manifest
from ..formats.outputs import atomic_file
from .inspect import Inspector, html_row
from .stats import BlendStats, PrefixStats, blend_stats, histogram_png, is_blend, prefix_stats

ROWS_SHOWN = 3  # rows in a report when none are asked for
TRAINED_BACKGROUND = "#b6f2b0"  # the highlight of trained tokens (the screenshot test looks for it)

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1180px; color: #1d232a; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 26px 0 8px; border-bottom: 1px solid #d8dee4; }
h3 { font-size: 14px; margin: 14px 0 6px; } .sub { color: #57606a; margin: 0 0 12px; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
td, th { padding: 3px 10px; border-bottom: 1px solid #eaeef2; text-align: right; } td:first-child, th:first-child { text-align: left; }
.stats { display: flex; gap: 24px; align-items: flex-start; flex-wrap: wrap; } img { max-width: 640px; }
pre { white-space: pre-wrap; word-break: break-word; font: 13px/1.5 ui-monospace, monospace; margin: 0;
      padding: 8px 10px; background: #f6f8fa; border-radius: 4px; }
.sample { margin: 0 0 10px; } .bound { font-size: 12px; color: #57606a; border-top: 2px dashed #8c959f; padding: 2px 0; }
.t { background: %s; } .nl { color: #2c7a2c; }
.add { color: #0550ae; } .eod { color: #fff; background: #8250df; border-radius: 3px; padding: 0 2px; }
.pad { color: #6e7781; background: #eaeef2; border-radius: 3px; padding: 0 2px; }
.legend span { margin-right: 14px; padding: 1px 4px; } details pre { max-height: 420px; overflow: auto; }
""" % TRAINED_BACKGROUND


def write_report(target: str, output: str, rows: list[int] | None = None, budget: Budget | None = None) -> None:
    """The report of `target` (a prefix, or a blend file) at `output`; `rows`: the rows shown."""
    body = _blend(target, budget) if is_blend(target) else _prefix(target, rows)
    page = (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>qwen-data: '
            f'{html.escape(target)}</title><style>{CSS}</style></head><body>\n<h1>qwen-data report: '
            f'{html.escape(target)}</h1>\n<p class="sub">made {time.strftime("%Y-%m-%d %H:%M")} by qwen-data '
            f'{__version__}</p>\n{body}\n</body></html>\n')
    with atomic_file(output) as f:
        f.write(page)


def _prefix(prefix: str, rows: list[int] | None) -> str:
    stats = prefix_stats(prefix)
    inspector = Inspector(stats.prefix)
    shown = rows if rows is not None else list(range(min(ROWS_SHOWN, len(inspector))))
    return "\n".join([
        f"<h2>Statistics</h2>{_stats_block(stats)}",
        f"<h2>Samples</h2>{_samples(inspector, shown)}",
        f"<h2>Manifest</h2>{_manifest(inspector.manifest)}",
    ])


def _blend(path: str, budget: Budget | None) -> str:
    b = blend_stats(path, budget)
    parts = [f"<h2>Blend</h2>{_blend_table(b)}"]
    for _, _, stats in b.sources:
        inspector = Inspector(stats.prefix)
        parts += [f"<h2>{html.escape(stats.prefix)}</h2>{_stats_block(stats)}",
                  f"<h3>First row</h3>{_samples(inspector, [0])}", _manifest(inspector.manifest)]
    return "\n".join(parts)


def _table(header: list[str] | None, rows: list[list]) -> str:
    head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def _stats_block(s: PrefixStats) -> str:
    rows = [["kind", s.kind if s.kind == "pretrain" else f"sft ({s.template}, {s.layout} layout)"],
            ["documents", f"{s.documents:,}"], ["samples", f"{s.samples:,}"], ["tokens", f"{s.tokens:,}"],
            ["trained tokens", f"{s.trained:,} ({s.trained_share:.1%})"]]
    if s.rows is not None:
        rows += [["packed rows", f"{s.rows:,} of {s.seq_length}"], ["fill", f"{s.fill:.2%}"],
                 ["pad tokens", f"{s.pad_tokens:,}"]]
    if s.percentiles:
        rows += [["length " + " / ".join(f"p{p}" for p in s.percentiles), " / ".join(f"{v:,}" for v in
                                                                              s.percentiles.values())],
                 ["mean length", f"{s.mean_length:,.1f}"]]
    reasons = s.rejects.get("by_reason") or {}
    rows.append(["rejected records", f"{s.rejects.get('count', 0):,}"])
    rows += [[f"  rejected: {reason}", f"{n:,}"] for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
    png = io.BytesIO()
    histogram_png([s], png)
    image = base64.b64encode(png.getvalue()).decode()
    return (f'<div class="stats">{_table(None, rows)}<img alt="sample lengths of {html.escape(s.prefix)}" '
            f'src="data:image/png;base64,{image}"></div>')


def _blend_table(b: BlendStats) -> str:
    # As `stats` prints it: the share each weight draws of tokens and of trained tokens, beside the
    # share the blend asked for in its ratio unit.
    rows = [[s.prefix, f"{w:.4f}", "-" if asked is None else f"{asked:.2%}", f"{share:.2%}", f"{trained:.2%}",
             f"{s.tokens:,}", f"{s.samples:,}", f"{s.trained_share:.1%}"]
            for (w, share, s), trained, asked in zip(b.sources, b.trained_shares, b.asked)]
    asked = f"asked ({b.ratio_unit})" if b.ratio_unit else "asked"
    out = _table(["source", "Megatron weight", asked, "share of tokens", "share of trained tokens", "tokens",
                  "samples", "trained"], rows)
    if b.split:
        out += f"<p>split {html.escape(b.split)}</p>"
    for name, prefixes in b.other_splits.items():
        out += f"<p>{name}: {html.escape(' '.join(prefixes))}</p>"
    if b.budget:
        out += "<h3>Budget</h3>" + _table(["source", "tokens used", "epochs"],
                                           [[r.prefix, f"{r.tokens:,.0f}", f"{r.epochs:.3f}"] for r in b.budget])
    return out


def _samples(inspector: Inspector, rows: list[int]) -> str:
    legend = ('<p class="legend"><span class="t">trained</span><span class="add">&lt;|added token|&gt;</span>'
              '<span class="eod">end of document</span><span class="pad">pad</span></p>')
    return legend + "".join(html_row(inspector, i) for i in rows)


def _manifest(m: Manifest) -> str:
    text = json.dumps(m.to_json(), indent=2, ensure_ascii=False)
    return f"<details><summary>manifest</summary><pre>{html.escape(text, quote=False)}</pre></details>"
