"""The compiled signature set: every signature in priority order, the scanner's anchors, and matching a line.

In: validated `Signature`s and the cause table (loading.py reads them from TOML). Out: a `SignatureSet` whose
`match` gives a line's highest-priority signature and its match. The scanner's cheap prefilter is built here: a
buffer is searched for a few byte strings (ANCHORS) before any regex runs, and only lines holding one are parsed.
A matching line holds ANY ONE of a signature's `prefilter` literals, so every literal must contain an anchor; a
literal that contains none (a site's `SITE GPU FAULT`) becomes an anchor itself. Per line, a signature's regex
runs only when one of its literals is in the line; what the set derives and learns to decide that quickly lives
in its `MatchCaches` (match_cache.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regex

from ddpslurm.analyze.rules.cause_shapes import CauseShape
from ddpslurm.analyze.rules.digit_shape import digit_blind, has_run, line_shape, shape
from ddpslurm.analyze.rules.hex_runs import run_blind
from ddpslurm.analyze.rules.ib_status import IbStatuses
from ddpslurm.analyze.rules.match_cache import MatchCaches, ShapePlan
from ddpslurm.analyze.rules.went_on import WentOn

#: the header of the entry torchelastic names as the first failure: a block is read from it even where the lines
#: above it (the ChildFailedError, `Failures:`) are not in the input (a paste that starts there)
ROOT_CAUSE_HEADER = "Root Cause (first observed failure)"
#: Short substrings that nearly every interesting line contains one of; signature literals that contain an
#: anchor are found through it, the others become anchors themselves. Case-sensitive, like all prefilters.
ANCHORS: tuple[str, ...] = (
    "rror", "Traceback", "WARN", "Init COMPLETE", "atchdog", "ignal", "illed", "exitcode", "imed out", "RESTART_COUNT",
    ROOT_CAUSE_HEADER,  # torchelastic's failure block, read from it when its head is cut off
)
#: looked for only in the first HEAD_BYTES of a file (submitit writes it first)
HEAD_ANCHORS: tuple[str, ...] = ("JobEnvironment(",)
#: seconds one signature's regex may run on one line before that line is skipped for that signature
MATCH_TIMEOUT = 0.25
#: shipped signatures run untimed on lines up to this long (tests/unit/test_analyze_inputs.py checks them on
#: adversarial lines of this length); site signatures and longer lines always run with MATCH_TIMEOUT
UNTIMED_CHARS = 512
#: lines up to this long have their shape's plan remembered (and the scanner's recipes and inert shapes): torch's
#: flight recorder dump line, 600+ characters on every rank, is read in full once, not once per rank
PLANNED_CHARS = 4096
#: line shapes whose plan a SignatureSet remembers (lines of at most PLANNED_CHARS characters)
MAX_PLANS = 20_000
#: signature kinds the engine attaches to events it builds itself (never matched against a raw line)
ENGINE_KINDS = ("elastic_failure",)


@dataclass(frozen=True)
class Signature:
    """One compiled failure signature."""

    id: str
    cause: str
    role: str
    pattern_text: str
    prefilter: tuple[str, ...]
    priority: int = 0
    advice: tuple[str, ...] = ()
    summary: str | None = None
    retry: str | None = None
    exclude_node: bool | None = None
    kind: str = "signature"
    source: str = ""
    accuses: str = "self"

    @property
    def pattern(self) -> regex.Pattern:
        """The compiled pattern (compiled on first use: most signatures never see a candidate line)."""
        return compile_pattern(self.pattern_text)


@functools.cache
def compile_pattern(pattern: str) -> regex.Pattern:
    """`pattern` compiled, once per process."""
    return regex.compile(pattern)


@dataclass(frozen=True)
class CauseInfo:
    """Cause-level defaults from `analyzer/causes.toml`."""

    cause: str
    summary: str
    advice: tuple[str, ...] = ()
    retry: str = "unknown"
    exclude_node: bool = False
    node_level: bool = False  # the cause lives on a node (a port, a NIC, a GPU, the node itself)
    #: shapes of the cause that say otherwise about a resubmission (`[[<cause>.shapes]]`, cause_shapes.py)
    shapes: tuple[CauseShape, ...] = ()


def memo_key(masked: str | bytes) -> str | bytes | tuple[str, bytes]:
    """What a memo of line shapes files `masked` (a line's shape) under: the shape itself up to UNTIMED_CHARS, a
    128-bit digest of it beyond, so that a memo full of long shapes stays small."""
    if len(masked) <= UNTIMED_CHARS:
        return masked
    data = masked.encode("utf-8", "surrogatepass") if isinstance(masked, str) else masked
    import hashlib  # a long line's digest only: not every run needs it

    return ("blake2b", hashlib.blake2b(data, digest_size=16).digest())


def remember(memo: dict, key: Any, value: Any, limit: int) -> None:
    """`memo[key] = value`, the memo emptied first when it holds `limit` entries (none with a limit of 0).

    A memo that stopped learning once full would keep the shapes of the first files alone: a 65k-rank job's
    NCCL `Trees` lines (a shape per rank) filled the plans before the watchdog lines came, whose shapes then went
    unplanned for the rest of the job, each of their lines matched in full. Emptied, the shapes in use are learned
    again within a few lines."""
    if limit <= 0:
        return
    if len(memo) >= limit:
        memo.clear()
    memo[key] = value


def shipped_dir() -> Path:
    """The shipped signature folder (its signatures are tested: they run untimed on short lines)."""
    from ddpslurm._data import data_dir

    return data_dir("analyzer") / "signatures"


@dataclass
class SignatureSet:
    """All signatures, ordered by priority (highest first), with the scanner's anchors; matches lines to them."""

    signatures: list[Signature]
    causes: dict[str, CauseInfo] = field(default_factory=dict)
    anchors: tuple[bytes, ...] = ()
    always: tuple[Signature, ...] = ()
    #: signature id -> lines on which its regex ran past MATCH_TIMEOUT (this process)
    timeouts: dict[str, int] = field(default_factory=dict, repr=False)
    #: the literal index matching reads and the memos per line shape it and the scanner fill (this process)
    caches: MatchCaches = field(default_factory=MatchCaches, repr=False)
    #: the lines that say a process went on after an exception it logged (analyzer/went_on.toml)
    went_on: WentOn = field(default_factory=WentOn, repr=False)
    #: InfiniBand completion statuses and what each says about a resubmission (analyzer/ib_status.toml)
    ib_statuses: IbStatuses = field(default_factory=IbStatuses, repr=False)

    def match(self, text: str) -> tuple[Signature, regex.Match] | None:
        """The highest-priority signature matching `text` (a line without its prefixes), or None.

        A signature whose regex runs past MATCH_TIMEOUT on this line is skipped for this line only (counted in
        `timeouts`), never the file: a catastrophic site pattern cannot hang or blind the analysis.

        What the digit-blind signatures decide is remembered per line shape (`digit_shape.line_shape`; run-blind
        ones too where it has hex runs, `hex_runs`): a line of a shape seen before runs the other signatures it may
        hold, then only the one blind signature that matched (for its groups), instead of every candidate's regex.
        """
        if len(text) > PLANNED_CHARS:
            return self.match_all(text)
        key = memo_key(line_shape(text))
        plans = self.caches.plans
        plan = plans.get(key)
        if plan is None:
            found, plan = self._match_and_plan(text)
            if plan is not None:
                remember(plans, key, plan, MAX_PLANS)
            return found
        return self._match_planned(text, plan)

    def only_sensitive(self, text: str) -> tuple[int, ...] | None:
        """The signatures that alone may match a line of `text`'s shape, whatever its digits, as the plan `match`
        made for that shape tells: its digit-sensitive candidates (often none), when no digit-blind signature
        matched it and no literal holding digits may be in such a line. None when unsure (no plan, a long line)
        or when a digit-blind signature matches. Run them with `first_match`."""
        plan = self._shape_plan(text)
        return None if plan is None or plan.first_blind is not None else plan.sensitive

    def replay_checks(self, text: str) -> tuple[int, ...] | None:
        """The signatures that alone may make a line of `text`'s shape match otherwise than `text` does, whatever
        its digits: the digit-sensitive candidates `match` tries before the one digit-blind signature that matches
        (or before none). Where none of them matches a line of that shape, `match` gives it the same signature at
        the same spans as `text`. None when unsure (no plan, a long line, a literal holding digits may be in it)."""
        plan = self._shape_plan(text)
        if plan is None:
            return None
        limit = plan.first_blind if plan.first_blind is not None else len(self.signatures)
        return tuple(i for i in plan.sensitive if i < limit)

    def _shape_plan(self, text: str) -> ShapePlan | None:
        """The plan `match` made for `text`'s shape, where it holds for every line of that shape: None without one
        (a long line, a shape not met yet) or where a literal holding digits may be in such a line."""
        caches = self.caches
        masked = line_shape(text) if len(text) <= PLANNED_CHARS else None
        plan = caches.plans.get(memo_key(masked)) if masked is not None else None
        if plan is None:
            return None
        loose = shape(masked)  # a digit kept before an `x` counts as any digit: a literal's shape is all 0s
        if any(lit in loose for lit in caches.digit_literal_shapes) or (caches.run_literals and has_run(text)):
            return None
        return plan

    def is_sensitive(self, sig: Signature, runs: bool = False) -> bool:
        """Whether `sig`'s regex or literals may tell apart two lines of the same shape (digit_shape), of a shape
        with hex runs if `runs` (hex_runs)."""
        return self._sensitive(self.index_of(sig), runs)

    def _sensitive(self, i: int, runs: bool = False) -> bool:
        """Whether signature i is not digit-blind (or, if `runs`, not run-blind), found out the first time it is
        asked (parsing a pattern is not cheap: a short paste asks about a few signatures, not all of them)."""
        caches = self.caches
        found = caches.sensitivity.get(i)
        if found is None:
            found = caches.sensitivity[i] = not self._passes(digit_blind, i)
        if found or not runs:
            return found
        in_runs = caches.run_sensitivity.get(i)
        if in_runs is None:
            in_runs = caches.run_sensitivity[i] = not self._passes(run_blind, i)
        return in_runs

    def _passes(self, blind: Callable[[str, tuple[str, ...]], bool], i: int) -> bool:
        """Whether signature i is blind by `blind` (digit_blind, run_blind) in its regex and literals (its prefilter's,
        those every match holds); one of the kinds never matched against a line is."""
        sig = self.signatures[i]
        required = self._indexed().required.get(i, ())
        return sig.kind in ENGINE_KINDS or blind(sig.pattern_text, (*sig.prefilter, *required))

    def index_of(self, sig: Signature) -> int:
        """The position of `sig` among the signatures (priority order)."""
        caches = self.caches
        i = caches.positions.get(sig.id)
        if i is None or i >= len(self.signatures) or self.signatures[i] is not sig:
            caches.positions = {s.id: n for n, s in enumerate(self.signatures)}
            i = caches.positions.get(sig.id)
            if i is None or self.signatures[i] is not sig:  # a set built with one id twice: by identity
                return next(n for n, s in enumerate(self.signatures) if s is sig)
        return i

    def _indexed(self) -> MatchCaches:
        """The caches, their literal index built first if it is not yet (at the first line matched)."""
        caches = self.caches
        if not caches.by_literal:
            caches.index(self.signatures, str(shipped_dir()), ENGINE_KINDS)
        return caches

    def _search(self, i: int, text: str) -> regex.Match | None:
        """Signature i's match in `text`, None when it cannot or does not match; TimeoutError (counted in
        `timeouts`) when its regex runs past MATCH_TIMEOUT."""
        sig = self.signatures[i]
        caches = self.caches
        required = caches.required.get(i)
        if required is not None and not any(lit in text for lit in required):
            return None  # every match holds one (derive_any_literal): the regex cannot match
        try:
            if len(text) > UNTIMED_CHARS or i not in caches.shipped:
                return sig.pattern.search(text, timeout=MATCH_TIMEOUT)
            return sig.pattern.search(text)  # shipped patterns on short lines: tested linear, the timer costs
        except TimeoutError:
            self.timeouts[sig.id] = self.timeouts.get(sig.id, 0) + 1
            raise

    def first_match(self, text: str, indexes: Iterable[int]) -> tuple[Signature, regex.Match] | None:
        """The first of these signatures (indexes, priority order) that matches `text`; one that times out is
        passed."""
        for i in indexes:
            try:
                m = self._search(i, text)
            except TimeoutError:
                continue
            if m:
                return self.signatures[i], m
        return None

    def match_all(self, text: str) -> tuple[Signature, regex.Match] | None:
        """`match` without the per-shape plans: every candidate that `text`'s literals let through is tried."""
        return self.first_match(text, self._indexed().candidates(text)[0])

    def _match_and_plan(self, text: str) -> tuple[tuple[Signature, regex.Match] | None, ShapePlan | None]:
        """The match, and what holds for every line of `text`'s shape: the digit-sensitive candidates let through
        by digit-free literals, and the first digit-blind signature that matches (None: none does). No plan when
        a digit-blind regex timed out (that is not a property of the shape)."""
        caches = self._indexed()
        runs = has_run(text)
        order, clean = caches.candidates(text, runs)
        found: tuple[Signature, regex.Match] | None = None
        first_blind = None
        for i in order:
            blind = not self._sensitive(i, runs)
            if found is not None and not blind:
                continue
            try:
                m = self._search(i, text)
            except TimeoutError:
                if blind:
                    return found or self.first_match(text, (j for j in order if j > i)), None
                continue
            if m and found is None:
                found = self.signatures[i], m
            if m and blind:
                first_blind = i
                break
        masked = shape(line_shape(text))
        sensitive = tuple(i for i in order if i in clean and caches.may_match_shape(i, text, masked, runs)
                          and self._sensitive(i, runs))
        return found, ShapePlan(sensitive, first_blind)

    def _match_planned(self, text: str, plan: ShapePlan) -> tuple[Signature, regex.Match] | None:
        limit = plan.first_blind if plan.first_blind is not None else len(self.signatures)
        sensitive = set(plan.sensitive)
        caches = self.caches
        gated = caches.digit_gated.items()
        if caches.run_gated and has_run(text):
            gated = [*gated, *caches.run_gated.items()]
        for i, literals in gated:
            if i < limit and i not in sensitive and any(lit in text for lit in literals):
                sensitive.add(i)
        found = self.first_match(text, sorted(i for i in sensitive if i < limit))
        if found is not None or plan.first_blind is None:
            return found
        try:
            m = self._search(plan.first_blind, text)
        except TimeoutError:
            m = None
        if m is None:  # cannot happen for a digit-blind pattern; the full path decides if it ever does
            return self.match_all(text)
        return self.signatures[plan.first_blind], m

    def by_id(self, sig_id: str) -> Signature | None:
        """The signature named `sig_id`."""
        return next((s for s in self.signatures if s.id == sig_id), None)


def build_set(signatures: Iterable[Signature], causes: dict[str, CauseInfo] | None = None,
              went_on: WentOn | None = None) -> SignatureSet:
    """Order signatures by priority and compute the anchors of the prefilter."""
    ordered = sorted(signatures, key=lambda s: -s.priority)
    anchors: list[str] = list(ANCHORS)
    for sig in ordered:
        if sig.kind in ENGINE_KINDS:
            continue
        for lit in sorted(sig.prefilter, key=len):  # a line may hold any ONE literal: each must be covered
            if not any(a in lit for a in anchors):
                anchors.append(lit)
    always = tuple(s for s in ordered if not s.prefilter)
    return SignatureSet(signatures=ordered, causes=causes or {}, anchors=tuple(a.encode() for a in anchors),
                        always=always, went_on=went_on or WentOn())
