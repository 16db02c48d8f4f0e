"""Votes, the evidence producers' one output, and what several producers read of a timeline alike.

In: a job's timeline (timeline.py) and its events. Out: the `Vote` a producer emits, one piece of evidence that a
rank, a host or nobody (the job as a whole) failed first, of a cause, with a weight and the reason in words; and
the small readings producers share: whom a line accuses, whether a rank spoke of its own, a log's small numbers,
the world size the input bounds, a list of ranks as the reasons show it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddpslurm.analyze.diagnose.knowledge import Producer, producer
from ddpslurm.analyze.diagnose.resolve import plausible_world
from ddpslurm.analyze.diagnose.timeline import JobTimeline, RankTimeline
from ddpslurm.analyze.model import Event

#: kinds a rank logs only because another rank or Slurm ended it: never its own failure
QUIET_KINDS = ("exit_signal", "slurm_task", "slurm_job", "agent_sigterm", "agent", "exit")
#: lines that report a death (a launcher's or ddpslurm's exit report), not what caused it
DEATH_REPORT_KINDS = ("agent_failed", "elastic_failure", "exit_signal", "exit")


@dataclass(frozen=True)
class Vote:
    """One piece of evidence: `rank` (or `host`, or neither: the job) failed first, of `cause`."""

    producer: str
    weight: float
    why: str
    rank: int | None = None
    host: str | None = None
    cause: str | None = None
    evidence: tuple[Event, ...] = ()
    time: float | None = None
    time_family: str | None = None
    own: bool = False  # the rank's own failure (it can be ordered in time against other ranks' failures)

    def __post_init__(self) -> None:
        producer(self.producer)  # a producer analyzer/combiner.toml does not declare is a programming error

    @property
    def info(self) -> Producer:
        """What its producer's votes are (analyzer/combiner.toml): the combiner reads this, never the name."""
        return producer(self.producer)


def accuses(e: Event) -> str:
    """The signature's `accuses` (the engine copies it into the event's fields); records follow their role."""
    return e.get("accuses") or ("none" if e.role == "victim" else "self")


def loud(rt: RankTimeline) -> bool:
    """The rank logged a failure other than being ended by another rank or Slurm (QUIET_KINDS)."""
    return any(e.kind not in QUIET_KINDS for e in rt.failures)


def small_int(value: str | None) -> int | None:
    """A rank, count or size as a line writes it: a non-negative int of at most 9 digits, else None."""
    return int(value) if value and value.isdigit() and len(value) < 10 else None


def rank_list(ranks: list[int]) -> str:
    """Ranks as a reason shows them: the first five, then how many more."""
    return ", ".join(map(str, ranks[:5])) + (f" and {len(ranks) - 5} more" if len(ranks) > 5 else "")


def bounded_world(tl: JobTimeline) -> int | None:
    """The job's world size where the ranks present (or launched) make it plausible, else None: a number a log
    made up does not make producers count ranks that never were."""
    world = tl.world_size
    facts = tl.facts
    bound = plausible_world(len(facts.present), max(facts.present, default=-1) + 1)
    return world if world and world <= max(bound, facts.launched_world or 0) else None
