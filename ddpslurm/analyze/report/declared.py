"""What the knowledge declares for a verdict: its summary template, advice, retry and whether its node is excluded.

In: the verdict, its timeline, the chosen line's signature and the cause's defaults (`analyzer/causes.toml`).
Out: `Declared`, the most specific declaration first: an InfiniBand completion status the decisive line carries
(`analyzer/ib_status.toml`), else a shape of the cause the job's failure lines take (`[[<cause>.shapes]]`), then
the signature's, then the cause's. Which applies is read from that data; no cause or signature is named here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddpslurm.analyze.diagnose.combiner import Verdict
from ddpslurm.analyze.diagnose.timeline import JobTimeline
from ddpslurm.analyze.rules.cause_shapes import CauseShape, shape_of
from ddpslurm.analyze.rules.ib_status import IbStatus
from ddpslurm.analyze.rules.signatures import CauseInfo, Signature, SignatureSet

#: what may declare a summary, retry, exclusion and advice over a signature's and its cause's
Override = IbStatus | CauseShape


@dataclass
class Declared:
    """The templates and semantics that apply to one verdict, and the values they may name."""

    template: str
    advice: list[str]
    retry: str
    exclude_node: bool
    values: dict[str, Any] = field(default_factory=dict)


def declared(verdict: Verdict, tl: JobTimeline, sig: Signature | None, info: CauseInfo | None,
             sigs: SignatureSet) -> Declared:
    """The summary template, advice templates (unfilled, in order, once each), retry and exclusion of `verdict`."""
    status = completion_status(verdict, sigs)
    found = shape_of(info.shapes, tl.failure_lines(), verdict.cause) if info else None
    values: dict[str, Any] = {}
    for said in (status, found):
        if said is not None:
            values.update(said.values())
    over: Override | None = status or (found.shape if found else None)
    template = (over.summary if over and over.summary else None) or \
        (sig.summary if sig and sig.summary else None) or (info.summary if info else verdict.cause.replace("_", " "))
    # a declaration that replaces the cause's advice says what to do first; one that keeps it adds to it
    replaces = over is not None and not over.cause_advice
    lines = [*(over.advice if replaces else ()), *(sig.advice if sig else ()),
             *(info.advice if info and not replaces else ()), *(over.advice if over and not replaces else ())]
    retry = (over.retry if over and over.retry else None) or (sig.retry if sig and sig.retry else None) or \
        (info.retry if info else "unknown")
    exclude = next((x for x in (over.exclude_node if over else None, sig.exclude_node if sig else None)
                    if x is not None), info.exclude_node if info else False)
    return Declared(template=template, advice=list(dict.fromkeys(lines)), retry=retry, exclude_node=exclude,
                    values=values)


def completion_status(verdict: Verdict, sigs: SignatureSet) -> IbStatus | None:
    """The InfiniBand completion status that decides the advice (analyzer/ib_status.toml): the chosen line's, else
    that of the first line of the verdict's cause among its support that carries one."""
    table = sigs.ib_statuses
    found = table.of(verdict.chosen)
    if found is None:
        found = next((s for e in verdict.support if e.cause == verdict.cause
                      for s in (table.of(e),) if s is not None), None)
    return found
