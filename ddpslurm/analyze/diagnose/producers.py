"""Evidence producers: each reads the job's timeline and emits weighted votes for who failed first and why.

In: a job's timeline (timeline.py). Out: `all_votes`, every producer's `Vote`s (votes.py) in the order of
`PRODUCERS`, the list the combiner (combiner.py) runs and weighs, in the order their reasons are shown. A vote names
a rank, a host, or nobody (a cause for the job as a whole), with a weight and the reason in words. Producers know
message *kinds* and the fields signatures capture (DESIGN.md, analyzer/signatures/README.md), never a signature id;
they live by what they read: own_reports.py (a rank's, a host's or Slurm's own report), peers.py (peers victims
name), collectives.py (watchdog timeouts, stacks, flight recorder, desync reports), barriers.py (barriers, the
store, NCCL's init) and job_setup.py (interfaces, versions, world size, rank numbers).

Weights, on one scale, and what each producer's votes are (its traits) are declared in analyzer/combiner.toml
(knowledge.py): a rank's own decisive failure (an OOM, an exception, a segfault) 50-100; srun's first task to die
before the teardown 40; a rank missing from what every other rank reports 30 shared among the missing; a peer named
by its victims 8 + 4 per accusing rank; a rank whose log stops early 12 shared.
"""

from __future__ import annotations

from collections.abc import Callable

from ddpslurm.analyze.diagnose.barriers import barrier_counts, stuck_in_nccl_init
from ddpslurm.analyze.diagnose.collectives import (
    desync_reports,
    desync_verdicts,
    flight_recorder,
    hang_stacks,
    timed_out_alike,
    timeout_reporters,
)
from ddpslurm.analyze.diagnose.job_setup import duplicate_ranks, interface_picks, odd_versions, ranks_beyond_world
from ddpslurm.analyze.diagnose.own_reports import (
    agent_teardown,
    detectors_and_hosts,
    job_events,
    logs_that_stop_early,
    own_failures,
    srun_task_deaths,
    vanished_ranks,
)
from ddpslurm.analyze.diagnose.peers import named_peers
from ddpslurm.analyze.diagnose.timeline import JobTimeline
from ddpslurm.analyze.diagnose.votes import Vote

#: every producer the combiner runs, in the order their reasons are reported
PRODUCERS: tuple[Callable[[JobTimeline], list[Vote]], ...] = (
    job_events, own_failures, detectors_and_hosts, srun_task_deaths, vanished_ranks, agent_teardown,
    barrier_counts, timeout_reporters, timed_out_alike, named_peers, odd_versions, interface_picks, ranks_beyond_world,
    logs_that_stop_early, hang_stacks, flight_recorder, stuck_in_nccl_init, duplicate_ranks, desync_reports,
    desync_verdicts,
)


def all_votes(tl: JobTimeline) -> list[Vote]:
    """Every producer's votes on `tl`, in the order of PRODUCERS."""
    return [vote for producer in PRODUCERS for vote in producer(tl)]
