"""ddpslurm's start/exit records, its job record, and torchelastic's error.json -> Events.

A rank's start and exit records are in its node's file (`attempt_N/node_<host>.json`, `ranks.<R>.start` and
`ranks.<R>.exit`: ddpslurm.launch.node_live), or in files of their own (`rank_R.start.json`, `rank_R.exit.json`: a
rank whose node agent did not confirm them, older job folders); both read alike. Records are JSON files read whole
(capped); a malformed one is skipped, never fatal. A rank's record found in both (its agent confirmed it after the
rank's own wait ran out) is read once, from the node file, as `ddpslurm.jobfolder.read_rank_records` reads it.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddpslurm.analyze.model import Event, SourceFile
from ddpslurm.analyze.parse.timestamps import parse_record_time
from ddpslurm.analyze.rules.signatures import SignatureSet
from ddpslurm.sanitize import escape_undecodable, terminal

MAX_RECORD_BYTES = 4 << 20
#: a node file holds every local rank's records (with their exceptions' tracebacks): more than a record
MAX_NODE_FILE_BYTES = 64 << 20
#: the records a node file holds per rank (ddpslurm.jobfolder.RECORD_KINDS)
NODE_RECORD_KINDS = ("start", "exit")

#: exit signal -> (cause, role) for a rank that died by that signal.
SIGNAL_CAUSES: dict[str, tuple[str, str]] = {
    "SIGKILL": ("host_oom", "culprit"),
    "SIGSEGV": ("segfault", "culprit"),
    "SIGBUS": ("shm_error", "culprit"),
    "SIGABRT": ("unknown", "victim"),  # mostly the NCCL watchdog taking the process down
    "SIGILL": ("segfault", "culprit"),
    "SIGFPE": ("segfault", "culprit"),
    "SIGTERM": ("unknown", "victim"),
    "SIGINT": ("unknown", "victim"),
    "SIGHUP": ("unknown", "victim"),
    "SIGUSR1": ("preempted", "victim"),
    "SIGUSR2": ("preempted", "victim"),
}
SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
                10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2", 13: "SIGPIPE", 15: "SIGTERM"}


#: Bounds a record field must lie in to be believed. They come from facts about the systems that write the
#: records, never from a number in a log: no Slurm job has had a million ranks (the largest published runs
#: are ~100k GPUs), Linux pids stop at PID_MAX_LIMIT (2**22), exit codes are a byte (Python reports a signal
#: as -N), and ddpslurm records times of this century.
MAX_WORLD_SIZE = 1 << 20
MAX_PID = 1 << 22
MAX_ATTEMPT = 100_000
EPOCH_RANGE = (946_684_800.0, 4_102_444_800.0)  # 2000-01-01 .. 2100-01-01 UTC
MAX_NAME_CHARS = 255  # host names (RFC 1035: 253), signal and status words
MAX_MESSAGE_CHARS = 64 << 10  # an exception message is kept up to this size, then cut
MAX_MATCH_CHARS = 2000  # what a signature is matched against (a longer first line is cut, never timed out)

#: record field -> (type, lowest, highest) for integers, or (type,) for the others; rules as data.
FIELD_RULES: dict[str, tuple[Any, ...]] = {
    "rank": ("int", 0, MAX_WORLD_SIZE - 1), "local_rank": ("int", 0, MAX_WORLD_SIZE - 1),
    "node_rank": ("int", 0, MAX_WORLD_SIZE - 1), "world_size": ("int", 1, MAX_WORLD_SIZE),
    "local_world_size": ("int", 1, MAX_WORLD_SIZE), "pid": ("int", 1, MAX_PID), "exit_code": ("int", -255, 255),
    "attempt": ("int", 0, MAX_ATTEMPT), "master_port": ("int", 1, 65535), "nodes": ("int", 1, MAX_WORLD_SIZE),
    "tasks_per_node": ("int", 1, MAX_WORLD_SIZE), "ntasks_per_node": ("int", 1, MAX_WORLD_SIZE),
    "gpus_per_node": ("int", 0, MAX_WORLD_SIZE), "nproc_per_node": ("int", 1, MAX_WORLD_SIZE),
    "host": ("name",), "master_addr": ("name",), "status": ("word",), "signal": ("word",), "kind": ("word",),
    "reason": ("word",), "launcher": ("word",), "unix": ("time",), "time": ("time",),
}
_NAME = re.compile(r"[A-Za-z0-9_.:\[\]%-]+")  # host names, IPv4/IPv6 addresses (ASCII only)
_WORD = re.compile(r"[A-Za-z0-9_.+-]+")
_INTEGER_TEXT = re.compile(r"-?[0-9]{1,12}")


class _NotANumber:
    """What NaN and +-Infinity decode to: a value no field rule accepts, so the field is noted as bad."""


def read_json(path: str, max_bytes: int = MAX_RECORD_BYTES) -> Any:
    """The JSON value of a small regular file, or None when it is not one, bigger than `max_bytes`, unreadable, not
    JSON or nested too deep."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)  # a fifo named like a record never blocks
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = handle.read(max_bytes + 1)
    except OSError:
        return None
    if len(data) > max_bytes:
        return None
    try:
        return json.loads(data.decode("utf-8", errors="replace"), parse_constant=lambda _: _NotANumber())
    except (ValueError, RecursionError):  # RecursionError: JSON nested deeper than the interpreter's stack
        return None


