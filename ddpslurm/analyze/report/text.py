"""Render a Diagnosis: rich terminal text, Markdown for a support ticket, JSON. Log text is never markup."""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from ddpslurm import sanitize
from ddpslurm.analyze.model import NO_FAILURE, Diagnosis, Evidence, RankRow

#: `[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553]` -> `[pair.cc:553]`
_SOURCE_PATH = re.compile(r"\[(?:[^\]\s]*/)?([^/\]\s]+\.(?:cc|cpp|cu|c|h|hpp|py):\d+)\]")
#: a glog header (`[E217 07:43:09.310000653 ProcessGroupNCCL.cpp:629] `): its time is shown apart
_GLOG_HEADER = re.compile(r"^\[?[IWEF]\d{3,4} \d\d:\d\d:\d\d\.\d+(?: +\d+)? [\w./-]+:\d+\]\s*")
MAX_ROWS = 40


def safe(text: str | None) -> str:
    """Log text as one terminal-safe line (ddpslurm.sanitize: no escape, no control, no line break)."""
    return sanitize.terminal(text)


def one_line(text: str | None) -> str:
    """Log text for a one-line display: safe, whitespace collapsed, build-tree paths cut to the file name."""
    return " ".join(_GLOG_HEADER.sub("", _SOURCE_PATH.sub(r"[\1]", safe(text).strip())).split())


def evidence_root(files: Sequence[str]) -> str:
    """The folder all evidence files are under ('' when they share none), so rows can show short paths."""
    folders = [os.path.dirname(f) for f in files if f]
    if not folders:
        return ""
    try:
        root = os.path.commonpath(folders)
    except ValueError:  # absolute and relative paths mixed
        return ""
    return "" if root in ("", os.sep) else root


class Piece(NamedTuple):
    """One piece of evidence as the reports show it: its first copy, a time (the first copy's, else a copy's), the
    script's frame that raised it, and where its other copies are (`file:line`)."""

    evidence: Evidence
    time: str | None
    frame: str | None
    also: tuple[str, ...]


def pieces(evidence: Sequence[Evidence]) -> list[Piece]:
    """The evidence lines, each piece once: lines of one rank with the same text (one exception in the task's .err,
    its exit record and its rank log) are copies of the first."""
    groups: dict[tuple[int | None, str], list[Evidence]] = {}
    for ev in evidence:
        groups.setdefault((ev.rank, one_line(ev.text)), []).append(ev)
    return [Piece(first, next((c.time for c in (first, *copies) if c.time), None),
                  next((f for c in (first, *copies) if (f := getattr(c, "frame", None))), None),
                  tuple(f"{c.file}:{c.line}" for c in copies))
            for first, *copies in groups.values()]


def to_json(diagnosis: Diagnosis) -> str:
    """The `--json` object, one per run."""
    return "".join(json_pieces(diagnosis))


def json_pieces(diagnosis: Diagnosis) -> Iterator[str]:
    """`to_json` in pieces, to write a 65k-rank job's report (23 MB) without holding it whole."""
    return sanitize.json_pieces(diagnosis.to_dict())


def collapse_rows(rows: Iterable[RankRow], max_rows: int = MAX_ROWS) -> list[tuple[str, RankRow, int]]:
    """Runs of consecutive ranks with the same role, host-agnostic error and no culprit are collapsed.

    Returns (rank label, representative row, count); `rank label` is `7` or `8-511`.
    """
    out: list[tuple[str, RankRow, int]] = []
    run: list[RankRow] = []

    def flush() -> None:
        if not run:
            return
        label = str(run[0].rank) if len(run) == 1 else f"{run[0].rank}-{run[-1].rank}"
        out.append((label, run[0], len(run)))
        run.clear()

    for row in rows:
        if run and (row.role == "culprit" or run[0].role == "culprit" or row.role != run[0].role
                    or _shape(row.first_error) != _shape(run[0].first_error) or row.rank != run[-1].rank + 1):
            flush()
        run.append(row)
    flush()
    return out


def _hosts(rows: list[RankRow], label: str, row: RankRow) -> str:
    """The host of a row, or `N hosts` (first..last) for a collapsed run spanning several."""
    if "-" not in label:
        return safe(row.host) or "-"
    lo, hi = (int(x) for x in label.split("-"))
    hosts = [r.host for r in rows if lo <= r.rank <= hi and r.host]
    distinct = list(dict.fromkeys(hosts))
    if len(distinct) <= 1:
        return safe(distinct[0]) if distinct else "-"
    return f"{len(distinct)} hosts ({safe(distinct[0])}..{safe(distinct[-1])})"


def _role(row: RankRow, count: int) -> str:
    """The role of a (collapsed) row: `victim (x11)` for a run of eleven alike ranks."""
    return row.role + (f" (x{count})" if count > 1 else "")


