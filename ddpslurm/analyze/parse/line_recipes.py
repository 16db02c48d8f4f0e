"""Lines known by their shape: a raw line (its digits and hex ids written as 0) in, its reading replayed or skipped
out.
The fifth layer of `FileState`. Most of a big job's candidate lines differ from one another only in their digits
(16k ranks' watchdog, rank-map and NCCL INFO lines). When every step a line went through decided by its shape alone,
the shape is remembered in the signature set's caches: as saying nothing (an inert line: its next ones are skipped
after only the few digit-sensitive signatures that could match them), or with a `LineRecipe` (its next ones are
read from the spans the first one left: its prefixes' values, its signature's groups, NCCL's `host:pid` head).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import regex

from ddpslurm.analyze.model import FACT_KINDS, new_event
from ddpslurm.analyze.parse import line_streams, shared_values
from ddpslurm.analyze.parse.attribution import BODY_RANK, NCCL_SOURCE, PrefixSpans, Span, number, piece
from ddpslurm.analyze.parse.continued_lines import LAST_ERROR, WRAPPED_HEAD, ContinuedLines
from ddpslurm.analyze.parse.line_events import GENERIC_NCCL_SIGNATURES, NCCL_INIT_ANY_DIGIT, interface_fields
from ddpslurm.analyze.parse.line_streams import SLURM_HEAD, TORCHRUN, UNPREFIXED, body_is_slurm, mentions_torchrun
from ddpslurm.analyze.parse.tag_hosts import HOST_TAG
from ddpslurm.analyze.parse.timestamps import EVERY_FORM, TimePlan, time_plan
from ddpslurm.analyze.read.bulk import BULK
from ddpslurm.analyze.rules.digit_shape import has_run, line_shape, shape
from ddpslurm.analyze.rules.signatures import Signature, SignatureSet, memo_key, remember

#: raw lines of at most this many bytes may be remembered as saying nothing (MatchCaches.inert_lines), and so many
MAX_INERT = 50_000

#: a date's shape: the prefix rules' one digit-sensitive part is its century (`19|20`)
DATE_SHAPE = b"0000-00-00"


def masked_shape(raw: bytes) -> bytes:
    """A raw line's `digit_shape.line_shape` (its digits written as 0 but one right before an `x`, its hex runs as
    0s; read byte for byte as Latin-1, whose every byte is one character and the same ASCII), then each date's
    century kept as written, the one digit the prefix rules read (`19|20`): the pure twin of `_bulk.shape`."""
    masked = line_shape(raw.decode("latin-1")).encode("latin-1")
    at = masked.find(DATE_SHAPE)
    if at < 0:
        return masked
    kept = bytearray(masked)
    while at >= 0:
        kept[at:at + 2] = raw[at:at + 2]
        at = masked.find(DATE_SHAPE, at + len(DATE_SHAPE))
    return bytes(kept)


_shape = BULK.shape if BULK is not None else masked_shape
if BULK is not None:
    BULK.replay_setup(new_event, shared_values, line_streams, UNPREFIXED, HOST_TAG, interface_fields)


def line_key(raw: bytes) -> object:
    """The memo key of a raw line (at most PLANNED_CHARS bytes): its shape with each date's century kept
    (`masked_shape`): lines of one key have the same spans."""
    return memo_key(_shape(raw))


#: raw line shapes a process remembers how to replay (MatchCaches.line_recipes)
MAX_RECIPES = 50_000
#: words of lines that are never replayed: start-up lines the scanner reads with patterns of its own, the head of a
#: torchelastic failure block, C++ frames, torch's `Last error:` (NCCL's `Init` lines: `NCCL_INIT_ANY_DIGIT`)
NOT_REPLAYED = ("JobEnvironment(", "RESTART_COUNT", "ChildFailedError", "frame #", LAST_ERROR)


@functools.cache
def recipe_patterns_blind(runs: bool = False) -> bool:
    """Whether every pattern a line recipe stands in for is digit-blind (digit_shape), and, for a line with hex
    runs, run-blind (hex_runs; the prefix rules never ending inside a run), as are the words it looks for: else
    no recipe is made (for such lines)."""
    from ddpslurm.analyze.parse import tracebacks
    from ddpslurm.analyze.parse.attribution import ANY_RULE, EMBEDDED_RANK, RULES
    from ddpslurm.analyze.rules.digit_shape import digit_blind
    from ddpslurm.analyze.rules.hex_runs import literal_run_blind, prefixes_run_blind, run_blind
    from ddpslurm.analyze.rules.signatures import ROOT_CAUSE_HEADER

    body_patterns = (NCCL_SOURCE, BODY_RANK, SLURM_HEAD, TORCHRUN, WRAPPED_HEAD, NCCL_INIT_ANY_DIGIT)
    patterns = (*(rule for rule, meaning in RULES if meaning != "time"), EMBEDDED_RANK, *body_patterns)
    if not all(digit_blind(p.pattern) for p in patterns):
        return False
    return not runs or (prefixes_run_blind([rule.pattern for rule, _ in RULES] + [ANY_RULE.pattern],
                                           [EMBEDDED_RANK.pattern])
                        and all(run_blind(p.pattern) for p in body_patterns)
                        and all(literal_run_blind(word) for word in (
                            *NOT_REPLAYED, ROOT_CAUSE_HEADER, "Init ", "INFO Channel ", "Rank ", "[rank", "[Rank",
                            tracebacks._START, tracebacks._UNRAISABLE)))


@dataclass(frozen=True, slots=True)
class LineRecipe:
    """How every line of one shape is read: where its prefixes' values and its text start, whether srun wrote it or
    it mentions torchrun, the signature that matches it (None: none) and where that match's groups, NCCL's
    `host:pid` head and a `[Rank N]` tag sit in its text (spans relative to the text after the prefixes)."""

    prefix: PrefixSpans
    slurm: bool
    torchrun: bool
    checks: tuple[int, ...] = ()  #: digit-sensitive signatures that, matching a line, make it read in full
    signature: int | None = None
    groups: tuple[tuple[str, int, int], ...] = ()
    source: tuple[Span, Span] | None = None
    body_rank: Span | None = None
    #: where its text holds a time, if anywhere (`time_plan`): its lines are searched for that form from there only
    time: TimePlan = EVERY_FORM
    #: the recipe as `_bulk.replay` reads it (`compiled_plan`); None: its lines are replayed in Python
    plan: tuple | None = None

    @classmethod
    def of(cls, body: str, spans: PrefixSpans, slurm: bool, torchrun: bool, checks: tuple[int, ...],
           hit: tuple[Signature, regex.Match] | None, sigs: SignatureSet) -> LineRecipe:
        """The recipe of a line whose text after the prefixes is `body`, which `hit` matched (or nothing)."""
        if hit is None:
            recipe = cls(spans, slurm, torchrun, checks)
            return recipe if BULK is None else replace(recipe, plan=compiled_plan(recipe, None))
        sig, m = hit
        groups = tuple((name, *m.span(name)) for name, value in sorted(m.groupdict().items()) if value is not None)
        head = NCCL_SOURCE.match(body)
        tag = BODY_RANK.search(body, 0, 400) if "Rank " in body else None
        recipe = cls(spans, slurm, torchrun, checks, sigs.index_of(sig), groups,
                     (head.span("host"), head.span("pid")) if head else None, tag.span("rank") if tag else None,
                     EVERY_FORM if has_run(body) else time_plan(shape(body)))
        return recipe if BULK is None else replace(recipe, plan=compiled_plan(recipe, sig))


def compiled_plan(recipe: LineRecipe, sig: Signature | None) -> tuple | None:
    """`recipe` as `_bulk.replay` reads it (read/_bulk_replay.h): its prefix spans (start, then rank, local rank,
    host, time and srun label, each a start and an end, -1 for none), the host tag, srun and torchrun flags, what its
    signature makes (kind, whether a failure, cause, role, id, priority, accuses, whether a rank comes from its
    groups, whether it is a rank map, whether an interface), its groups, NCCL's head, the `[Rank N]` tag and the
    time plan. None for the lines whose event a later line may rewrite or explain (a generic NCCL error, an
    exception that is watched for a sign its process went on): those are replayed in Python."""
    p = recipe.prefix
    spans = [p.start]
    for span in (p.rank, p.local_rank, p.host, p.time_text, p.label):
        spans += span if span is not None else (-1, -1)
    made = None
    if sig is not None:
        failure = sig.kind not in FACT_KINDS
        if sig.id in GENERIC_NCCL_SIGNATURES or (failure and sig.kind == "exception" and sig.role != "victim"):
            return None
        names = {name for name, _start, _end in recipe.groups}
        made = (sig.kind, failure, sig.cause, sig.role, sig.id, sig.priority, sig.accuses,
                sig.kind not in ("slurm_task",) and sig.accuses != "host", sig.kind == "nccl_rank_map",
                sig.kind == "interface" and "ip" in names)
    source = None if recipe.source is None else (*recipe.source[0], *recipe.source[1])
    return (tuple(spans), p.host_tag, recipe.slurm, recipe.torchrun, made, recipe.groups, source, recipe.body_rank,
            recipe.time)


@dataclass
class RememberedShapes(ContinuedLines):
    """The line shapes a file's reading remembers (in its signature set, for every file this process reads) and
    reads lines by: the fifth layer of `FileState`."""

    def note_recipe(self, key: object, raw: bytes, text: str, spans: PrefixSpans,
                    hit: tuple[Signature, regex.Match] | None, slurm: bool, torchrun: bool) -> None:
        """Remember how a line of shape `key` was read when every line of that shape is read the same way, whatever
        its digits: its next ones are then replayed from spans (`replay`) instead of read again (16k ranks'
        watchdog and rank-map lines).

        That holds when each step the line went through decides by its shape alone: the prefix rules (digit-blind
        but the timestamp's `19|20`: a date's century is kept in the key, `line_key`), the other patterns a recipe
        stands in for (`recipe_patterns_blind`; run-blind too for a line with hex runs, whose time is then searched
        in full), no start-up line the scanner reads with patterns of its own (`NOT_REPLAYED`; an NCCL `Init` line,
        which also settles its communicator's start), and the signatures: the blind one that matched, or none,
        decides unless one of a few sensitive ones matches (`SignatureSet.replay_checks`, run again on each line
        replayed); and when it left no state a later line depends on (nothing pending, no block opened:
        `must_read_on`; a logged exception watched is no such state, `replay` reads the line for it as
        `FileState.handle` does). Only printable ASCII lines."""
        runs = has_run(text)
        if (self.must_read_on or not raw.isascii() or text != raw.decode("ascii") or not recipe_patterns_blind(runs)):
            return
        body = text[spans.start:]
        if any(word in body for word in NOT_REPLAYED) or ("Init " in body and NCCL_INIT_ANY_DIGIT.search(body)):
            return
        if hit is not None and self.sigs.is_sensitive(hit[0], runs):
            return
        checks = self.sigs.replay_checks(body)
        if checks is None:
            return
        remember(self.sigs.caches.line_recipes, key,
                 LineRecipe.of(body, spans, slurm, torchrun, checks, hit, self.sigs), MAX_RECIPES)

    def replay(self, recipe: LineRecipe, text: str, lineno: int) -> bool:
        """Read a line the way `recipe` says every line of its shape is read (see `note_recipe`), unless one of the
        digit-sensitive signatures it lists matches this line: then False, and nothing was done."""
        if recipe.checks and self.sigs.first_match(text[recipe.prefix.start:], recipe.checks) is not None:
            return False
        if recipe.plan is not None and BULK is not None and not self.watching and \
                BULK.replay(self, recipe.plan, text, lineno):
            return True  # replayed in compiled code (read/_bulk_replay.h), this path its reference
        p = recipe.prefix.prefix(text)
        rank, local, host, stream = self._take_prefix(p, recipe.slurm, lineno)
        if recipe.torchrun and self.summary is not None:
            self.summary.torchrun = True
        body = p.text
        if recipe.signature is None:
            if self.watching:
                self._went_on(stream, body, lineno, False)
            return True
        groups = {name: body[start:end] for name, start, end in recipe.groups}
        ns = None if recipe.source is None else (piece(body, recipe.source[0]), number(body, recipe.source[1]))
        named = number(body, recipe.body_rank)
        sig = self.sigs.signatures[recipe.signature]
        self._signature_event(sig, groups, body, lineno, p.time_text, rank, local, host, ns, named, recipe.time)
        if self.watching:  # as `FileState.handle` reads a line while a logged exception is watched
            self._went_on(stream, body, lineno, sig.kind not in FACT_KINDS)
        return True

    def note_inert(self, key: object, raw: bytes, text: str, p, body: str) -> None:
        """Remember the shape `key` of a line that said nothing when every line of that shape says nothing,
        whatever its digits, unless one of a few digit-sensitive signatures matches it: its next ones are then
        skipped after only those (16k ranks' NCCL INFO lines).

        That holds when each step the line went through decides by its shape alone: the prefix rules (all
        digit-blind but the timestamp's `19|20`: kept in the key, `line_key`), the start-up patterns (digit-blind;
        `Init ` excluded, its `0x` is a digit), and the signatures (`SignatureSet.only_sensitive`); and when it left
        nothing behind: no rank prefix (`ranks_seen`), no srun line, no torchrun mention, nothing pending, no block
        opened. Only printable ASCII lines, whose text after the prefixes starts at the same byte in every one.
        """
        if (p.rank is not None or self.line_mode or "Init " in body or not raw.isascii()
                or text != raw.decode("ascii") or body_is_slurm(body) or mentions_torchrun(body)
                or (has_run(text) and not recipe_patterns_blind(True))):
            return
        sensitive = self.sigs.only_sensitive(body)
        if sensitive is not None:
            remember(self.sigs.caches.inert_lines, key, (len(text) - len(body), sensitive), MAX_INERT)

    def still_inert(self, raw: bytes, offset: int, sensitive: tuple[int, ...]) -> bool:
        """Whether a line of a shape `note_inert` remembered says nothing: none of its digit-sensitive signatures
        matches its text after the prefixes."""
        return not sensitive or self.sigs.first_match(raw[offset:].decode("ascii"), sensitive) is None
