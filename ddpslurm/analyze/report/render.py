"""A verdict -> the Diagnosis users read: summary, advice, evidence lines, the rank table, the timeline rows."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ddpslurm.analyze.diagnose.combiner import Verdict, one_rank_job
from ddpslurm.analyze.diagnose.peers import named_peer
from ddpslurm.analyze.diagnose.resolve import is_host_name, plausible_world
from ddpslurm.analyze.diagnose.timeline import JobTimeline
from ddpslurm.analyze.model import NO_FAILURE, Diagnosis, Event, Evidence, FileSummary, RankRow
from ddpslurm.analyze.parse.timestamps import format_time
from ddpslurm.analyze.parse.tracebacks import in_library
from ddpslurm.analyze.report.declared import declared
from ddpslurm.analyze.report.timeline_rows import host_events, timeline_rows
from ddpslurm.analyze.rules.signatures import SignatureSet

MAX_EVIDENCE = 8
#: an evidence line's text is kept whole up to this (a line event holds at most 2000 characters): the end of a long
#: NCCL line is what tells the peer and the error
MAX_TEXT = 2000
#: how much of a clipped text's end is kept (NCCL's `Call to recv from 10.0.3.7<43012> failed : Broken pipe`)
CLIP_TAIL = 64
#: how the combiner decided -> the note the report adds
DECIDED_BY = {
    "systemic": "no single rank: {reason}",
    "tie": "no single rank: {reason}",
    "none": "no single rank: {reason}",
    "lost peer": "no single rank: {reason}",
}


def render(verdict: Verdict, tl: JobTimeline, summaries: Sequence[FileSummary], sigs: SignatureSet) -> Diagnosis:
    info = sigs.causes.get(verdict.cause)
    chosen = verdict.chosen
    sig = sigs.by_id(chosen.signature) if chosen is not None and chosen.signature else None
    if sig is not None and sig.cause != verdict.cause:
        sig = None
    values: dict[str, Any] = dict(chosen.fields) if chosen is not None else {}
    reported_rank = values.get("rank") if values.get("accuses") == "host" else None  # a node's report names ranks
    values.update({"rank": verdict.rank if verdict.rank is not None else reported_rank, "host": verdict.host or None,
                   "lost_node": verdict.host if verdict.decided_by == "lost peer" else None,
                   "sole_world": 1 if verdict.rank is not None and one_rank_job(tl) else None})
    if verdict.cause == "unknown" and verdict.rank is None and not values["lost_node"]:
        values["lost_peer"] = ", ".join(untied_peers(tl)[:3]) or None
    said = declared(verdict, tl, sig, info, sigs)  # an IB completion status, a shape of the cause, the defaults
    values.update(said.values)
    summary = fill(said.template, values) + _ordering_note(verdict, tl)
    advice = list(dict.fromkeys(a for a in (fill(x, values) for x in said.advice) if a))
    retry, exclude = said.retry, said.exclude_node
    if chosen is not None and chosen.kind == "preflight":  # ddpslurm doctor named the node before training
        retry, exclude = "requeue", True
    exclude_nodes = [verdict.host] if exclude and verdict.host else []
    if exclude_nodes:
        advice.append(f"Resubmit avoiding the node: sbatch --exclude={','.join(exclude_nodes)} "
                      f"(or ddpslurm submit ... --exclude {','.join(exclude_nodes)}).")
    rows = rank_rows(tl, verdict)
    cause, confidence, shown = verdict.cause, verdict.confidence, evidence(tl, summaries, verdict)
    if _every_rank_ended_normally(verdict, tl, rows):
        cause, confidence, shown = NO_FAILURE, "high", []  # a completed job: no training line is evidence of anything
        summary = f"Every rank ({len(rows)}) ended normally, by its exit record: these logs show no failure."
        advice = ["If the job still went wrong, look where these logs do not reach: its Slurm state (ddpslurm status "
                  "JOBID, sacct) and the outputs your script writes."]
    return Diagnosis(cause=cause, first_failing_rank=verdict.rank, first_failing_host=verdict.host,
                     confidence=confidence, summary=summary, advice=advice,
                     evidence=shown, ranks=rows, retry=retry,
                     exclude_nodes=exclude_nodes, notes=_notes(verdict) + verdict.notes,
                     timeline=timeline_rows(tl, rows, verdict.rank, lambda e: clip(shown_text(e), 300)),
                     job_events=[to_evidence(e) for e in tl.job_events[:MAX_EVIDENCE]], host_events=host_events(tl))


#: an optional part of a summary or advice template: `[[with {field}|without it|...]]`, the first alternative whose
#: fields are all known is used, none (an empty string) when none is
_OPTIONAL = re.compile(r"\[\[(.*?)\]\]", re.S)
_FIELD = re.compile(r"\{(\w+)\}")


def fill(template: str, values: dict[str, Any]) -> str:
    """`template` with `{name}` fields filled from `values` (None or empty is unknown). A part that needs a field the
    logs did not give is written `[[Rank {rank}|A rank]]`: the first alternative with every field known. A field
    left unknown outside such a part reads `?` (a site's template; the shipped ones have none)."""
    known = {k: v for k, v in values.items() if v is not None and v != ""}

    def choose(m: re.Match[str]) -> str:
        return next((alt for alt in m[1].split("|") if all(f in known for f in _FIELD.findall(alt))), "")

    class _Safe(dict):
        def __missing__(self, key: str) -> str:
            return "?"

    try:
        return _OPTIONAL.sub(choose, template).format_map(_Safe(known))
    except (ValueError, IndexError, AttributeError):
        return template


def _every_rank_ended_normally(verdict: Verdict, tl: JobTimeline, rows: list[RankRow]) -> bool:
    """No failure found, and every rank the job had left an exit record that says it ended normally (a job that
    completed, analyzed to be sure): not a failure nobody recognised."""
    return (verdict.cause == "unknown" and verdict.rank is None and bool(rows) and not tl.job_events
            and all(row.role == "ok" for row in rows))


def _ordering_note(verdict: Verdict, tl: JobTimeline) -> str:
    if verdict.rank is None or verdict.decided_by == "time":
        return ""
    failures = [e for rt in tl.ranks.values() for e in rt.failures]
    if failures and not any(e.time is not None for e in failures):
        return " (No timestamps in the logs: ordered by causal evidence.)"
    if failures and verdict.decided_by == "weight" and len(tl.ranks) > 1:  # `only`: nothing to order it against
        untimed = sorted(r for r, rt in tl.ranks.items() if rt.own_failures
                         and all(e.time is None for e in rt.own_failures))
        if not untimed:
            return " (The ranks' failure times are not comparable: ordered by the weight of the evidence.)"
        shown = ", ".join(map(str, untimed[:5])) + (f" and {len(untimed) - 5} more" if len(untimed) > 5 else "")
        return f" (Rank(s) {shown} logged their failure without a time: ordered by the weight of the evidence.)"
    return ""


def _notes(verdict: Verdict) -> list[str]:
    if verdict.decided_by in DECIDED_BY:
        return [DECIDED_BY[verdict.decided_by].format(reason=verdict.reasons[0] if verdict.reasons else "?")]
    if verdict.rank is None or verdict.decided_by == "job":
        return []
    reasons = list(dict.fromkeys(own_reason(r, verdict.rank) for r in verdict.reasons))
    return [f"rank {verdict.rank} was singled out because {'; '.join(reasons)}"]


def own_reason(reason: str, rank: int) -> str:
    """A reason for singling `rank` out, said of it (`it`, `its`) rather than naming the rank again."""
    reason = re.sub(rf"^rank {rank} reported it itself\b", "it reported the failure itself", reason)
    return re.sub(rf"^rank {rank}('s|\b)", lambda m: "its" if m[1] else "it", reason)


def to_evidence(e: Event) -> Evidence:
    return Evidence(file=e.file, line=e.line, rank=e.rank, time=format_time(e.time), text=clip(shown_text(e), MAX_TEXT))


def clip(text: str, size: int) -> str:
    """`text` in at most `size` characters, its start and its end kept: the end of an error line is often what
    matters (NCCL's `Call to recv from 10.0.3.7<43012> failed : Broken pipe`, after a long explanation)."""
    if len(text) <= size:
        return text
    tail = min(CLIP_TAIL, size // 3)
    return f"{text[:size - tail - 5]} ... {text[len(text) - tail:]}"


#: the traceback field of torchelastic's failure summary when the child left no error file: a pointer to the docs
_ELASTIC_BOILERPLATE = re.compile(r"^\s*(?:traceback\s*:\s*)?To enable traceback see:", re.I)


def shown_text(e: Event) -> str:
    """The text a report shows for an event: its line, except for an entry of torchelastic's failure summary that
    holds only the pointer to its docs, which is said as what the entry tells (its exit code, pid and time)."""
    if e.kind != "elastic_failure" or not _ELASTIC_BOILERPLATE.match(e.text):
        return e.text
    code, pid, when = e.get("exitcode"), e.get("pid"), e.get("time")
    said = f"exited with exit code {code}" if code and not code.startswith("-") else \
        f"was killed by signal {code[1:]}" if code else "failed"
    return (f"torchelastic: the worker {said}{f' (pid {pid})' if pid else ''}{f' at {when}' if when else ''}, "
            f"no traceback recorded (@record on main records one)")


def evidence(tl: JobTimeline, summaries: Sequence[FileSummary], verdict: Verdict) -> list[Evidence]:
    """The decisive line, the culprit's other errors, the votes' lines, one line per victim kind, Slurm's. The copies
    of one line in several files (the .err, the exit record, the rank's log) are all kept here, for `--json`; the
    text and Markdown reports show each piece once (`report.text.pieces`)."""
    picked: list[Event] = [verdict.chosen] if verdict.chosen is not None else []
    if verdict.rank is not None:
        picked += [e for e in tl.rank(verdict.rank).own_failures if e is not verdict.chosen][:2]
    picked += verdict.support
    kinds: set[object] = set()
    for rt in tl.ranks.values():
        for e in rt.failures:
            if e.role == "victim" and e.kind not in kinds and len(picked) < MAX_EVIDENCE:
                kinds.add(e.kind)
                picked.append(e)
    for e in tl.unranked:  # a paste without rank prefixes: its failure lines, not its last lines
        if e.role is not None and (e.kind, e.role) not in kinds and len(picked) < MAX_EVIDENCE:
            kinds.add((e.kind, e.role))
            picked.append(e)
    picked += [e for e in tl.job_events if e not in picked][:max(0, MAX_EVIDENCE - len(picked))]
    out = _unique(picked)
    if not out:
        for s in summaries:
            for i, line in enumerate(s.tail):
                out.append(Evidence(file=s.file, line=max(1, s.lines - len(s.tail) + 1 + i), rank=None, time=None,
                                    text=clip(line, 500)))
    return out[:MAX_EVIDENCE]


@dataclass(frozen=True)
class ShownEvidence(Evidence):
    """An evidence line with the frame of the script that raised it (a traceback's last frame, when it is not in
    torch or another library: `train.py:52 in step`). The JSON keeps the five keys of DESIGN.md (Evidence's
    `to_dict`)."""

    frame: str | None = None


def _unique(events: list[Event]) -> list[Evidence]:
    seen: set[tuple[str, int]] = set()
    out: list[Evidence] = []
    for e in events:
        if (e.file, e.line) not in seen:
            seen.add((e.file, e.line))
            where = e.get("where")
            out.append(ShownEvidence(file=e.file, line=e.line, rank=e.rank, time=format_time(e.time),
                                     text=clip(shown_text(e), MAX_TEXT),
                                     frame=where if where and not in_library(where) else None))
    return out


def untied_peers(tl: JobTimeline) -> list[str]:
    """The peers victims' lines say they lost (a closed or reset connection, most named first) that no log read
    here belongs to: an address no record or interface line maps to a host, a host no line came from. Their own
    logs hold the first failure; the report says where to look."""
    known = {h for h in tl.facts.rank_host.values() if h} | {e.host for e in tl.events if e.host}
    known_short = {h.split(".", 1)[0] for h in known}
    named: dict[str, int] = {}
    pids: dict[str, set[str]] = {}
    for e in tl.failure_lines():
        if e.role != "victim" or e.get("accuses") != "peer":
            continue
        host = named_peer(e, tl)
        if host is not None and (is_address(host) or is_host_name(host)) and host not in known \
                and host.split(".", 1)[0] not in known_short and not is_loopback(host):
            named[host] = named.get(host, 0) + 1
            if e.get("worker_pid"):  # the dead process the line names (Ray's `Worker PID:`)
                pids.setdefault(host, set()).add(e.get("worker_pid") or "")
    return [f"{peer} (pid {', '.join(sorted(pids[peer], key=int))})" if peer in pids else peer
            for peer in sorted(named, key=lambda peer: -named[peer])]


def is_loopback(text: str) -> bool:
    """A loopback address (127.0.0.1, ::1): the reporter's own node, no other one."""
    try:
        return ipaddress.ip_address(text.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def is_address(text: str) -> bool:
    """A whole IPv4 or IPv6 address (not one a person elided when pasting: `172....`, `10.x.x.x`)."""
    try:
        ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return False
    return True


def rank_rows(tl: JobTimeline, verdict: Verdict) -> list[RankRow]:
    """One row per rank seen or launched (bounded by facts), with its role and first error."""
    facts = tl.facts
    ranks = set(facts.present) | set(tl.ranks)
    launched = facts.launched_world or 0
    if launched and launched <= plausible_world(len(ranks), max(ranks, default=-1) + 1):
        ranks |= set(range(launched))
    if verdict.rank is not None:
        ranks.add(verdict.rank)
    rows = []
    for r in sorted(ranks):
        rt = tl.ranks.get(r)
        first = _first_error(rt or tl.rank(r), verdict)
        rows.append(RankRow(rank=r, host=(rt.host if rt else None) or facts.rank_host.get(r),
                            role=_role(r, rt, first, verdict),
                            first_error=clip(shown_text(first), 300) if first else None))
    return rows


def _first_error(rt: Any, verdict: Verdict) -> Event | None:
    """The culprit's row shows the line that decided it (srun's `Killed` names no rank); others their first."""
    if verdict.rank == rt.rank and verdict.chosen is not None and verdict.chosen.rank in (rt.rank, None):
        return verdict.chosen
    timed = sorted(rt.failures, key=lambda e: (e.time is None, e.time or 0.0, e.file, e.line))
    said = [e for e in timed if shown_text(e) is e.text]  # torchelastic's pointer to its docs says least
    return said[0] if said else timed[0] if timed else None


def _role(rank: int, rt: Any, first: Event | None, verdict: Verdict) -> str:
    if rank == verdict.rank:
        return "culprit"
    if first is not None:
        return "victim"
    if rt is not None and rt.exit_status == "ok":
        return "ok"
    return "unknown"