def _int(value: Any) -> int | None:
    """An integer field: a JSON integer, or ASCII digits in a string (never a float, a bool or `1e11`)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value):
        return int(value)
    return None


def _valid(rule: tuple[Any, ...], value: Any) -> Any:
    """`value` if it satisfies the field rule, else None."""
    kind = rule[0]
    if kind == "int":
        number = _int(value)
        return number if number is not None and rule[1] <= number <= rule[2] else None
    if kind == "time":
        when = parse_record_time(value) if isinstance(value, (int, float, str)) and len(str(value)) <= 64 else None
        return when if when is not None and math.isfinite(when) and EPOCH_RANGE[0] <= when < EPOCH_RANGE[1] else None
    pattern = _NAME if kind == "name" else _WORD
    if isinstance(value, str) and len(value) <= MAX_NAME_CHARS and pattern.fullmatch(value):
        return value
    return None


def validate_record(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The fields of a record that pass FIELD_RULES (and `exception`), and the names of those that did not.

    A field that is absent or null is neither. A rank outside the record's own world size is bad. Pure.
    """
    clean: dict[str, Any] = {}
    bad: list[str] = []
    for name, rule in FIELD_RULES.items():
        if data.get(name) is None:
            continue
        value = _valid(rule, data[name])
        if value is None:
            bad.append(name)
        else:
            clean[name] = value
    if "rank" in clean and clean["rank"] >= clean.get("world_size", MAX_WORLD_SIZE):
        bad.append("rank")
        del clean["rank"]
    if data.get("exception") is not None:
        exc = _exception(data["exception"])
        if exc is None:
            bad.append("exception")
        else:
            clean["exception"] = exc
    return clean, bad


def _exception(value: Any) -> dict[str, str] | None:
    """`{"type", "message"}` of a record's exception: a word and text (cut to MAX_MESSAGE_CHARS), or None."""
    if not isinstance(value, dict):
        return None
    kind = value.get("type", "Exception")
    message = value.get("message", "")
    if not isinstance(kind, str) or not _WORD.fullmatch(kind) or len(kind) > MAX_NAME_CHARS:
        return None
    if not isinstance(message, str):
        return None
    return {"type": kind, "message": escape_undecodable(message[:MAX_MESSAGE_CHARS])}


def _bad_note(source: SourceFile, what: str) -> dict[str, Any]:
    return {"notes": [f"record {terminal(source.display)}: {what}"]}


