"""Host names read from tags: kept only where a place that carries host names says them too (pure).

A tag shaped like a host name in front of a line (pdsh's and DeepSpeed's `node02: `, a pod collector's
`[trainer-1] `) has the shape of a script's own head (`GPU3: `, `Epoch1: `, `worker0: `, `[rank7] `): the scanner
marks an event whose host came from one (`host_tag`). Here, after every file is read, such a host stays only where
the job names it elsewhere: an event's host that no tag gave (NCCL's `host:pid:tid` head, srun's and slurmstepd's
lines, a record file, a path component), a field that holds a host (`host`, `peer_host`, `node`), or a list of
the job's hosts (DeepSpeed's `WORLD INFO DICT`). Otherwise the
event keeps the name as its `tag` field and names no host: a script's head never lands in `exclude_nodes`.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ddpslurm.analyze.model import Event

#: the field the scanner adds to an event whose host came from a tag (line_events._emit)
HOST_TAG = "host_tag"
#: event fields whose value is a host name a line or record states
HOST_FIELDS = ("host", "peer_host", "peer_host2", "node", "node_name")
#: event fields whose value lists the job's hosts (DeepSpeed's `{'node01': [0, 1], 'node02': [0, 1]}`)
HOSTLIST_FIELDS = ("hostlist",)
_LISTED = re.compile(r"['\"]([\w.-]+)['\"]\s*:")


def settle_hosts(events: list[Event]) -> list[Event]:
    """Events whose host came from a tag, their host kept where the job names it elsewhere, else moved to their
    `tag` field; the mark removed. The list is updated in place and returned."""
    if not any(e.get(HOST_TAG) for e in events):
        return events
    named = {e.host for e in events if e.host and not e.get(HOST_TAG)}
    named |= {v for e in events for k, v in e.fields if k in HOST_FIELDS and v}
    named |= {h for e in events for k, v in e.fields if k in HOSTLIST_FIELDS for h in _LISTED.findall(v)}
    short = {h.split(".", 1)[0] for h in named}
    for i, e in enumerate(events):
        if not e.get(HOST_TAG):
            continue
        fields = tuple(f for f in e.fields if f[0] != HOST_TAG)
        if e.host in named or (e.host or "").split(".", 1)[0] in short:
            events[i] = replace(e, fields=fields)
        else:
            events[i] = replace(e, host=None, fields=(*fields, ("tag", e.host or "")))
    return events
