"""Values shared between events: a value in, the one object this process holds for values equal to it out.
A worker's events repeat the same hosts, field pairs and whole field tuples (16k ranks' alike watchdog lines);
each is kept once, so that a batch's pickle carries one copy of it rather than one per event. The memo is bounded:
past `MAX_CANONICAL` entries it is forgotten, so that a log of unique values cannot grow it.
"""

from __future__ import annotations

from ddpslurm.analyze.rules.signatures import remember

#: values a worker shares between its events instead of holding one copy per line (hosts, field pairs, whole
#: field tuples: 16k ranks' alike watchdog lines); bounded, so that a log of unique values cannot grow it (a test
#: starts from an empty one)
CANONICAL: dict = {}
MAX_CANONICAL = 200_000


def canonical(value):
    """One shared object for equal values (their pickle then carries one copy per batch, not one per event)."""
    if value is None:
        return None
    found = CANONICAL.get(value)
    if found is not None:
        return found
    remember(CANONICAL, value, value, MAX_CANONICAL)
    return value


def canonical_fields(fields: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """`fields` made of shared pairs (a rank's number differs, its op, timeout and sequence number do not)."""
    memo = CANONICAL
    found = memo.get(fields)
    if found is not None:
        return found
    if len(memo) + len(fields) >= MAX_CANONICAL:
        memo.clear()  # as `remember` does, once for the pairs and the tuple
    shared = tuple([memo.setdefault(pair, pair) for pair in fields])
    return memo.setdefault(shared, shared)