def record_events(source: SourceFile, sigs: SignatureSet) -> tuple[list[Event], dict[str, Any]]:
    """Events of one record file, and job-level facts (world_size, ...) it states.

    A record that is not a JSON object is skipped; a field that fails its rule is left out; both add a
    line to `facts["notes"]`. Nothing in a record aborts the analysis.
    """
    if source.kind == "doctor_record":  # judged with its sibling records: parse/preflight_records.py
        from ddpslurm.analyze.parse.preflight_records import doctor_events

        return doctor_events(source.path, source.display), {}
    if source.kind == "stack_dump":  # the hang monitor's stack dumps (ddpslurm/analyze/stacks.py)
        from ddpslurm.analyze.parse.stacks import stack_events

        return stack_events(source), {}
    if source.kind == "fr_trace":  # the hang monitor's flight recorder dumps (ddpslurm/analyze/flight_recorder.py)
        from ddpslurm.analyze.parse.flight_recorder import fr_events

        return fr_events(source), {}
    if source.kind == "hang_record":  # the heartbeat's and the monitor's bookkeeping: no evidence of its own
        return [], {}
    if source.kind == "node_record":
        return node_record_events(source, sigs)
    data = read_json(source.path)
    if not isinstance(data, dict):
        return [], _bad_note(source, "skipped, not a readable JSON object")
    if source.kind == "job_record":
        return [], _job_facts(data)
    if source.kind == "elastic_error":
        return _elastic_error(source, data, sigs), {}
    clean, bad = validate_record(data)
    notes = _bad_note(source, "ignored invalid field(s) " + ", ".join(bad)) if bad else {}
    events, facts = _rank_record(source, clean, data.get("kind"), sigs)
    return events, {**facts, **notes}


#: a rank's own record file's kind -> the key of the same record in its node's file
_OWN_RECORD_KINDS = {"start_record": "start", "exit_record": "exit"}


def all_record_events(records: Sequence[SourceFile], sigs: SignatureSet
                      ) -> tuple[list[Event], dict[str, Any], list[str]]:
    """The events, facts (the largest of each number) and notes of a job's record files, node files first; a rank's
    own start or exit file whose record its attempt's node file holds too is not read again."""
    events: list[Event] = []
    facts: dict[str, Any] = {}
    notes: list[str] = []
    told: set[tuple[Path, str, int]] = set()  # (attempt folder, kind, rank) of the records node files held
    for source in sorted(records, key=lambda s: s.kind != "node_record"):
        kind = _OWN_RECORD_KINDS.get(source.kind)
        if kind is not None and source.rank is not None and _told_by_node_file(source, kind, told):
            continue
        found_events, found = record_events(source, sigs)
        if source.kind == "node_record":
            told.update((Path(source.path).parent, _record_kind(e), e.rank) for e in found_events
                        if e.rank is not None)
        events.extend(found_events)
        notes.extend(found.pop("notes", ()))
        for key, value in found.items():
            facts[key] = max(facts.get(key, 0), value) if isinstance(value, int) else value
    return events, facts, notes


def _told_by_node_file(source: SourceFile, kind: str, told: set[tuple[Path, str, int]]) -> bool:
    """Whether a rank's own record file (`<attempt>/<host>/rank_R...` or `<attempt>/rank_R...`) is one its attempt's
    node file held (by the attempt folder, the record's kind and the rank)."""
    folder = Path(source.path).parent
    return any((attempt, kind, source.rank) in told for attempt in (folder, folder.parent))


def _record_kind(event: Event) -> str:
    """The record an event of a node file came from: a start record's one event, else the exit record's."""
    return "start" if event.kind == "start" else "exit"


