"""Render a Diagnosis: rich terminal text, Markdown for a support ticket, JSON. Log text is never markup."""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Iterable, Iterator, Sequence

from ddpslurm import sanitize
from ddpslurm.analyze.model import NO_FAILURE, Diagnosis, RankRow

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


def _crop(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


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


def render_text(diagnosis: Diagnosis, console=None) -> None:
    """Print the report with rich (to stdout by default): the verdict, its evidence, the ranks, what to do."""
    from rich.console import Console

    console = console or Console(highlight=False, soft_wrap=False)
    _print_verdict(console, diagnosis)
    if diagnosis.evidence:
        _print_evidence(console, diagnosis)
    if diagnosis.ranks:
        _print_ranks(console, diagnosis)
    _print_advice(console, diagnosis)


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
    """Each evidence line: where it is (under the files' common folder), its rank and time, its text."""
    from rich.text import Text

    root = evidence_root([ev.file for ev in d.evidence])
    console.print(Text("\nEvidence", style="bold underline"))
    if root:
        console.print(Text(f"  in {safe(root)}{os.sep}", style="dim"), soft_wrap=True)
    for ev in d.evidence:
        where = Text("  ")
        where.append(f"{safe(os.path.relpath(ev.file, root) if root else ev.file)}:{ev.line}", style="cyan")
        if ev.rank is not None:
            where.append(f"  rank {ev.rank}", style="magenta")
        if ev.time:
            where.append(f"  {safe(ev.time)}", style="dim")
        console.print(where, no_wrap=True, overflow="ellipsis")
        console.print(Text("    " + one_line(ev.text)), no_wrap=True, overflow="ellipsis")


def _print_ranks(console, d: Diagnosis) -> None:
    """The ranks' table, runs of alike ranks collapsed (at most MAX_ROWS rows), the first error cut to fit."""
    from rich.table import Table
    from rich.text import Text

    console.print(Text("\nRanks", style="bold underline"))
    groups = collapse_rows(d.ranks)
    rows = [(label, _hosts(d.ranks, label, row), _role(row, count), row) for label, row, count in groups[:MAX_ROWS]]
    table = Table(show_lines=False)
    names = ("rank", "host", "role")
    widths = [max([len(name)] + [len(r[index]) for r in rows]) for index, name in enumerate(names)]
    for name, width in zip(names, widths, strict=True):
        table.add_column(name, no_wrap=True, width=width)
    room = max(24, console.width - sum(widths) - 13)  # 4 columns: borders and padding take 13 cells
    table.add_column("first error", no_wrap=True, width=room)
    for label, hosts, role, row in rows:
        style = {"culprit": "bold red", "victim": "yellow", "ok": "green"}.get(row.role, "")
        table.add_row(Text(label), Text(hosts), Text(role, style=style),
                      Text(_crop(one_line(row.first_error) or "-", room)))
    if len(groups) > MAX_ROWS:
        table.add_row(Text("..."), Text(""), Text(f"{len(groups) - MAX_ROWS} more groups"), Text(""))
    console.print(table)


def _print_advice(console, d: Diagnosis) -> None:
    """What to do, whether to retry, the nodes to exclude, and the analysis's notes."""
    from rich.text import Text

    if d.advice:
        console.print(Text("\nWhat to do", style="bold underline"))
        for item in d.advice:
            console.print(Text(textwrap.fill(safe(item), width=max(40, console.width - 1), initial_indent="  - ",
                                             subsequent_indent="    ")))
    retry = {"requeue": "yes, resubmitting may succeed", "stop": "no, fix the cause first",
             "unknown": "unknown"}.get(d.retry, d.retry)
    console.print(Text(f"Retry: {safe(retry)}"))
    if d.exclude_nodes:
        console.print(Text(f"Exclude nodes: --exclude={','.join(safe(n) for n in d.exclude_nodes)}"))
    for note in d.notes:
        console.print(Text(f"note: {safe(note)}", style="dim"))


def _md(text: str | None) -> str:
    return sanitize.markdown(text)


def to_markdown(diagnosis: Diagnosis) -> str:
    """A support-ticket friendly report."""
    d = diagnosis
    rank = d.first_failing_rank if d.first_failing_rank is not None else "unknown"
    out = [f"## ddpslurm analyze: `{sanitize.code_text(d.cause)}` (confidence: {_md(d.confidence)})", "",
           f"**First failing rank:** {rank} on host {_md(d.first_failing_host) or 'unknown'}", "",
           _md(d.summary), ""]
    if d.evidence:
        out += ["### Evidence", "", "```"]
        for ev in d.evidence:
            who = f" [rank {ev.rank}]" if ev.rank is not None else ""
            when = f" {ev.time}" if ev.time else ""
            out.append(sanitize.code_text(f"{ev.file}:{ev.line}{who}{when}: {one_line(ev.text)}"))
        out += ["```", ""]
    if d.ranks:
        out += ["### Ranks", "", "| rank | host | role | first error |", "|---|---|---|---|"]
        groups = collapse_rows(d.ranks)
        for label, row, count in groups[:MAX_ROWS]:
            role = _role(row, count)
            error = _md(one_line(row.first_error or "-")[:160])
            out.append(f"| {label} | {_md(_hosts(d.ranks, label, row))} | {_md(role)} | {error} |")
        if len(groups) > MAX_ROWS:
            out.append(f"| ... | | {len(groups) - MAX_ROWS} more groups | see `--json` |")
        out.append("")
    if d.advice:
        out += ["### What to do", ""] + [f"- {_md(a)}" for a in d.advice] + [""]
    exclude = f"  **Exclude nodes:** {', '.join(_md(n) for n in d.exclude_nodes)}" if d.exclude_nodes else ""
    out.append(f"**Retry:** {_md(d.retry)}{exclude}")
    return "\n".join(out) + "\n"
