"""Failure signatures as data: load `analyzer/signatures/*.toml` (+ site folders), validate, compile.

A bad file is an `AnalyzeInputError` naming the file and the signature id. The scanner's cheap prefilter
is built here: a buffer is searched for a few byte strings (ANCHORS) before any regex runs, and only lines
holding one are parsed. A matching line holds ANY ONE of a signature's `prefilter` literals, so every
literal must contain an anchor; a literal that contains none (a site's `SITE GPU FAULT`) becomes an anchor
itself. Per line, a signature's regex runs only when one of its literals is in the line.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import re as _re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regex

from ddpslurm.analyze.model import CAUSES, RETRY, ROLES
from ddpslurm.analyze.parse.tracebacks import ROOT_CAUSE_HEADER
from ddpslurm.analyze.read.prefilter import LiteralsIn
from ddpslurm.analyze.rules.digit_shape import digit_blind, has_digit, shape
from ddpslurm.errors import AnalyzeInputError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

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
#: signature kinds the engine attaches to events it builds itself (never matched against a raw line)
ENGINE_KINDS = ("elastic_failure",)
#: a signature folder's cause table (advice, retry) beside its signature files
CAUSES_FILE = "causes.toml"
_KEYS = {"id", "cause", "role", "pattern", "prefilter", "priority", "advice", "summary", "retry", "exclude_node",
         "kind", "description", "accuses"}
#: What a matching line says about whom (analyzer/signatures/README.md): the reporter's own failure, a peer it
#: names, nobody (a waiting victim or a detector), the whole job, or a host it names.
ACCUSES = ("self", "peer", "none", "job", "host")
#: event kinds the engine and its producers understand; a signature of another kind would be silently ignored
KINDS = ("signature", "exception", "watchdog_timeout", "store_barrier", "barrier", "barrier_peer", "peer_lost",
         "slurm_job", "slurm_task", "oom_kill", "agent", "agent_sigterm", "agent_failed", "elastic_failure",
         "nccl_warn", "signal", "socket", "gpu", "hang", "mismatch_detected", "interface", "nccl_rank_map",
         "ras_report", "progress", "dump_signal", "rank_announce", "mismatch_report", "connect_retry",
         "desync_verdict")
#: kinds logged by a rank that DETECTED a fault in data a peer sent (it is not the offender)
DETECTOR_KINDS = ("mismatch_detected",)
#: named groups that make a victim's line name a peer (`accuses = "peer"` by default)
PEER_GROUPS = ("peer_rank", "peer_host", "peer_host2", "peer_ip")
_ID = _re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


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
        return _compile(self.pattern_text)


@functools.cache
def _compile(pattern: str) -> regex.Pattern:
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


#: line shapes whose plan a SignatureSet remembers (lines of at most PLANNED_CHARS characters)
MAX_PLANS = 20_000


def memo_key(masked: str | bytes) -> str | bytes | tuple[str, bytes]:
    """What a memo of line shapes files `masked` (a line's shape) under: the shape itself up to UNTIMED_CHARS, a
    128-bit digest of it beyond, so that a memo full of long shapes stays small."""
    if len(masked) <= UNTIMED_CHARS:
        return masked
    data = masked.encode("utf-8", "surrogatepass") if isinstance(masked, str) else masked
    return ("blake2b", hashlib.blake2b(data, digest_size=16).digest())


def remember(memo: dict, key: Any, value: Any, limit: int) -> None:
    """`memo[key] = value`, the memo emptied first when it holds `limit` entries (none with a limit of 0).

    A memo that stopped learning once full would keep the shapes of the first files alone: a 65k-rank job's
    NCCL `Trees` lines (a shape per rank) filled the plans before the watchdog lines came, whose shapes then went
    unplanned for the rest of the job (a third more CPU per file). Emptied, the shapes in use are learned again
    within a few lines."""
    if limit <= 0:
        return
    if len(memo) >= limit:
        memo.clear()
    memo[key] = value


@dataclass(frozen=True)
class _Plan:
    """For one line shape: the digit-sensitive signatures its digit-free literals let through (priority order),
    and the first digit-blind signature that matches it (None: none matches)."""

    sensitive: tuple[int, ...]
    first_blind: int | None


@dataclass
class SignatureSet:
    """All signatures, ordered by priority (highest first), with the scanner's anchors."""

    signatures: list[Signature]
    causes: dict[str, CauseInfo] = field(default_factory=dict)
    anchors: tuple[bytes, ...] = ()
    always: tuple[Signature, ...] = ()
    _by_literal: dict[str, list[int]] = field(default_factory=dict, repr=False)
    _no_literal: set[int] = field(default_factory=set, repr=False)
    #: signature id -> lines on which its regex ran past MATCH_TIMEOUT (this process)
    timeouts: dict[str, int] = field(default_factory=dict, repr=False)
    #: signature index -> literals every match of its regex holds one of (derive_any_literal), where the prefilter
    #: literals that let a line through do not already tell
    _required: dict[int, tuple[str, ...]] = field(default_factory=dict, repr=False)
    #: of those, the shapes (digits as 0) of their literals that have a digit (another line of a shape may hold one)
    _required_digits: dict[int, tuple[str, ...]] = field(default_factory=dict, repr=False)
    _shipped: set[int] = field(default_factory=set, repr=False)
    _literals_in: LiteralsIn | None = field(default=None, repr=False)  # over `_by_literal`'s keys
    #: whether a signature is not digit-blind (digit_shape), by index, as far as asked (`_sensitive`); the
    #: signatures gated by prefilter literals holding digits, and those literals
    _sensitivity: dict[int, bool] = field(default_factory=dict, repr=False)
    _digit_gated: dict[int, tuple[str, ...]] = field(default_factory=dict, repr=False)
    _digit_literals: set[str] = field(default_factory=set, repr=False)
    _digit_literal_shapes: set[str] = field(default_factory=set, repr=False)  # those of `_digit_gated`, shaped
    #: line shape -> what the digit-blind signatures decide for it (this process; at most MAX_PLANS, `remember`)
    _plans: dict[Any, _Plan] = field(default_factory=dict, repr=False)
    #: shapes (digits as 0) of raw lines the scanner found can say nothing with these signatures unless one of a few
    #: digit-sensitive ones matches: the offset of their text after the prefixes, and those signatures (scan.py
    #: `_FileState.note_inert`; this process, at most MAX_INERT)
    inert_lines: dict[Any, tuple[int, tuple[int, ...]]] = field(default_factory=dict, repr=False)
    #: shapes of raw lines whose whole reading the scanner can replay from spans (scan.py `LineRecipe`; this
    #: process, at most scan.MAX_RECIPES)
    line_recipes: dict[Any, Any] = field(default_factory=dict, repr=False)
    #: signature id -> its position (`index_of`, asked for every line read in full: a scan of the list was 10 us)
    _positions: dict[str, int] = field(default_factory=dict, repr=False)

    def match(self, text: str) -> tuple[Signature, regex.Match] | None:
        """The highest-priority signature matching `text` (a line without its prefixes), or None.

        A signature whose regex runs past MATCH_TIMEOUT on this line is skipped for this line only (counted in
        `timeouts`), never the file: a catastrophic site pattern cannot hang or blind the analysis.

        What the digit-blind signatures decide is remembered per line shape (`digit_shape`): a line of a shape
        seen before runs the other signatures it may hold, then only the one digit-blind signature that matched
        (for its groups), instead of every candidate's regex.
        """
        if len(text) > PLANNED_CHARS:
            return self._match_all(text)
        key = memo_key(shape(text))
        plan = self._plans.get(key)
        if plan is None:
            found, plan = self._match_and_plan(text)
            if plan is not None:
                remember(self._plans, key, plan, MAX_PLANS)
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

    def _shape_plan(self, text: str) -> _Plan | None:
        """The plan `match` made for `text`'s shape, where it holds for every line of that shape: None without one
        (a long line, a shape not met yet) or where a literal holding digits may be in such a line."""
        masked = shape(text) if len(text) <= PLANNED_CHARS else None
        plan = self._plans.get(memo_key(masked)) if masked is not None else None
        if plan is None or any(lit in masked for lit in self._digit_literal_shapes):
            return None
        return plan

    def is_sensitive(self, sig: Signature) -> bool:
        """Whether `sig`'s regex or literals may tell apart two lines of the same shape (digit_shape)."""
        return self._sensitive(self.index_of(sig))

    def _sensitive(self, i: int) -> bool:
        """Whether signature i is not digit-blind, found out the first time it is asked (parsing a pattern costs
        ~0.3 ms: a short paste asks about a few signatures, not all 129)."""
        found = self._sensitivity.get(i)
        if found is None:
            if not self._by_literal:
                self._index()
            sig = self.signatures[i]
            found = self._sensitivity[i] = sig.kind not in ENGINE_KINDS and not digit_blind(
                sig.pattern_text, (*sig.prefilter, *self._required.get(i, ())))
        return found

    def index_of(self, sig: Signature) -> int:
        """The position of `sig` among the signatures (priority order)."""
        i = self._positions.get(sig.id)
        if i is None or i >= len(self.signatures) or self.signatures[i] is not sig:
            self._positions = {s.id: n for n, s in enumerate(self.signatures)}
            i = self._positions.get(sig.id)
            if i is None or self.signatures[i] is not sig:  # a set built with one id twice: by identity
                return next(n for n, s in enumerate(self.signatures) if s is sig)
        return i

    def _candidates(self, text: str) -> tuple[list[int], set[int]]:
        """The signatures `text`'s literals let through, in priority order, and those let through by a literal
        without digits (or by none)."""
        if not self._by_literal:
            self._index()
        found = self._literals_in(text)
        hits = {i for lit in found for i in self._by_literal[lit]}
        clean = {i for lit in found if lit not in self._digit_literals for i in self._by_literal[lit]}
        return sorted(hits | self._no_literal), clean | self._no_literal

    def _search(self, i: int, text: str) -> regex.Match | None:
        """Signature i's match in `text`, None when it cannot or does not match; TimeoutError (counted in
        `timeouts`) when its regex runs past MATCH_TIMEOUT."""
        sig = self.signatures[i]
        required = self._required.get(i)
        if required is not None and not any(lit in text for lit in required):
            return None  # every match holds one (derive_any_literal): the regex cannot match
        try:
            if len(text) > UNTIMED_CHARS or i not in self._shipped:
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

    def _match_all(self, text: str) -> tuple[Signature, regex.Match] | None:
        return self.first_match(text, self._candidates(text)[0])

    def _match_and_plan(self, text: str) -> tuple[tuple[Signature, regex.Match] | None, _Plan | None]:
        """The match, and what holds for every line of `text`'s shape: the digit-sensitive candidates let through
        by digit-free literals, and the first digit-blind signature that matches (None: none does). No plan when
        a digit-blind regex timed out (that is not a property of the shape)."""
        order, clean = self._candidates(text)
        found: tuple[Signature, regex.Match] | None = None
        first_blind = None
        for i in order:
            blind = not self._sensitive(i)
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
        masked = shape(text)
        sensitive = tuple(i for i in order if i in clean and self._may_match_shape(i, text, masked)
                          and self._sensitive(i))
        return found, _Plan(sensitive, first_blind)

    def _may_match_shape(self, i: int, text: str, masked: str) -> bool:
        """Whether signature i may match some line of `text`'s shape (`masked`): not when none of the literals its
        matches hold one of can be in such a line (a literal without digits is in a line where it is in its shape;
        one with digits, where its shape is), so a plan does not keep it to run again on every line of that shape."""
        required = self._required.get(i)
        if required is None or any(lit in text for lit in required):
            return True
        return any(lit in masked for lit in self._required_digits.get(i, ()))

    def _match_planned(self, text: str, plan: _Plan) -> tuple[Signature, regex.Match] | None:
        limit = plan.first_blind if plan.first_blind is not None else len(self.signatures)
        sensitive = set(plan.sensitive)
        for i, literals in self._digit_gated.items():
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
            return self._match_all(text)
        return self.signatures[plan.first_blind], m

    def _index(self) -> None:
        """literal -> indexes of the signatures it gates (signatures are ordered by priority); the literals each
        signature's every match must hold one of, where they can be told; which signatures are the shipped ones;
        the literals that hold digits and the signatures they gate (which signatures are not digit-blind is asked
        per signature: `_sensitive`)."""
        shipped = str(default_dirs()[0])
        for i, sig in enumerate(self.signatures):
            if sig.kind in ENGINE_KINDS:
                continue
            required = derive_any_literal(sig.pattern_text) or ()
            if required and not all(any(lit in gate for lit in required) for gate in sig.prefilter):
                self._required[i] = required  # (a prefilter literal that holds one of them tells it already)
                shaped = tuple(shape(lit) for lit in required if has_digit(lit))
                if shaped:
                    self._required_digits[i] = shaped
            if sig.source.startswith(shipped):
                self._shipped.add(i)
            if not sig.prefilter:
                self._no_literal.add(i)
            for lit in sig.prefilter:
                self._by_literal.setdefault(lit, []).append(i)
            digit_literals = tuple(lit for lit in sig.prefilter if has_digit(lit))
            if digit_literals:  # (gated by digits: digit-sensitive, whatever its regex)
                self._digit_gated[i] = digit_literals
        self._digit_literals = {lit for lit in self._by_literal if has_digit(lit)}
        self._digit_literal_shapes = {shape(lit) for lits in self._digit_gated.values() for lit in lits}
        self._literals_in = LiteralsIn(list(self._by_literal))

    def by_id(self, sig_id: str) -> Signature | None:
        """The signature named `sig_id`."""
        return next((s for s in self.signatures if s.id == sig_id), None)


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise AnalyzeInputError(f"signature file {path} is not valid TOML: {error}",
                                "fix the file or remove it from the signature folder") from None
    except OSError as error:
        raise AnalyzeInputError(f"cannot read signature file {path}: {error.strerror}",
                                "check the path given to --signatures") from None


#: what makes a pattern's literal text mean something else: case-insensitive or verbose flags, fuzzy matching
_LITERALS_UNSURE = _re.compile(r"\(\?[a-zA-Z]*[ix]|\{[eisd](?:[<=,}])")
#: how many characters an escape's payload takes after `\x`, `\u`, `\U`
_ESCAPE_PAYLOAD = {"x": 2, "u": 4, "U": 8}


def derive_literal(pattern: str) -> str | None:
    """The longest top-level literal run that every match of `pattern` must contain, or None when unsure."""
    if _LITERALS_UNSURE.search(pattern) or len(top_level_branches(pattern)) > 1:
        return None
    best, current, depth, i, n = "", "", 0, 0, len(pattern)

    def close() -> None:
        nonlocal best, current
        if depth == 0 and len(current) > len(best):
            best = current
        current = ""

    while i < n:
        ch = pattern[i]
        if ch == "\\":
            nxt = pattern[i + 1] if i + 1 < n else ""
            if nxt and not nxt.isalnum() and depth == 0:
                current += nxt
            else:
                close()
            i += 2 + _escape_payload(pattern, i + 1)
            continue
        if ch in "*?{":
            current = current[:-1]
            close()
            if ch == "{":
                i = pattern.find("}", i) if pattern.find("}", i) > 0 else n
        elif ch == "[":
            close()
            i = _class_end(pattern, i)
        elif ch == "(":
            close()
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
            current = ""
        elif ch in ".^$+":
            close()
        elif depth == 0:
            current += ch
        i += 1
    close()
    return best if len(best) >= 4 else None


def _escape_payload(pattern: str, at: int) -> int:
    r"""How many characters after the letter at `at` an escape takes: `\x27`'s hex digits, `\N{...}`'s name, an
    octal escape's or a group reference's further digits (they are not literal text)."""
    letter = pattern[at] if at < len(pattern) else ""
    if letter in _ESCAPE_PAYLOAD:
        return _ESCAPE_PAYLOAD[letter]
    if letter == "N" and pattern[at + 1:at + 2] == "{":
        close = pattern.find("}", at)
        return close - at if close > 0 else len(pattern) - at
    if letter.isdigit():
        end = at + 1
        while end < len(pattern) and pattern[end].isdigit():
            end += 1
        return end - at - 1
    return 0


@functools.lru_cache(maxsize=4096)
def derive_any_literal(pattern: str) -> tuple[str, ...] | None:
    """Literals every match of `pattern` holds one of: each top-level alternative's `derive_literal` (an
    alternation the whole pattern is wrapped in counts as top-level), or None when one alternative has none."""
    if _LITERALS_UNSURE.search(pattern):
        return None
    branches = top_level_branches(_unwrapped(pattern))
    literals = [derive_literal(branch) for branch in branches]
    if not all(literals):
        return None
    return tuple(dict.fromkeys(lit for lit in literals if lit))


def _unwrapped(pattern: str) -> str:
    """`pattern` without a group that spans all of it (`(?:A|B)`, `^(?:A|B)$`), however deep: its alternatives are
    the pattern's."""
    while True:
        body = pattern[1:] if pattern.startswith("^") else pattern
        body = body[:-1] if body.endswith("$") and not body.endswith("\\$") else body
        head = _re.match(r"\((?:\?:|\?P<\w+>|\?<\w+>)?", body)
        if head is None or _group_end(body) != len(body) - 1:
            return pattern
        pattern = body[head.end():-1]


def _group_end(pattern: str) -> int:
    """The index of the `)` that closes the group opening `pattern` (-1 when unbalanced)."""
    return next((i for i, ch, depth in _structure(pattern) if ch == ")" and depth == 0), -1)


def top_level_branches(pattern: str) -> list[str]:
    r"""`pattern` cut at its top-level `|` (not inside a group, a class, or escaped)."""
    cuts = [i for i, ch, depth in _structure(pattern) if ch == "|" and depth == 0]
    return [pattern[start + 1:end] for start, end in itertools.pairwise([-1, *cuts, len(pattern)])]


def _structure(pattern: str) -> Iterator[tuple[int, str, int]]:
    """Each character of `pattern` outside escapes and character classes: its index, itself, and the depth of groups
    it leaves open (a `(` counts in, a `)` out)."""
    depth, i, n = 0, 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "[":
            i = _class_end(pattern, i) + 1
            continue
        depth += (ch == "(") - (ch == ")")
        yield i, ch, depth
        i += 1


def _class_end(pattern: str, start: int) -> int:
    """The index of the `]` that closes the character class opening at `start`."""
    j = start + 1
    if pattern[j:j + 1] == "^":
        j += 1
    if pattern[j:j + 1] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j


def _fail(path: Path, sig_id: str, what: str) -> AnalyzeInputError:
    return AnalyzeInputError(f"signature {sig_id!r} in {path}: {what}",
                             "fix that entry (the schema is in analyzer/signatures/README.md)")


def parse_signature(raw: dict[str, Any], path: Path, validate: bool = True,
                    causes: Iterable[str] = CAUSES) -> Signature:
    """Validate one `[[signature]]` table; `validate` also compiles its pattern now (site files)."""
    sig_id = raw.get("id")
    if not isinstance(sig_id, str) or not _ID.match(sig_id):
        raise _fail(path, str(sig_id), "`id` must be a kebab-case string")
    unknown = set(raw) - _KEYS
    if unknown:
        raise _fail(path, sig_id, f"unknown key(s) {', '.join(sorted(unknown))}")
    cause = raw.get("cause")
    if cause not in causes:
        raise _fail(path, sig_id, f"unknown cause {cause!r} (the vocabulary is in DESIGN.md; a site adds its own "
                                  f"in its folder's {CAUSES_FILE})")
    role = raw.get("role")
    if role not in ROLES:
        raise _fail(path, sig_id, f"role must be one of {', '.join(ROLES)}, not {role!r}")
    pattern = raw.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise _fail(path, sig_id, "`pattern` must be a non-empty string")
    if validate:
        try:
            _compile(pattern)
        except regex.error as error:
            raise _fail(path, sig_id, f"bad pattern: {error}") from None
    prefilter = raw.get("prefilter")
    if prefilter is None:
        literal = derive_literal(pattern)
        prefilter = [literal] if literal else []
    if not isinstance(prefilter, list) or not all(isinstance(x, str) and x for x in prefilter):
        raise _fail(path, sig_id, "`prefilter` must be a list of non-empty strings")
    priority = raw.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise _fail(path, sig_id, "`priority` must be an integer")
    advice = raw.get("advice", [])
    if not isinstance(advice, list) or not all(isinstance(x, str) for x in advice):
        raise _fail(path, sig_id, "`advice` must be a list of strings")
    summary = raw.get("summary")
    if summary is not None and not isinstance(summary, str):
        raise _fail(path, sig_id, "`summary` must be a string")
    retry = raw.get("retry")
    if retry is not None and retry not in RETRY:
        raise _fail(path, sig_id, f"`retry` must be one of {', '.join(RETRY)}")
    exclude = raw.get("exclude_node")
    if exclude is not None and not isinstance(exclude, bool):
        raise _fail(path, sig_id, "`exclude_node` must be true or false")
    kind = raw.get("kind", "signature")
    if kind not in KINDS:
        raise _fail(path, sig_id, f"unknown kind {kind!r} (one of {', '.join(KINDS)})")
    accuses = raw.get("accuses", default_accuses(role, pattern, kind, cause))
    if accuses not in ACCUSES:
        raise _fail(path, sig_id, f"`accuses` must be one of {', '.join(ACCUSES)}, not {accuses!r}")
    return Signature(id=sig_id, cause=cause, role=role, pattern_text=pattern, prefilter=tuple(prefilter),
                     priority=priority, advice=tuple(advice), summary=summary, retry=retry, exclude_node=exclude,
                     kind=kind, source=str(path), accuses=accuses)


def default_accuses(role: str, pattern: str, kind: str = "signature", cause: str = "unknown") -> str:
    """Slurm's job lines accuse the job (a node failure its host); a detector of bad data from a peer nobody;
    a culprit or `either` line its own rank; a victim's line a peer when its pattern captures one."""
    if kind == "slurm_job":
        return "host" if cause == "node_failure" else "job"
    if kind in DETECTOR_KINDS:
        return "none"
    if role != "victim":
        return "self"
    return "peer" if any(f"(?P<{g}>" in pattern for g in PEER_GROUPS) else "none"


def load_signature_file(path: Path, validate: bool = True, causes: Iterable[str] = CAUSES) -> list[Signature]:
    """All signatures of one TOML file (`validate=False` defers compiling to first use: shipped files are tested)."""
    data = _load_toml(path)
    tables = data.get("signature", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise AnalyzeInputError(f"signature file {path} must hold a list of [[signature]] tables",
                                "write each signature as a [[signature]] table")
    known = set(causes) | set(CAUSES)
    return [parse_signature(t, path, validate, known) for t in tables]


def load_causes(path: Path, base: dict[str, CauseInfo] | None = None, *, site: bool = False) -> dict[str, CauseInfo]:
    """Cause-level defaults layered over `base`. The shipped file names only the vocabulary's causes; a site's
    `causes.toml` may override their advice or add a cause of its own (a snake_case name)."""
    out: dict[str, CauseInfo] = dict(base or {})
    if not path.is_file():
        return out
    for cause, raw in _load_toml(path).items():
        new_ok = site and _re.fullmatch(r"[a-z][a-z0-9_]{0,63}", cause) is not None
        if not isinstance(raw, dict) or (cause not in CAUSES and not new_ok):
            raise AnalyzeInputError(f"{path}: [{cause}] is not a cause of the vocabulary",
                                    "use one of the causes listed in DESIGN.md (a site may add snake_case names)")
        retry = raw.get("retry", "unknown")
        if retry not in RETRY:
            raise AnalyzeInputError(f"{path}: [{cause}] retry must be one of {', '.join(RETRY)}", "fix the value")
        advice = raw.get("advice", [])
        if not isinstance(advice, list) or not all(isinstance(a, str) for a in advice):
            raise AnalyzeInputError(f"{path}: [{cause}] advice must be a list of strings", "fix the value")
        out[cause] = CauseInfo(cause=cause, summary=str(raw.get("summary", cause.replace("_", " "))),
                               advice=tuple(advice), retry=retry, exclude_node=bool(raw.get("exclude_node", False)),
                               node_level=bool(raw.get("node_level", False)))
    return out


def default_dirs() -> list[Path]:
    """The shipped signature folder."""
    from ddpslurm._data import data_dir

    return [data_dir("analyzer") / "signatures"]


def load_signatures(extra_dirs: Sequence[str | Path] = (), *, use_env: bool = True) -> SignatureSet:
    """The shipped signatures, then `$DDPSLURM_SIGNATURES` (os.pathsep-separated) and `extra_dirs`.

    A later folder may redefine an id of an earlier one (a site overrides a shipped signature); the same id
    twice within one folder is an error. A folder's `causes.toml` is layered the same way over the shipped
    `analyzer/causes.toml` (advice for a shipped cause, or a cause of the site's own).
    """
    dirs: list[Path] = default_dirs()
    if use_env and os.environ.get("DDPSLURM_SIGNATURES"):
        dirs += [Path(p) for p in os.environ["DDPSLURM_SIGNATURES"].split(os.pathsep) if p]
    dirs += [Path(d) for d in extra_dirs]
    for folder in dirs:
        if not folder.is_dir():
            raise AnalyzeInputError(f"signature folder {folder} does not exist or is not a folder",
                                    "give a folder of *.toml files to --signatures")
    causes = load_causes(dirs[0].parent / "causes.toml")
    for folder in dirs[1:]:
        causes = load_causes(folder / CAUSES_FILE, causes, site=True)
    by_id: dict[str, Signature] = {}
    for index, folder in enumerate(dirs):
        seen: dict[str, Path] = {}
        for path in sorted(p for p in folder.glob("*.toml") if p.name != CAUSES_FILE):
            for sig in load_signature_file(path, validate=index > 0, causes=causes):
                if sig.id in seen:
                    raise _fail(path, sig.id, f"duplicate id (also in {seen[sig.id]})")
                seen[sig.id] = path
                if index == 0 and sig.id in by_id:
                    raise _fail(path, sig.id, "duplicate id")
                by_id[sig.id] = sig
    return build_set(by_id.values(), causes)


def build_set(signatures: Iterable[Signature], causes: dict[str, CauseInfo] | None = None) -> SignatureSet:
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
                        always=always)