def node_record_events(source: SourceFile, sigs: SignatureSet) -> tuple[list[Event], dict[str, Any]]:
    """Events of the start and exit records a node file holds, each read as a record file of its own would be; its
    progress and signals are bookkeeping (no evidence). A node file of an older ddpslurm (an end's summary, no
    `kind`: the rank's own file holds the record) gives none."""
    data = read_json(source.path, MAX_NODE_FILE_BYTES)
    ranks = data.get("ranks") if isinstance(data, dict) else None
    if not isinstance(ranks, dict):
        return [], _bad_note(source, "skipped, not a readable node file")
    events: list[Event] = []
    facts: dict[str, Any] = {}
    bad: set[str] = set()
    for key in sorted(ranks, key=lambda k: (len(str(k)), str(k))):
        state = ranks[key]
        for kind in NODE_RECORD_KINDS:
            record = state.get(kind) if isinstance(state, dict) else None
            if not isinstance(record, dict) or record.get("kind") != kind:
                continue
            clean, wrong = validate_record(record)
            bad.update(wrong)
            found, stated = _rank_record(source, clean, kind, sigs)
            events.extend(found)
            if "world_size" in stated:
                facts["world_size"] = max(facts.get("world_size", 0), stated["world_size"])
    notes = _bad_note(source, "ignored invalid field(s) " + ", ".join(sorted(bad))) if bad else {}
    return events, {**facts, **notes}


def _rank_record(source: SourceFile, data: dict[str, Any], kind: Any,
                 sigs: SignatureSet) -> tuple[list[Event], dict[str, Any]]:
    """Events of a ddpslurm start or exit record whose fields passed validate_record."""
    rank = data.get("rank", source.rank)
    host = data.get("host", source.host)
    when = data.get("unix", data.get("time"))
    base = {"file": source.display, "line": 1, "rank": rank, "host": host, "pid": data.get("pid"), "time": when,
            "time_family": "record" if when is not None else None, "local_rank": data.get("local_rank")}
    if source.kind == "start_record" or kind == "start":
        fields = tuple((k, str(data[k])) for k in ("world_size", "local_world_size", "node_rank", "launcher", "attempt",
                                                   "master_addr", "master_port") if k in data)
        facts = {"world_size": data["world_size"]} if "world_size" in data else {}
        return [Event(kind="start", text=f"rank {rank} started on {host}", fields=fields, **base)], facts
    return _exit_events(data, rank, base, sigs), {}


def _match(sigs: SignatureSet, text: str) -> Any:
    """sigs.match on at most MAX_MATCH_CHARS characters; a signature that times out is no match."""
    try:
        return sigs.match(text[:MAX_MATCH_CHARS])
    except TimeoutError:
        return None


def _exit_events(data: dict[str, Any], rank: int | None, base: dict[str, Any], sigs: SignatureSet) -> list[Event]:
    """Events of an exit record: an exception, a preemption, a signal or an exit code."""
    status = data.get("status", "")
    exc = data.get("exception")
    signal = data.get("signal")
    code = data.get("exit_code")
    pairs = (("status", status), ("exit_code", code), ("signal", signal))
    fields = tuple((k, str(v)) for k, v in pairs if v is not None)
    if status == "ok":
        return [Event(kind="exit", text=f"rank {rank} exited normally", fields=fields, **base)]
    if exc is not None:
        text = f"{exc['type']}: {exc['message']}".strip()
        first_line = (text.splitlines() or ["Exception"])[0][:MAX_MATCH_CHARS]
        hit = _match(sigs, first_line) or _match(sigs, text)
        sig = hit[0] if hit else sigs.by_id("python-exception")
        groups = tuple(sorted((k, v) for k, v in hit[1].groupdict().items() if v is not None)) if hit else ()
        marker = Event(kind="exit", text=first_line, fields=fields, **base)
        kind = sig.kind if sig is not None and sig.kind not in ("signature", "exit") else "exception"
        return [marker, _sig_event(base, kind, first_line, sig, fields + groups)]
    if status == "hang":  # ended by ddpslurm's hang monitor: every rank gets one, the stack dumps tell who hung
        return [Event(kind="exit", text=f"rank {rank} was ended by ddpslurm's hang monitor (no progress)",
                      fields=fields, role="victim", cause="collective_timeout", priority=5,
                      signature="exit-record-hang", **base)]
    if status == "preempted":
        time_limit = data.get("reason") in ("time_limit", "TIME_LIMIT")
        what = "the time limit" if time_limit else "preemption"
        marker = Event(kind="exit", text=f"rank {rank} stopped for {what}", fields=fields, **base)
        sig = sigs.by_id("ddpslurm-time-limit" if time_limit else "ddpslurm-preempted")
        return [marker, _sig_event(base, "slurm_job", marker.text, sig, fields)]
    if signal:
        cause, role = SIGNAL_CAUSES.get(signal, ("unknown", "either"))
        return [Event(kind="exit_signal", text=f"rank {rank} was killed by {signal}", cause=cause, role=role,
                      priority=40 if role == "culprit" else 5, fields=fields, signature="exit-record-signal",
                      **base)]
    text = f"rank {rank} exited with code {code}"
    role = "either" if code else None
    return [Event(kind="exit", text=text, fields=fields, role=role, cause="user_code_exception" if code else None,
                  priority=5 if code else 0, signature="exit-record-code" if code else None, **base)]


