"""Events of lines: a line's text, its signature match or start-up pattern, and who it speaks for in; `Event`s out.
The second layer of `FileState`: it builds a file's events (`_emit`: the line's time, its srun label, what its
signature says, fields and hosts shared between events), the event of a signature match (`_signature_event`: a
process named by NCCL's `host:pid` head or the match's groups, a rank map told once, an interface's scope), and
those of the start-up lines the scanner reads with patterns of its own: Slurm's restart count, submitit's
`JobEnvironment`, NCCL's `Init START`/`Init COMPLETE`. It notes the generic NCCL errors a later `Last error:` may
explain (`ContinuedLines`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddpslurm.analyze.model import FACT_KINDS, Event, evolve, new_event
from ddpslurm.analyze.parse.attribution import interface_list, interface_scope, nccl_source
from ddpslurm.analyze.parse.channel_lines import MAX_CHANNEL_KEYS
from ddpslurm.analyze.parse.line_streams import LineStreams
from ddpslurm.analyze.parse.shared_values import canonical, canonical_fields
from ddpslurm.analyze.parse.tag_hosts import HOST_TAG
from ddpslurm.analyze.parse.timestamps import EVERY_FORM, TimePlan, parse_planned, parse_time
from ddpslurm.analyze.rules.signatures import Signature

NCCL_INIT = re.compile(r"comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+)"
                       r"(?: cudaDev (?P<dev>\d+))?.*?Init (?P<stage>COMPLETE|START)")
#: `NCCL_INIT` with NCCL's `0x` read as any digit: no line of a shape it cannot match is an init line
NCCL_INIT_ANY_DIGIT = re.compile(NCCL_INIT.pattern.replace("0x", r"\dx"))
_RESTART = re.compile(r"SLURM_RESTART_COUNT\s*[=:]\s*(\d+)")
_SUBMITIT_ENV = re.compile(r"JobEnvironment\(job_id=[^,]*, hostname=(?P<host>[^,]+), local_rank=(?P<local>\d+)\(\d+\), "
                           r"node=(?P<node>\d+)\(\d+\), global_rank=(?P<rank>\d+)\((?P<world>\d+)\)\)")
#: signatures that only say "NCCL failed"; the `Last error:` reason replaces their meaning
GENERIC_NCCL_SIGNATURES = ("nccl-internal-error", "nccl-unhandled-cuda-error", "distributed-library-exception",
                           "python-exception", "nccl-warn-other")


#: how long a logged exception waits for a line saying its process went on (`LineEvents.watching`): lines of its own
#: stream, and lines of the file (an interleaved log's other streams write between)
WATCH_OWN_LINES = 40
WATCH_FILE_LINES = 2000
#: the same, in a stream that several processes write (an unprefixed console log): only the lines right after it,
#: which `logging` and a caught exception's handler write with it
WATCH_SHARED_LINES = 3
#: the logged exceptions one stream's watch holds (an exception logged again and again: the newest ones)
WATCHED_PER_STREAM = 8


@dataclass
class _Watch:
    """A stream's exceptions that wait for a line saying the process went on: (index in events, the event), and
    the file's and the stream's line counts when the newest was logged."""

    logged: list[tuple[int, Event]]
    handled_at: int
    own_at: int
    reach: int = WATCH_OWN_LINES


def small_int(text: str | None) -> int | None:
    """A rank, local rank or pid written in a log: a non-negative int of at most 18 digits, else None (int() of a
    number the log made up may be huge or refused outright)."""
    return int(text) if text and len(text) <= 18 and text.isascii() and text.isdigit() else None


def interface_fields(body: str, ifname: str, ip: str) -> dict[str, str]:
    """`scope` of the interface a `Using` line names first, and every interface it lists (`ifnames`)."""
    listed = interface_list(body) or [(ifname, ip)]
    return {"scope": interface_scope(ifname, ip), "ifnames": ",".join(name for name, _ip in listed),
            "scopes": ",".join(interface_scope(name, addr) for name, addr in listed)}


#: `LineEvents.rewritten_low` while no event was replaced or dropped
NO_REWRITE = 1 << 62


@dataclass
class LineEvents(LineStreams):
    """A file's events, and how a line's reading becomes one: the second layer of `FileState`."""

    events: list[Event] = field(default_factory=list)
    #: (host, pid, NCCL rank, nranks) already told by a rank-map line: one event each, not one per channel line
    rank_maps: set[tuple] = field(default_factory=set)
    #: (host, pid, comm, NCCL rank) of the `Init START` lines whose COMPLETE is not read yet: their event's index
    init_starts: dict[tuple, int] = field(default_factory=dict)
    #: per stream, its last generic NCCL error events: [index in events, handled, stream's lines, the event]
    generic: dict[object, list[list]] = field(default_factory=dict)
    #: per stream that one process writes, the exceptions it logged that a later line may show it survived
    watching: dict[object, _Watch] = field(default_factory=dict)
    #: the lowest index of an event replaced or dropped since `repeated_blocks` last looked (NO_REWRITE: none; a
    #: repeated block is replayed only over lines that rewrote none but their own)
    rewritten_low: int = NO_REWRITE

    def _rewrote(self, index: int) -> None:
        """The event at `index` (and those after it, where dropped) is replaced or dropped."""
        if index < self.rewritten_low:
            self.rewritten_low = index

    def _time(self, time_text: str | None, body: str, plan: TimePlan = EVERY_FORM) -> tuple[float | None, str | None]:
        """The time of a line: its prefix's, else the first one in its text (`plan`: where that can be)."""
        found = parse_time(time_text, self.year) if time_text else None
        found = found or parse_planned(body, plan, self.year)
        return (found[0], found[1]) if found else (None, None)

    def _emit(self, lineno: int, kind: str, body: str, rank: int | None, host: str | None, pid: int | None,
              local: int | None, time_text: str | None, sig=None, fields: tuple = (), time: float | None = None,
              family: str | None = None, stream: object = None, plan: TimePlan = EVERY_FORM) -> None:
        if time is None:
            time, family = self._time(time_text, body, plan)
        if rank is not None and (rank == self.label_rank or (self.source.task_file and self.prefix_rank is None
                                                             and rank == self.source.rank)):
            fields = (*fields, ("srun_task", str(rank)))
        if host is not None and host in self.tag_hosts and host not in self.carried_hosts:
            fields = (*fields, (HOST_TAG, "1"))  # a host only where another place names it (parse.tag_hosts)
        failure = sig is not None and kind not in FACT_KINDS
        if failure:
            fields = (*fields, ("accuses", sig.accuses))  # what engine.with_accuses would add, without a copy
        self.events.append(new_event(  # Event's fields, in order
            self.source.display, lineno, kind, body[:2000], rank, canonical(host), pid, local, time, family,
            sig.cause if failure else None, sig.role if failure else None, sig.id if sig else None,
            sig.priority if sig else 0, canonical_fields(fields)))
        if sig is not None and sig.id in GENERIC_NCCL_SIGNATURES:
            self._note_generic(stream if stream is not None else self.stream_now)
        if failure and kind == "exception" and sig.role != "victim":
            self._watch(stream if stream is not None else self.stream_now)

    def _one_writer(self, stream: object) -> bool:
        """Whether one process writes `stream`: a rank's own prefix (`[rank3]:`, torchrun's `[default3]:`), srun's
        label outside torchrun (there a label is a node's agent and its workers), or any line of a file named for
        one rank. An unprefixed console log of several processes is not: its next lines may be anyone's."""
        info = self.streams.get(stream)
        if info is None or not isinstance(stream, tuple):
            return False
        torchrun = self.summary is not None and self.summary.torchrun
        if info[4] is not None or stream[1] is not None:
            return True
        if info[3] is not None:
            return not torchrun
        src = self.source  # a file named for one rank: its lines are that rank's, whatever tag its script puts first
        return (src.rank is not None or src.local_rank is not None) and not (src.task_file and torchrun)

    def _watch(self, stream: object) -> None:
        """The exception just appended waits for its stream's next lines: one saying the process went on makes it
        a fact of the rank's life (`_went_on`), not its failure."""
        if self._one_writer(stream):
            reach = WATCH_OWN_LINES
        elif self.events[-1].rank is None:  # an unprefixed console, a host's (pdsh) lines: several processes
            reach = WATCH_SHARED_LINES
        else:
            return
        watch = self.watching.pop(stream, None)
        logged = (watch.logged if watch else [])[-(WATCHED_PER_STREAM - 1):]
        logged.append((len(self.events) - 1, self.events[-1]))
        self.watching[stream] = _Watch(logged, self.handled, self.stream_lines.get(stream, 0), reach)

    def _went_on(self, stream: object, body: str, lineno: int, failed: bool) -> None:
        """Read a line for the exceptions waiting on its stream: a line that is no failure (`failed`) and that a
        `went_on` rule matches turns them into `went_on` facts; a watch past its reach is dropped."""
        oldest = next(iter(self.watching))
        if self.handled - self.watching[oldest].handled_at > WATCH_FILE_LINES:
            del self.watching[oldest]
        watch = self.watching.get(stream)
        if watch is None:
            return
        if self.stream_lines.get(stream, 0) - watch.own_at > watch.reach:
            del self.watching[stream]
            return
        rule = None if failed else self.sigs.went_on.says(body)
        if rule is None:
            return
        del self.watching[stream]
        for index, e in watch.logged:
            if index < len(self.events) and self.events[index] is e:
                self._rewrote(index)
                kept = tuple(f for f in e.fields if f[0] != "accuses")
                self.events[index] = evolve(e, kind="went_on", cause=None, role=None, fields=canonical_fields(
                    (*kept, ("went_on", rule), ("went_on_line", str(lineno)))))

    def _note_generic(self, stream: object) -> None:
        """The event just appended is a generic NCCL error of `stream`: a `Last error:` of it may explain it."""
        found = self.generic.setdefault(stream, [])
        found.append([len(self.events) - 1, self.handled, self.stream_lines.get(stream, 0), self.events[-1]])
        del found[:-5]

    def _signature_event(self, sig: Signature, groups: dict[str, str], body: str, lineno: int,
                         time_text: str | None, rank: int | None, local: int | None, host: str | None,
                         ns: tuple[str, int] | None, named_rank: int | None, time: TimePlan = EVERY_FORM) -> bool:
        """The event of a line that `sig` matched with these groups (NCCL's `host:pid` head `ns`, the rank a
        `[Rank N]` tag in its body names); False when it only repeats a rank-map fact already told. `time`: where
        its text holds a time (a recipe knows)."""
        carried = (ns[0] if ns else None) or groups.get("host")  # NCCL's head, the line's own words
        if carried:
            self.carried_hosts.add(carried)
        ev_host = carried if carried and (host is None or host in self.tag_hosts) else host
        pid = ns[1] if ns else small_int(groups.get("pid"))
        if rank is None and sig.kind not in ("slurm_task",) and sig.accuses != "host":
            rank = small_int(groups.get("rank"))  # a node's report (NCCL's duplicate GPU) names ranks, not its own
        if rank is None and ns is None:
            rank = named_rank
        if local is None:
            local = small_int(groups.get("local_rank"))
        if sig.kind == "nccl_rank_map":
            key = (ev_host, pid, groups.get("nccl_rank"), groups.get("nranks"))
            if key in self.rank_maps:
                return False
            self.rank_maps.add(key)
        if sig.kind == "interface" and "ip" in groups:
            groups |= interface_fields(body, groups["ifname"], groups["ip"])
        self._emit(lineno, sig.kind, body, rank, ev_host, pid, local, time_text, sig=sig,
                   fields=tuple(sorted(groups.items())), plan=time)
        return True

    def _attempt_start(self, body: str, lineno: int, host: str | None) -> bool:
        """The event of Slurm's restart count in a line that names it (`attempt_start`), if it says one."""
        m = _RESTART.search(body)
        if m:
            self._emit(lineno, "attempt_start", body, None, host, None, None, None, fields=(("attempt", m[1]),))
        return m is not None

    def _rank_info(self, body: str, lineno: int) -> bool:
        """The event of submitit's `JobEnvironment(...)` in a line that names it (`rank_info`), if it is whole."""
        m = _SUBMITIT_ENV.search(body)
        if m:
            self.carried_hosts.add(m["host"])
            self._emit(lineno, "rank_info", body, int(m["rank"]), m["host"], None, int(m["local"]), None,
                       fields=(("node", m["node"]), ("world_size", m["world"])))
        return m is not None

    def _nccl_init_line(self, body: str, lineno: int, rank: int | None, host: str | None, local: int | None,
                        time_text: str | None) -> bool:
        """The event of NCCL's `Init` line of a communicator in a line that says `Init ` (`_nccl_init`), if it is
        one; its process is the one NCCL's `host:pid` head names, if any."""
        m = NCCL_INIT.search(body)
        ns = nccl_source(body)
        if m:
            if ns:
                self.carried_hosts.add(ns[0])
            self._nccl_init(m, body, lineno, rank, host if not ns else ns[0], ns[1] if ns else None, local, time_text)
        return m is not None

    def _nccl_init(self, m: re.Match[str], body: str, lineno: int, rank: int | None, host: str | None,
                   pid: int | None, local: int | None, time_text: str | None) -> None:
        """NCCL's `Init START` (2.19+) or `Init COMPLETE` line of a communicator, its stage in field `init`. A START
        whose COMPLETE follows says `complete` from then on (the COMPLETE then repeats it: `without_told_facts`); one
        without stays `start`: the process was still waiting for its peers in the collective init."""
        stage = "complete" if m["stage"] == "COMPLETE" else "start"
        fields = (("nccl_rank", m["rank"]), ("nranks", m["nranks"]), ("comm", m["comm"]))
        key = (host, pid, m["comm"], m["rank"])
        started = self.init_starts.pop(key, None) if stage == "complete" else None
        e = self.events[started] if started is not None and started < len(self.events) else None
        if e is not None and e.kind == "nccl_init" and (e.host, e.pid, e.get("comm"), e.get("nccl_rank")) == key \
                and e.get("init") == "start":  # (the list may have changed since: a joined head's events dropped)
            self._rewrote(started)
            self.events[started] = evolve(e, fields=canonical_fields(tuple(
                ("init", "complete") if f == ("init", "start") else f for f in e.fields)))
        if stage == "start" and len(self.init_starts) < MAX_CHANNEL_KEYS:  # as many as channel keys: one per process
            self.init_starts[key] = len(self.events)
        self._emit(lineno, "nccl_init", body, rank, host, pid, local, time_text, fields=(*fields, ("init", stage)))
