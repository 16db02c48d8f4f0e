"""`analyze --html FILE`: one self-contained HTML page (inline CSS and SVG, no script, no network).

The page shows the verdict, a per-node timeline of each rank's first failure where it happened (coloured by role,
the culprit's mark ringed and named with a rule through every row, its own lines highlighted, host events as
diamonds, Slurm's job events as vertical rules, breaks over long idle spans, the evidence line on hover; 660 units
wide, it fits a 700 px window), the evidence with `file:line` and the rank table. Every string that came from a log,
a file name or a host is sanitized and HTML-escaped, and a Content-Security-Policy forbids scripts and fetches.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Iterable
from pathlib import Path

from ddpslurm import sanitize
from ddpslurm.analyze.model import Diagnosis
from ddpslurm.analyze.report.html_axis import Axis, human
from ddpslurm.analyze.report.html_timeline import Event, NodeRow, Run, TimelineModel, build_model
from ddpslurm.analyze.report.text import collapse_rows, evidence_root, one_line
from ddpslurm.errors import AnalyzeInputError

#: the SVG's own units: it is drawn 660 wide and scales with the page (from a 700 px window up to MAX_SVG_PX)
WIDTH, LABEL_W, UNTIMED_W, ROW_H, STRIP_H, TOP, BOTTOM = 660, 118, 70, 22, 20, 62, 14
PLOT_X0, PLOT_X1 = LABEL_W + UNTIMED_W + 10, WIDTH - 14
MAX_SVG_PX = 920
#: longest log text carried into a tooltip or a table cell (the --json output has the full lines)
MAX_TEXT = 600
MAX_TABLE_ROWS = 500
ROLES = ("culprit", "victim", "ok", "unknown")
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
COLOURS = {"culprit": "#d32f2f", "victim": "#f39c12", "ok": "#2e7d32", "unknown": "#9e9e9e", "own": "#7b1fa2",
           "host": "#263238", "slurm": "#1565c0"}

STYLE = f"""
body{{font:14px/1.45 system-ui,sans-serif;margin:16px;color:#1d2125;max-width:1180px}}
h1{{font-size:20px;margin:0 0 4px}} h2{{font-size:16px;margin:22px 0 6px}}
.verdict{{border-left:6px solid #c62828;padding:6px 12px;background:#fdf3f3}}
.verdict.none{{border-color:#8a6d00;background:#fffbe6}}
dl{{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:8px 0}} dt{{color:#555}}
table{{border-collapse:collapse;font-size:13px;width:100%}} td,th{{border-bottom:1px solid #ddd;padding:3px 6px;
text-align:left;vertical-align:top}} td.text,td code{{font-family:ui-monospace,monospace;word-break:break-all}}
code{{font-family:ui-monospace,monospace;overflow-wrap:anywhere}} td.time{{white-space:nowrap}}
@media (max-width:760px){{td.time{{white-space:normal;word-break:break-all}} body{{margin:10px}}}}
svg.timeline{{display:block;width:100%;max-width:{MAX_SVG_PX}px;height:auto;background:#fff;border:1px solid #ddd}}
svg text{{font:11px ui-monospace,monospace;fill:#333}}
.band{{fill:#f2f2f2}} .culprit-row{{fill:#fde0e0}} .strip{{fill:#f5f7fa}} .grid{{stroke:#e6e6e6}}
.life{{stroke:#b0b7bf;stroke-width:2}} .mark{{stroke:#222;stroke-width:.6}} .estimated{{stroke-dasharray:2 1.5}}
.untimed{{fill-opacity:.45;stroke-dasharray:2 1}}
.role-culprit{{fill:{COLOURS["culprit"]}}} .role-victim{{fill:{COLOURS["victim"]}}} .role-ok{{fill:{COLOURS["ok"]}}}
.role-unknown{{fill:{COLOURS["unknown"]}}}
#culprit{{stroke:#000;stroke-width:2.5;fill-opacity:1;stroke-dasharray:none}}
.culprit-guide{{stroke:{COLOURS["culprit"]};stroke-width:1.5;stroke-dasharray:4 3}}
text.culprit-label{{font-weight:bold;fill:#b71c1c;paint-order:stroke;stroke:#fff;stroke-width:3px}}
.culprit-event{{fill:{COLOURS["own"]};stroke:#fff;stroke-width:.8}}
.host-event{{fill:{COLOURS["host"]};stroke:#fff;stroke-width:.8}}
.job-event{{stroke:{COLOURS["slurm"]};stroke-width:2;stroke-dasharray:5 3}}
.axis-break path{{stroke:#888;fill:none}} text.break-label{{fill:#666}}
.legend span{{margin-right:14px;white-space:nowrap}}
.swatch{{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px;border:1px solid #444}}
.note{{color:#555}}
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


def _axis_svg(axis: Axis, height: int) -> list[str]:
    """The origin, the ticks in human units, a grid line per tick, and each break with its idle time."""
    parts = [f'<text x="6" y="14">+0 = {clock(axis.origin)} UTC</text>']
    for x, label in axis.ticks():
        parts.append(f'<line class="grid" x1="{x}" x2="{x}" y1="{TOP - STRIP_H - 4}" y2="{height - BOTTOM}"/>'
                     f'<text class="tick" x="{x}" y="{TOP - STRIP_H - 8}" text-anchor="middle">{esc(label)}</text>')
    for x, idle in axis.breaks():
        y0, y1 = TOP - STRIP_H - 4, height - BOTTOM
        parts.append(f'<g class="axis-break" data-idle="{idle:.3f}"><path d="M{x - 6} {y0}l4 {y1 - y0}M{x + 2} {y0}'
                     f'l4 {y1 - y0}"/><text class="break-label" x="{x}" y="14" text-anchor="middle">'
                     f'{esc(human(idle, 1 if idle >= 1 else 0.001))}</text>'
                     f'<title>{esc(human(idle, 0.001))} with nothing logged, cut out</title></g>')
    return parts


def _tooltip(run: Run, row: NodeRow, axis: Axis | None) -> str:
    """Hover text: which ranks, where, role, when (and how it was read), the evidence line's `file:line` and text."""
    first = run.marks[0]
    times = run.times
    when = f"{clock(min(times))} UTC ({axis.offset(min(times))})" if times and axis else "no time"
    count = f" ({len(run.marks)} ranks)" if len(run.marks) > 1 else ""
    lines = [f"rank {run.ranks}{count} on {row.label}: {run.role}, first failure {when}",
             first.placed if times else "", first.where, first.text or "(no error line)"]
    return "&#10;".join(esc(line, 300) for line in lines if line)


def _mark(run: Run, y: float, axis: Axis | None, classes: str, culprit: bool) -> str:
    """A dot at the failure time (or in the `no time` band), a bar over a run's spread of times; the culprit's
    a big ringed dot with its rank written beside it."""
    radius = 8 if culprit else 5
    ident = ' id="culprit"' if culprit else ""
    if not run.times or axis is None:
        x = LABEL_W + (12 if culprit else UNTIMED_W / 2)  # the culprit's rank written beside it, in the band
        classes += " untimed"
    else:
        x0, x1 = axis.x(min(run.times)), axis.x(max(run.times))
        if run.marks[0].placed:
            classes += " estimated"
        if not culprit and (x1 - x0 >= 4 or len(run.marks) > 1):
            return (f'<rect class="{classes}" data-time="{min(run.times):.3f}" x="{x0 - 2}" y="{y - 5}" '
                    f'width="{max(x1 - x0 + 4, 10):.1f}" height="10" rx="3"/>')
        x = x0
    when = f' data-time="{min(run.times):.3f}"' if run.times and axis is not None else ""
    shape = f'<circle class="{classes}"{ident}{when} cx="{x}" cy="{y}" r="{radius}"/>'
    if not culprit:
        return shape
    label = f"rank {run.ranks}"
    anchor = "end" if x > PLOT_X1 - 90 else "start"
    dx = -12 if anchor == "end" else 12
    return shape + (f'<text class="culprit-label" x="{x + dx}" y="{y + 4}" text-anchor="{anchor}">'
                    f'{esc(label)}</text>')


def _life_svg(run: Run, y: float, axis: Axis | None) -> str:
    """A run's last sign of life: a grey line from the axis' start."""
    if run.last_time is None or axis is None:
        return ""
    return f'<line class="life" x1="{PLOT_X0}" x2="{axis.x(run.last_time)}" y1="{y}" y2="{y}"/>'


def _run_svg(run: Run, row: NodeRow, y: float, axis: Axis | None) -> str:
    culprit = run.role == "culprit"
    classes = f"mark role-{run.role if run.role in ROLES else 'unknown'}"
    return (f'<g class="run" data-ranks="{esc(run.ranks)}" data-role="{esc(run.role)}">'
            f'{_mark(run, y, axis, classes, culprit)}<title>{_tooltip(run, row, axis)}</title></g>')


def _row_svg(row: NodeRow, index: int, axis: Axis | None) -> str:
    top = TOP + index * ROW_H
    y = top + ROW_H / 2
    band = "culprit-row" if row.has_culprit else ("band" if index % 2 else "")
    background = f'<rect class="{band}" x="0" y="{top}" width="{WIDTH}" height="{ROW_H}"/>' if band else ""
    ranks = sorted(m.rank for run in row.runs for m in run.marks)
    span = f"r{ranks[0]}" if len(ranks) == 1 else f"r{ranks[0]}-{ranks[-1]}"
    full = f"{row.label}: {len(row.hosts)} node(s), ranks {span[1:]}"
    short = row.label if len(row.label) + len(span) < 18 else row.label[: max(4, 16 - len(span))] + "…"
    label = f'<text x="6" y="{y + 4}">{esc(short, 30)} {span}<title>{esc(full, 300)}</title></text>'
    runs = sorted(row.runs, key=lambda run: run.role == "culprit")  # the culprit's mark drawn last, on top
    lives = "".join(_life_svg(run, y, axis) for run in runs)  # under every mark of the row
    body = "".join(_run_svg(run, row, y, axis) for run in runs)
    return (f'<g class="node" data-hosts="{len(row.hosts)}" data-host="{esc(row.hosts[0], 200)}">'
            f'{background}{label}{lives}{body}</g>')


def _title(time: float, axis: Axis, where: str, text: str) -> str:
    return esc(f"{clock(time)} UTC ({axis.offset(time)}) {where}", 300) + "&#10;" + esc(text)


def _events_svg(events: Iterable[Event], axis: Axis, y0: float, y1: float, css: str) -> list[str]:
    parts = []
    for event in events:
        x, title = axis.x(event.time), _title(event.time, axis, event.where, event.text)
        if css == "job-event":
            parts.append(f'<g class="{css}-g" data-time="{event.time:.3f}"><line class="{css}" x1="{x}" x2="{x}" '
                         f'y1="{y0}" y2="{y1}"/><title>{title}</title></g>')
        else:
            parts.append(f'<path class="{css}" d="M{x - 5} {y0 - 11}h10l-5 6z"><title>{title}</title></path>')
    return parts


def _host_row(model: TimelineModel, host: str | None) -> int | None:
    """The row of the node a host event came from (by name, or its short name), None when no row has it."""
    if not host:
        return None
    short = host.split(".", 1)[0]
    return next((i for i, row in enumerate(model.rows)
                 if any(h == host or h.split(".", 1)[0] == short for h in row.hosts)), None)


def _hosts_svg(model: TimelineModel, axis: Axis) -> list[str]:
    """Each host event as a diamond on its node's row, or on the strip above the rows when no row is its node's."""
    parts = []
    for event in model.host_events:
        row = _host_row(model, event.host)
        y = TOP - STRIP_H / 2 if row is None else TOP + row * ROW_H + ROW_H / 2
        x = axis.x(event.time)
        parts.append(f'<path class="host-event kind-{esc(event.kind)}" data-time="{event.time:.3f}" '
                     f'data-host="{esc(event.host or "", 200)}" d="M{x} {y - 7}l6 7l-6 7l-6 -7z">'
                     f'<title>{esc(event.host or "a host")}: {_title(event.time, axis, event.where, event.text)}'
                     f'</title></path>')
    return parts


def _culprit_guide(model: TimelineModel, axis: Axis, height: int) -> list[str]:
    """A dashed red rule through every row at the culprit's first failure: what failed after it, and before."""
    for row in model.rows:
        for run in row.runs:
            if run.role == "culprit" and run.times:
                x = axis.x(min(run.times))
                return [f'<line class="culprit-guide" x1="{x}" x2="{x}" y1="{TOP - STRIP_H}" '
                        f'y2="{height - BOTTOM}"/>']
    return []


def timeline_svg(model: TimelineModel) -> str:
    """The SVG: one `g.node` per row, one `g.run` per run of alike ranks, `#culprit` on the culprit's mark, host
    events (`.host-event`), Slurm's job events (`.job-event`) and the axis' breaks (`.axis-break`)."""
    height = TOP + len(model.rows) * ROW_H + BOTTOM
    axis = Axis(model.times, PLOT_X0, PLOT_X1) if model.timed else None
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="per-rank failure timeline">',
             f'<rect class="strip" x="0" y="{TOP - STRIP_H}" width="{WIDTH}" height="{STRIP_H}"/>',
             f'<text x="6" y="{TOP - 6}">hosts, Slurm</text>',
             f'<text x="{LABEL_W + UNTIMED_W / 2}" y="{TOP - STRIP_H - 8}" text-anchor="middle">no time</text>',
             f'<line class="grid" x1="{PLOT_X0 - 5}" x2="{PLOT_X0 - 5}" y1="{TOP - STRIP_H - 4}" '
             f'y2="{height - BOTTOM}"/>']
    if axis:
        parts += _axis_svg(axis, height)
        parts += _culprit_guide(model, axis, height)
    parts += [_row_svg(row, i, axis) for i, row in enumerate(model.rows)]
    if axis:
        culprit_row = next((i for i, row in enumerate(model.rows) if row.has_culprit), None)
        if culprit_row is not None:
            parts += _events_svg(model.culprit_events, axis, TOP + culprit_row * ROW_H + ROW_H / 2, 0,
                                 "culprit-event")
        parts += _events_svg(model.job_events, axis, TOP - STRIP_H, height - BOTTOM, "job-event")
        parts += _hosts_svg(model, axis)
    parts.append("</svg>")
    return "".join(parts)


def _legend(model: TimelineModel) -> str:
    names = (("culprit", "culprit"), ("victim", "victim"), ("ok", "ok"), ("unknown", "unknown"),
             ("own", "culprit's own lines"), ("host", "host event (GPU, OOM killer, slurmstepd)"),
             ("slurm", "Slurm job event"))
    spans = [f'<span><i class="swatch" style="background:{COLOURS[key]}"></i>{name}</span>' for key, name in names]
    note = "" if model.timed else ('<p class="note">These logs carry no timestamps: the marks say who failed, '
                                   'not when.</p>')
    return (f'<p class="legend">{"".join(spans)}</p><p class="note">Each rank\'s first failure, where it happened; '
            f'a grey line is a rank\'s last sign of life; a dashed outline is a time read off the lines around a '
            f'line that has none; zigzags cut out long spans with nothing logged. Hover a mark for its evidence '
            f'line.</p>{note}')


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