def _sig_event(base: dict[str, Any], kind: str, text: str, sig, fields: tuple) -> Event:
    return Event(kind=kind, text=text, fields=fields, cause=sig.cause if sig else "user_code_exception",
                 role=sig.role if sig else "culprit", signature=sig.id if sig else None,
                 priority=sig.priority if sig else 10, **base)


def _elastic_error(source: SourceFile, data: dict[str, Any], sigs: SignatureSet) -> list[Event]:
    """torchelastic's error.json: its final message line (or the stack's last line) as an exception event."""
    msg = data.get("message")
    when = None
    stack = ""
    if isinstance(msg, dict):
        extra = msg.get("extraInfo") if isinstance(msg.get("extraInfo"), dict) else {}
        when = _valid(("time",), extra.get("timestamp"))
        stack = extra.get("py_callstack") if isinstance(extra.get("py_callstack"), str) else ""
        msg = msg.get("message")
    text = escape_undecodable(msg[:MAX_MESSAGE_CHARS]).strip() if isinstance(msg, str) else ""
    if not text:
        return []
    lines = [ln for ln in text.splitlines() if ln.strip()]
    final = next((ln for ln in reversed(lines) if not ln[:1].isspace()), lines[-1]) if lines else text
    if not final and stack:
        final = escape_undecodable(stack[-MAX_MESSAGE_CHARS:]).strip().splitlines()[-1]
    final = final[:MAX_MATCH_CHARS]
    hit = _match(sigs, final)
    sig = hit[0] if hit else sigs.by_id("python-exception")
    groups = tuple(sorted((k, v) for k, v in hit[1].groupdict().items() if v is not None)) if hit else ()
    base = {"file": source.display, "line": 1, "rank": source.rank, "host": source.host, "pid": None, "time": when,
            "time_family": "epoch" if when is not None else None, "local_rank": source.local_rank}
    return [_sig_event(base, "exception", final, sig, groups)]


def _job_facts(data: dict[str, Any]) -> dict[str, Any]:
    """The launched world size from ddpslurm.json (its spec), within MAX_WORLD_SIZE."""
    spec = data.get("spec") if isinstance(data.get("spec"), dict) else data
    clean, _ = validate_record(spec)
    world = clean.get("world_size")
    if world is None:
        nodes = clean.get("nodes")
        per = clean.get("tasks_per_node") or clean.get("ntasks_per_node") or clean.get("gpus_per_node")
        if clean.get("launcher", "srun") == "torchrun":
            per = clean.get("nproc_per_node") or per
        if nodes and per and nodes * per <= MAX_WORLD_SIZE:
            world = nodes * per
    return {"world_size": world} if world else {}
