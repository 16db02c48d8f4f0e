"""ddpslurm's per-rank start/exit records, its job record, and torchelastic's error.json -> Events.

Records are small JSON files read whole (capped); a malformed one is skipped, never fatal.
"""

from __future__ import annotations

import json
from typing import Any

from ddpslurm.analyze.events import Event, SourceFile
from ddpslurm.analyze.signatures import SignatureSet
from ddpslurm.analyze.timestamps import parse_record_time

MAX_RECORD_BYTES = 4 << 20

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


def read_json(path: str) -> Any:
    """The JSON value of a small file, or None when it is too big, unreadable or not JSON."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_RECORD_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_RECORD_BYTES:
        return None
    try:
        return json.loads(data.decode("utf-8", errors="replace"))
    except ValueError:
        return None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return None


def record_events(source: SourceFile, sigs: SignatureSet) -> tuple[list[Event], dict[str, Any]]:
    """Events of one record file, and job-level facts (world_size, ...) it states."""
    data = read_json(source.path)
    if not isinstance(data, dict):
        return [], {}
    if source.kind == "job_record":
        return [], _job_facts(data)
    if source.kind == "elastic_error":
        return _elastic_error(source, data, sigs), {}
    rank = _int(data.get("rank"))
    rank = rank if rank is not None else source.rank
    host = data.get("host") if isinstance(data.get("host"), str) else source.host
    pid = _int(data.get("pid"))
    when = parse_record_time(data.get("unix")) or parse_record_time(data.get("time"))
    family = "record" if when is not None else None
    base = {"file": source.display, "line": 1, "rank": rank, "host": host, "pid": pid, "time": when,
            "time_family": family, "local_rank": _int(data.get("local_rank"))}
    facts: dict[str, Any] = {}
    if source.kind == "start_record" or data.get("kind") == "start":
        fields = tuple((k, str(data[k])) for k in ("world_size", "local_world_size", "node_rank", "launcher", "attempt",
                                                   "master_addr", "master_port") if data.get(k) is not None)
        if _int(data.get("world_size")):
            facts["world_size"] = _int(data.get("world_size"))
        return [Event(kind="start", text=f"rank {rank} started on {host}", fields=fields, **base)], facts
    status = str(data.get("status", ""))
    exc = data.get("exception") if isinstance(data.get("exception"), dict) else None
    signal = data.get("signal") if isinstance(data.get("signal"), str) else None
    code = _int(data.get("exit_code"))
    pairs = (("status", status), ("exit_code", code), ("signal", signal))
    fields = tuple((k, str(v)) for k, v in pairs if v is not None)
    if status == "ok":
        return [Event(kind="exit", text=f"rank {rank} exited normally", fields=fields, **base)], facts
    if exc is not None:
        text = f"{exc.get('type', 'Exception')}: {exc.get('message', '')}".strip()
        first_line = text.splitlines()[0] if text else "Exception"
        hit = sigs.match(first_line) or sigs.match(text[:4000])
        sig = hit[0] if hit else sigs.by_id("python-exception")
        groups = tuple(sorted((k, v) for k, v in hit[1].groupdict().items() if v is not None)) if hit else ()
        marker = Event(kind="exit", text=first_line[:2000], fields=fields, **base)
        kind = sig.kind if sig is not None and sig.kind not in ("signature", "exit") else "exception"
        return [marker, _sig_event(base, kind, first_line[:2000], sig, fields + groups)], facts
    if status == "preempted":
        time_limit = data.get("reason") in ("time_limit", "TIME_LIMIT")
        what = "the time limit" if time_limit else "preemption"
        marker = Event(kind="exit", text=f"rank {rank} stopped for {what}", fields=fields, **base)
        sig = sigs.by_id("ddpslurm-time-limit" if time_limit else "ddpslurm-preempted")
        return [marker, _sig_event(base, "slurm_job", marker.text, sig, fields)], facts
    if signal:
        cause, role = SIGNAL_CAUSES.get(signal, ("unknown", "either"))
        return [Event(kind="exit_signal", text=f"rank {rank} was killed by {signal}", cause=cause, role=role,
                      priority=40 if role == "culprit" else 5, fields=fields, signature="exit-record-signal",
                      **base)], facts
    text = f"rank {rank} exited with code {code}"
    role = "either" if code else None
    return [Event(kind="exit", text=text, fields=fields, role=role, cause="user_code_exception" if code else None,
                  priority=5 if code else 0, signature="exit-record-code" if code else None, **base)], facts


def _sig_event(base: dict[str, Any], kind: str, text: str, sig, fields: tuple) -> Event:
    return Event(kind=kind, text=text, fields=fields, cause=sig.cause if sig else "user_code_exception",
                 role=sig.role if sig else "culprit", signature=sig.id if sig else None,
                 priority=sig.priority if sig else 10, **base)


def _elastic_error(source: SourceFile, data: dict[str, Any], sigs: SignatureSet) -> list[Event]:
    msg = data.get("message")
    when = None
    stack = ""
    if isinstance(msg, dict):
        extra = msg.get("extraInfo") if isinstance(msg.get("extraInfo"), dict) else {}
        when = parse_record_time(extra.get("timestamp"))
        stack = str(extra.get("py_callstack", ""))
        msg = msg.get("message")
    text = str(msg or "").strip()
    if not text:
        return []
    lines = [ln for ln in text.splitlines() if ln.strip()]
    final = next((ln for ln in reversed(lines) if not ln[:1].isspace()), lines[-1]) if lines else text
    if not final and stack:
        final = stack.strip().splitlines()[-1]
    hit = sigs.match(final)
    sig = hit[0] if hit else sigs.by_id("python-exception")
    groups = tuple(sorted((k, v) for k, v in hit[1].groupdict().items() if v is not None)) if hit else ()
    base = {"file": source.display, "line": 1, "rank": source.rank, "host": source.host, "pid": None, "time": when,
            "time_family": "epoch" if when is not None else None, "local_rank": source.local_rank}
    return [_sig_event(base, "exception", final[:2000], sig, groups)]


def _job_facts(data: dict[str, Any]) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    spec = data.get("spec") if isinstance(data.get("spec"), dict) else data
    world = _int(spec.get("world_size"))
    if world is None:
        nodes = _int(spec.get("nodes"))
        per = _int(spec.get("tasks_per_node")) or _int(spec.get("ntasks_per_node")) or _int(spec.get("gpus_per_node"))
        launcher = str(spec.get("launcher", "srun"))
        if launcher == "torchrun":
            per = _int(spec.get("nproc_per_node")) or per
        if nodes and per:
            world = nodes * per
    if world:
        facts["world_size"] = world
    return facts
