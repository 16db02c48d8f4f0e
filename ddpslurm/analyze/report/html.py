"""`analyze --html FILE`: one self-contained HTML page (inline CSS and SVG, no script, no network).

The page shows the verdict, a per-node timeline of each rank's first failure (coloured by role, the
culprit's own lines highlighted, Slurm's job events as vertical rules, the evidence line on hover),
the evidence with `file:line` and the rank table. Every string that came from a log, a file name or a
host is sanitized and HTML-escaped, and a Content-Security-Policy forbids scripts and fetches anyway.
"""

from __future__ import annotations

import datetime as dt
import html
import math
from collections.abc import Iterable
from pathlib import Path

from ddpslurm import sanitize
from ddpslurm.analyze.model import Diagnosis
from ddpslurm.analyze.report.html_timeline import Event, NodeRow, Run, TimelineModel, build_model
from ddpslurm.analyze.report.text import collapse_rows, evidence_root, one_line
from ddpslurm.errors import AnalyzeInputError

WIDTH, LABEL_W, UNTIMED_W, ROW_H, TOP, BOTTOM = 1100, 250, 60, 22, 40, 14
PLOT_X0, PLOT_X1 = LABEL_W + UNTIMED_W + 14, WIDTH - 16
#: longest log text carried into a tooltip or a table cell (the --json output has the full lines)
MAX_TEXT = 600
MAX_TABLE_ROWS = 500
ROLES = ("culprit", "victim", "ok", "unknown")
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1d2125;max-width:1180px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 6px}
.verdict{border-left:6px solid #c62828;padding:6px 12px;background:#fdf3f3}
.verdict.none{border-color:#8a6d00;background:#fffbe6}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:8px 0} dt{color:#555}
table{border-collapse:collapse;font-size:13px;width:100%} td,th{border-bottom:1px solid #ddd;padding:3px 6px;
text-align:left;vertical-align:top} td.text{font-family:ui-monospace,monospace;word-break:break-all}
code{font-family:ui-monospace,monospace} td.time{white-space:nowrap}
svg{background:#fff;border:1px solid #ddd} svg text{font:11px ui-monospace,monospace;fill:#333}
.band{fill:#f2f2f2} .culprit-row{fill:#fde0e0} .grid{stroke:#e6e6e6} .life{stroke:#b0b7bf;stroke-width:2}
.mark{stroke:#222;stroke-width:.6} .untimed{fill-opacity:.35;stroke-dasharray:2 1}
.role-culprit{fill:#d32f2f} .role-victim{fill:#f39c12} .role-ok{fill:#2e7d32} .role-unknown{fill:#9e9e9e}
#culprit{stroke:#000;stroke-width:2} .culprit-event{fill:#7b1fa2;stroke:#fff;stroke-width:.8}
.job-event{stroke:#1565c0;stroke-width:2;stroke-dasharray:5 3} .legend span{margin-right:14px}
.swatch{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px;border:1px solid #444}
.note{color:#555}
"""


def esc(text: object, limit: int = MAX_TEXT) -> str:
    """Any text from a log or a path as inert HTML: sanitized to one line, cropped, escaped."""
    value = sanitize.terminal(text)
    if len(value) > limit:
        value = value[: limit - 1] + "…"
    return html.escape(value, quote=True)


def clock(seconds: float) -> str:
    """Unix seconds as `HH:MM:SS.mmm` UTC."""
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%H:%M:%S.%f")[:-3]


def nice_step(span: float, ticks: int = 6) -> float:
    """A 1/2/5 x 10^k tick step that cuts `span` seconds into about `ticks` parts."""
    raw = max(span, 1e-3) / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


class _Axis:
    """Unix seconds -> x pixels over the model's span."""

    def __init__(self, model: TimelineModel) -> None:
        self.start = model.start or 0.0
        self.span = max((model.end or self.start) - self.start, 1e-3)

    def x(self, seconds: float) -> float:
        return round(PLOT_X0 + (seconds - self.start) / self.span * (PLOT_X1 - PLOT_X0), 1)

    def offset(self, seconds: float) -> str:
        return f"+{seconds - self.start:.3f} s"


def _axis_svg(axis: _Axis, height: int) -> list[str]:
    step = nice_step(axis.span)
    parts = [f'<text x="6" y="{TOP - 10}">+0s = {clock(axis.start)} UTC</text>']
    for i in range(int(axis.span / step) + 1):
        x = axis.x(axis.start + i * step)
        parts.append(f'<line class="grid" x1="{x}" x2="{x}" y1="{TOP - 8}" y2="{height - BOTTOM}"/>'
                     f'<text x="{x}" y="{TOP - 10}" text-anchor="middle">+{i * step:g}s</text>')
    return parts


def _tooltip(run: Run, row: NodeRow, axis: _Axis | None) -> str:
    """Hover text: which ranks, where, role, when, the evidence line's `file:line` and its text."""
    first = run.marks[0]
    times = run.times
    when = f"{clock(min(times))} UTC ({axis.offset(min(times))})" if times and axis else "no time"
    count = f" ({len(run.marks)} ranks)" if len(run.marks) > 1 else ""
    lines = [f"rank {run.ranks}{count} on {row.label}: {run.role}, first failure {when}", first.where,
             first.text or "(no error line)"]
    return "&#10;".join(esc(line, 300) for line in lines if line)


def _mark(run: Run, y: float, axis: _Axis | None, classes: str, culprit: str) -> str:
    """A dot at the failure time (or in the `no time` band), a bar over a run's spread of times."""
    radius = 6 if culprit else 5
    if not run.times or axis is None:
        x = LABEL_W + UNTIMED_W / 2
        return f'<circle class="{classes} untimed"{culprit} cx="{x}" cy="{y}" r="{radius}"/>'
    x0, x1 = axis.x(min(run.times)), axis.x(max(run.times))
    if x1 - x0 < 4 and len(run.marks) == 1:
        return f'<circle class="{classes}"{culprit} cx="{x0}" cy="{y}" r="{radius}"/>'
    return f'<rect class="{classes}"{culprit} x="{x0 - 2}" y="{y - 5}" width="{x1 - x0 + 4}" height="10" rx="3"/>'


def _run_svg(run: Run, row: NodeRow, y: float, axis: _Axis | None) -> str:
    culprit = ' id="culprit"' if run.role == "culprit" else ""
    classes = f"mark role-{run.role if run.role in ROLES else 'unknown'}"
    life = ""
    if run.last_time is not None and axis is not None:
        life = f'<line class="life" x1="{PLOT_X0}" x2="{axis.x(run.last_time)}" y1="{y}" y2="{y}"/>'
    return (f'<g class="run" data-ranks="{esc(run.ranks)}">{life}{_mark(run, y, axis, classes, culprit)}'
            f"<title>{_tooltip(run, row, axis)}</title></g>")


def _row_svg(row: NodeRow, index: int, axis: _Axis | None) -> str:
    top = TOP + index * ROW_H
    y = top + ROW_H / 2
    band = "culprit-row" if row.has_culprit else ("band" if index % 2 else "")
    background = f'<rect class="{band}" x="0" y="{top}" width="{WIDTH}" height="{ROW_H}"/>' if band else ""
    ranks = sorted(m.rank for run in row.runs for m in run.marks)
    span = f"r{ranks[0]}" if len(ranks) == 1 else f"r{ranks[0]}-{ranks[-1]}"
    full = f"{row.label}: {len(row.hosts)} node(s), ranks {span[1:]}"
    label = f'<text x="6" y="{y + 4}">{esc(row.label, 30)} {span}<title>{esc(full, 300)}</title></text>'
    runs = "".join(_run_svg(run, row, y, axis) for run in row.runs)
    return (f'<g class="node" data-hosts="{len(row.hosts)}" data-host="{esc(row.hosts[0], 200)}">'
            f'{background}{label}{runs}</g>')


def _events_svg(events: Iterable[Event], axis: _Axis, y0: float, y1: float, css: str) -> list[str]:
    parts = []
    for event in events:
        x = axis.x(event.time)
        title = esc(f"{clock(event.time)} UTC ({axis.offset(event.time)}) {event.where}", 300) + "&#10;" + \
            esc(event.text)
        if css == "job-event":
            parts.append(f'<g class="{css}-g"><line class="{css}" x1="{x}" x2="{x}" y1="{y0}" y2="{y1}"/>'
                         f'<title>{title}</title></g>')
        else:
            parts.append(f'<path class="{css}" d="M{x - 5} {y0 - 11}h10l-5 6z"><title>{title}</title></path>')
    return parts


def timeline_svg(model: TimelineModel) -> str:
    """The SVG: one `g.node` per row, one `g.run` per run of alike ranks, `#culprit` on the culprit's mark."""
    height = TOP + len(model.rows) * ROW_H + BOTTOM
    axis = _Axis(model) if model.timed else None
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="per-rank failure timeline">',
             f'<text x="{LABEL_W + UNTIMED_W / 2}" y="{TOP - 10}" text-anchor="middle">no time</text>',
             f'<line class="grid" x1="{PLOT_X0 - 9}" x2="{PLOT_X0 - 9}" y1="{TOP - 8}" y2="{height - BOTTOM}"/>']
    if axis:
        parts += _axis_svg(axis, height)
    parts += [_row_svg(row, i, axis) for i, row in enumerate(model.rows)]
    if axis:
        culprit_row = next((i for i, row in enumerate(model.rows) if row.has_culprit), None)
        if culprit_row is not None:
            parts += _events_svg(model.culprit_events, axis, TOP + culprit_row * ROW_H + ROW_H / 2, 0,
                                 "culprit-event")
        parts += _events_svg(model.job_events, axis, TOP - 8, height - BOTTOM, "job-event")
    parts.append("</svg>")
    return "".join(parts)


def _legend(model: TimelineModel) -> str:
    spans = [f'<span><i class="swatch" style="background:{c}"></i>{r}</span>' for r, c in
             (("culprit", "#d32f2f"), ("victim", "#f39c12"), ("ok", "#2e7d32"), ("unknown", "#9e9e9e"))]
    spans += ['<span><i class="swatch" style="background:#7b1fa2"></i>culprit\'s own lines</span>',
              '<span><i class="swatch" style="background:#1565c0"></i>Slurm job event</span>']
    note = "" if model.timed else ('<p class="note">These logs carry no timestamps: the marks say who failed, '
                                   'not when.</p>')
    return (f'<p class="legend">{"".join(spans)}</p><p class="note">Time runs left to right; a grey line is a '
            f'rank\'s last sign of life; hover a mark for its evidence line.</p>{note}')


def _verdict(d: Diagnosis) -> str:
    rank = "none (no single rank)" if d.first_failing_rank is None else str(d.first_failing_rank)
    css = "verdict none" if d.first_failing_rank is None else "verdict"
    excluded = ", ".join(esc(n, 200) for n in d.exclude_nodes) or "none"
    advice = "".join(f"<li>{esc(a)}</li>" for a in d.advice)
    return (f'<section class="{css}" id="verdict"><h1>Cause: <code id="cause">{esc(d.cause)}</code></h1>'
            f'<p id="summary">{esc(d.summary)}</p><dl>'
            f'<dt>First failing rank</dt><dd id="first-failing-rank">{esc(rank)}</dd>'
            f'<dt>Host</dt><dd id="first-failing-host">{esc(d.first_failing_host or "unknown")}</dd>'
            f'<dt>Confidence</dt><dd>{esc(d.confidence)}</dd><dt>Retry</dt><dd id="retry">{esc(d.retry)}</dd>'
            f'<dt>Exclude nodes</dt><dd id="exclude-nodes">{excluded}</dd></dl>'
            f'{"<h2>Advice</h2><ul>" + advice + "</ul>" if advice else ""}</section>')


def _short(path: str, root: str) -> str:
    return path[len(root) + 1:] if root and path.startswith(root + "/") else path


def _evidence_table(d: Diagnosis) -> str:
    root = evidence_root([e.file for e in d.evidence])
    rows = [f'<tr><td><code>{esc(_short(e.file, root), 300)}:{e.line}</code></td>'
            f'<td>{"" if e.rank is None else e.rank}</td>'
            f'<td class="time">{esc(e.time or "")}</td><td class="text">{esc(one_line(e.text))}</td></tr>'
            for e in d.evidence[:MAX_TABLE_ROWS]]
    more = len(d.evidence) - MAX_TABLE_ROWS
    tail = f'<p class="note">{more} more lines: see `--json`.</p>' if more > 0 else ""
    under = f' <span class="note">(under <code>{esc(root, 300)}</code>)</span>' if root else ""
    return (f'<h2>Evidence{under}</h2><table id="evidence"><tr><th>file:line</th><th>rank</th><th>time</th>'
            f'<th>line</th></tr>{"".join(rows)}</table>{tail}')


def _rank_table(d: Diagnosis) -> str:
    collapsed = collapse_rows(d.ranks)
    rows = [f'<tr class="role-row-{esc(row.role)}"><td>{esc(label)}</td><td>{esc(row.host or "-")}</td>'
            f'<td>{esc(row.role)}{f" (x{count})" if count > 1 else ""}</td>'
            f'<td class="text">{esc(one_line(row.first_error))}</td></tr>'
            for label, row, count in collapsed[:MAX_TABLE_ROWS]]
    more = len(collapsed) - MAX_TABLE_ROWS
    tail = f'<p class="note">{more} more rows: see `--json`.</p>' if more > 0 else ""
    return ('<h2>Ranks</h2><table id="ranks"><tr><th>rank</th><th>host (first)</th><th>role</th>'
            f'<th>first error</th></tr>{"".join(rows)}</table>{tail}')


def render_html(diagnosis: Diagnosis) -> str:
    """The whole report as one HTML document."""
    model = build_model(diagnosis)
    notes = "".join(f"<li>{esc(n)}</li>" for n in diagnosis.notes)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>ddpslurm: {esc(diagnosis.cause)}</title><style>{STYLE}</style></head><body>"
            f"{_verdict(diagnosis)}<h2>Timeline</h2>{_legend(model)}{timeline_svg(model)}"
            f"{_evidence_table(diagnosis)}{_rank_table(diagnosis)}"
            f"{'<h2>Notes</h2><ul>' + notes + '</ul>' if notes else ''}</body></html>\n")


def write_html(diagnosis: Diagnosis, path: str | Path) -> None:
    """Write the report to `path`; a folder that is missing or not writable is a clear error."""
    try:
        Path(path).write_text(render_html(diagnosis), encoding="utf-8")
    except OSError as failed:
        raise AnalyzeInputError(f"cannot write the HTML report {str(path)!r}: {failed.strerror or failed}",
                                "give --html a file in an existing folder you can write") from None