def _shape(text: str | None) -> str:
    """An error message with numbers masked, so that rows differing only in rank/pid/seq collapse."""
    return re.sub(r"\d+", "N", text or "")


def render_text(diagnosis: Diagnosis, console=None, width: int | None = None) -> None:
    """Print the report with rich (to stdout by default): the verdict, its evidence, the ranks, what to do.

    Log text is never cut: on a terminal, or at `width` columns (`--width`, `$COLUMNS`), long lines wrap; anywhere
    else (a pipe, a file) each line is written whole, for grep and for a ticket."""
    from rich.console import Console

    if console is None:
        width = width or _columns()
        console = Console(highlight=False, soft_wrap=False, width=width)
        if width is None and not console.is_terminal:
            console = Console(highlight=False, soft_wrap=True, width=UNBOUNDED)
    _print_verdict(console, diagnosis)
    if diagnosis.evidence:
        _print_evidence(console, diagnosis)
    if diagnosis.ranks:
        _print_ranks(console, diagnosis)
    _print_advice(console, diagnosis)


#: the width of a report nothing bounds (a pipe): wide enough that no line wraps
UNBOUNDED = 1 << 20


def _columns() -> int | None:
    """$COLUMNS, when it is set to a width."""
    value = os.environ.get("COLUMNS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def _wrapped(console, text: str, indent: str, style: str = "") -> None:
    """`text` at `indent`, wrapped to the console's width (nothing is cut); one line where it is unbounded."""
    from rich.text import Text

    if console.width >= UNBOUNDED:
        console.print(Text(indent + text, style=style), soft_wrap=True)
        return
    lines = textwrap.wrap(text, width=max(20, console.width - 1), initial_indent=indent, subsequent_indent=indent
                          + "  ", break_on_hyphens=False) or [indent]
    for line in lines:
        console.print(Text(line, style=style), soft_wrap=True)


def _print_verdict(console, d: Diagnosis) -> None:
    """The cause and its confidence, the first failing rank and host, the summary."""
    from rich.text import Text

    colour = {"high": "green", "medium": "yellow", "low": "red"}.get(d.confidence, "white")
    head = Text()
    head.append("Cause: ", style="bold")
    head.append(safe(d.cause), style={"unknown": "bold", NO_FAILURE: "bold green"}.get(d.cause, "bold red"))
    head.append("   confidence: ")
    head.append(safe(d.confidence), style=colour)
    console.print(head)
    who = Text("First failing rank: ", style="bold")
    who.append(str(d.first_failing_rank) if d.first_failing_rank is not None else "unknown")
    who.append("   host: ", style="bold")
    who.append(safe(d.first_failing_host) or "unknown")
    console.print(who)
    console.print(Text(safe(d.summary)))


def _print_evidence(console, d: Diagnosis) -> None:
    """Each piece of evidence once: where it is (under the files' common folder), its rank and time, its text, the
    frame that raised it, and where its copies are."""
    from rich.text import Text

    root = evidence_root([ev.file for ev in d.evidence])
    console.print(Text("\nEvidence", style="bold underline"))
    if root:
        _wrapped(console, f"in {safe(root)}{os.sep}", "  ", "dim")
    short = (lambda f: os.path.relpath(f, root) if root and f.startswith(root) else f)  # noqa: E731
    for ev, time, frame, also in pieces(d.evidence):
        where = f"{safe(short(ev.file))}:{ev.line}"
        if ev.rank is not None:
            where += f"  rank {ev.rank}"
        if time:
            where += f"  {safe(time)}"
        _wrapped(console, where, "  ", "cyan")
        _wrapped(console, one_line(ev.text), "    ")
        if frame:
            _wrapped(console, f"raised at {safe(frame)}", "    ", "magenta")
        if also:
            _wrapped(console, "also in " + ", ".join(safe(short(a.rsplit(':', 1)[0])) + ":" + a.rsplit(':', 1)[1]
                                                     for a in also), "    ", "dim")


def _print_ranks(console, d: Diagnosis) -> None:
    """The ranks' table, runs of alike ranks collapsed (at most MAX_ROWS rows); rank, host and role are never cut,
    the first error wraps in its cell (on one line where the width is unbounded)."""
    from rich.table import Table
    from rich.text import Text

    console.print(Text("\nRanks", style="bold underline"))
    groups = collapse_rows(d.ranks)
    rows = [(label, _hosts(d.ranks, label, row), _role(row, count), one_line(row.first_error) or "-", row)
            for label, row, count in groups[:MAX_ROWS]]
    names = ("rank", "host", "role")
    widths = [max([len(name)] + [len(r[index]) for r in rows]) for index, name in enumerate(names)]
    longest = max([len("first error")] + [len(r[3]) for r in rows])
    bounded = console.width < UNBOUNDED
    room = max(20, min(longest, console.width - sum(widths) - 13)) if bounded else longest  # borders: 13 cells
    table = Table(show_lines=False)
    for name, width in zip(names, widths, strict=True):
        table.add_column(name, no_wrap=True, width=width, min_width=width)
    table.add_column("first error", no_wrap=not bounded, width=room, overflow="fold")
    for label, hosts, role, error, row in rows:
        style = {"culprit": "bold red", "victim": "yellow", "ok": "green"}.get(row.role, "")
        table.add_row(Text(label), Text(hosts), Text(role, style=style), Text(error))
    if len(groups) > MAX_ROWS:
        table.add_row(Text("..."), Text(""), Text(f"{len(groups) - MAX_ROWS} more groups"), Text(""))
    needed = sum(widths) + room + 13
    if needed > console.width:  # rank, host and role do not fit: the table runs past the width rather than cut them
        from rich.console import Console

        console = Console(file=console.file, width=needed, highlight=False, color_system=console.color_system,
                          force_terminal=console.is_terminal)
    console.print(table, width=needed, crop=False)


def _print_advice(console, d: Diagnosis) -> None:
    """What to do, whether to retry, the nodes to exclude, and the analysis's notes (each once)."""
    from rich.text import Text

    width = min(console.width, 100)
    if d.advice:
        console.print(Text("\nWhat to do", style="bold underline"))
        for item in d.advice:
            console.print(Text(textwrap.fill(safe(item), width=max(40, width - 1), initial_indent="  - ",
                                             subsequent_indent="    ")), soft_wrap=True)
    retry = {"requeue": "yes, resubmitting may succeed", "stop": "no, fix the cause first",
             "unknown": "unknown"}.get(d.retry, d.retry)
    console.print(Text(f"Retry: {safe(retry)}"))
    if d.exclude_nodes:
        console.print(Text(f"Exclude nodes: --exclude={','.join(safe(n) for n in d.exclude_nodes)}"), soft_wrap=True)
    for note in dict.fromkeys(d.notes):
        _wrapped(console, f"note: {safe(note)}", "", "dim")


def _md(text: str | None) -> str:
    return sanitize.markdown(text)


def run_line(run: Mapping[str, Any]) -> str:
    """Which run of a restarted job a diagnosis is of (its `run` field), in a few words. Pure."""
    attempt, restart, final = run.get("attempt"), run.get("restart"), run.get("final_restart")
    if attempt == "all" or attempt is None:
        return "every attempt and in-place restart read together" if restart == "all" else "every file read"
    if restart == "all":
        return f"attempt {attempt}, all its in-place restarts (0 to {final}) read together"
    ended = "the run that ended it" if restart == final else f"the run that ended it is restart {final}"
    return f"attempt {attempt}, restart {restart} ({ended})"


def to_markdown(diagnosis: Diagnosis) -> str:
    """A support-ticket friendly report."""
    d = diagnosis
    rank = d.first_failing_rank if d.first_failing_rank is not None else "unknown"
    out = [f"## ddpslurm analyze: `{sanitize.code_text(d.cause)}` (confidence: {_md(d.confidence)})", "",
           f"**First failing rank:** {rank} on host {_md(d.first_failing_host) or 'unknown'}", "",
           *((f"**Run:** {_md(run_line(d.run))}", "") if d.run else ()),
           _md(d.summary), ""]
    if d.evidence:
        out += ["### Evidence", "", "```"]
        for ev, time, frame, also in pieces(d.evidence):
            who = f" [rank {ev.rank}]" if ev.rank is not None else ""
            when = f" {time}" if time else ""
            out.append(sanitize.code_text(f"{ev.file}:{ev.line}{who}{when}: {one_line(ev.text)}"))
            if frame:
                out.append(sanitize.code_text(f"    raised at {frame}"))
            if also:
                out.append(sanitize.code_text(f"    also in {', '.join(also)}"))
        out += ["```", ""]
    if d.ranks:
        out += ["### Ranks", "", "| rank | host | role | first error |", "|---|---|---|---|"]
        groups = collapse_rows(d.ranks)
        for label, row, count in groups[:MAX_ROWS]:
            role = _role(row, count)
            error = _md(one_line(row.first_error or "-"))
            out.append(f"| {label} | {_md(_hosts(d.ranks, label, row))} | {_md(role)} | {error} |")
        if len(groups) > MAX_ROWS:
            out.append(f"| ... | | {len(groups) - MAX_ROWS} more groups | see `--json` |")
        out.append("")
    if d.advice:
        out += ["### What to do", ""] + [f"- {_md(a)}" for a in d.advice] + [""]
    exclude = f"  **Exclude nodes:** {', '.join(_md(n) for n in d.exclude_nodes)}" if d.exclude_nodes else ""
    out.append(f"**Retry:** {_md(d.retry)}{exclude}")
    return "\n".join(out) + "\n"
