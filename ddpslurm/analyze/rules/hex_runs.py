"""Lines that differ in their hex runs: which patterns cannot tell them apart.

NCCL names a communicator by its address (`comm 0x7f3a2c001e40 rank 11 nRanks 16384`): 16k ranks print 16k ids,
whose letters would make a line shape per rank. `digit_shape.line_shape` writes each hex run (`HEX_RUN`: the
lowercase hex digits after a `0x` that starts the line or follows a space, tab or one of `=({,`, up to a
character that is not an ASCII word character) as `0`s. A pattern is *run-blind* when no way it can match a line
reads a run's characters otherwise than all alike: then it matches every line of one shape alike, at the same
spans, and what it decides for one line holds for all.

The check (`_flow`) follows each way through the pattern's parse tree knowing where it may stand, as states of the
automaton that finds runs: B (after a boundary: the line's start, or one of `BOUNDARY`), Z (after B's `0`), R
(after Z's `x`, or after a hex digit in R: maybe inside a run) and N (anywhere else). A search may start in any
state. A way where R is possible may read the next character only with an atom that takes every hex digit or none
(`\\w`, `\\S`, `.`, `[0-9a-fA-F]`, ` `), or with a literal hex letter whose literal word goes on to an ASCII word
character that is no hex digit (the `c` of `comm`: a way that put it inside a run would meet that character in the
run or at its end, and fail in every line alike). Anything else (`\\d` after `\\S+`, a back-reference, syntax the
parser does not know) makes the pattern not run-blind: a signature is then asked again on each line of a shape with
runs (`SignatureSet` keeps it as sensitive there). IGNORECASE is assumed wherever it could apply.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from ddpslurm.analyze.rules.digit_shape import (
    _ATOMIC,
    _C,
    _REPEATS,
    BOUNDARY,
    python_syntax,
    sre_parse,  # type: ignore[attr-defined]
)

#: the characters a hex run holds
HEX = frozenset("0123456789abcdef")
_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
#: the run finder's states, as bits of a set
B, Z, R, N = 1, 2, 4, 8
ANY_STATE = B | Z | R | N
_BEGIN = {_C.AT_BEGINNING, _C.AT_BEGINNING_STRING}
_CATEGORIES = {_C.CATEGORY_DIGIT, _C.CATEGORY_NOT_DIGIT, _C.CATEGORY_WORD, _C.CATEGORY_NOT_WORD,
               _C.CATEGORY_SPACE, _C.CATEGORY_NOT_SPACE, _C.CATEGORY_LINEBREAK, _C.CATEGORY_NOT_LINEBREAK,
               _C.CATEGORY_UNI_DIGIT, _C.CATEGORY_UNI_NOT_DIGIT, _C.CATEGORY_UNI_WORD, _C.CATEGORY_UNI_NOT_WORD,
               _C.CATEGORY_UNI_SPACE, _C.CATEGORY_UNI_NOT_SPACE, _C.CATEGORY_UNI_LINEBREAK,
               _C.CATEGORY_UNI_NOT_LINEBREAK}
#: one character of each kind the run finder tells apart, besides the hex digits: x, X, the boundaries, another
_PROBES = ("x", "X", *BOUNDARY, "g", "-", "\n")


class _Sensitive(Exception):
    """A way through the pattern may read a run's characters unalike, or the check does not know an opcode."""


def run_blind(pattern: str, literals: Iterable[str] = ()) -> bool:
    """Whether a signature with this regex and these literals matches every line of one `line_shape` alike, as far
    as its hex runs go (digits: `digit_shape.digit_blind`), searched from anywhere. False when unsure."""
    return all(literal_run_blind(lit) for lit in literals if lit) and end_states(pattern, ANY_STATE) is not None


@functools.lru_cache(maxsize=4096)
def end_states(pattern: str, start: int) -> int | None:
    """The states a match of `pattern` entered in the states `start` may end in; None where it is not run-blind."""
    try:
        return _flow(list(sre_parse.parse(python_syntax(pattern))), start)
    except Exception:  # _Sensitive, or syntax Python's parser does not know: unsure
        return None


def prefixes_run_blind(rules: Iterable[str], searched: Iterable[str] = ()) -> bool:
    """Whether prefix rules, each matched where the line or the prefix before it ends (`searched` ones: searched
    there), are run-blind and never end inside a run: the text after them then holds whole runs only, so that what
    is run-blind on a text is run-blind on the line's text after its prefixes too."""
    rules, searched = tuple(rules), tuple(searched)
    at = B
    while True:
        ends = [end_states(rule, at) for rule in rules] + [end_states(rule, ANY_STATE) for rule in searched]
        if any(end is None or end & R for end in ends):
            return False
        reached = at
        for end in ends:
            reached |= end  # type: ignore[operator]
        if reached == at:
            return True
        at = reached


def literal_run_blind(literal: str) -> bool:
    """Whether `literal` (found as written: case counts) is in one line of a shape exactly where it is in every
    other: no run of its hex characters could sit inside a hex run (each is held in place by a word character
    after it that is no hex digit, or by what comes before it, unless that is a run's `0x`)."""
    i = 0
    while i < len(literal):
        if literal[i] not in HEX:
            i += 1
            continue
        j = i
        while j < len(literal) and literal[j] in HEX:
            j += 1
        left_open = i == 0 or (literal[i - 1] in "xX" and literal[i - 2:i - 1] in ("", "0"))
        right_open = j == len(literal) or not _ends_a_run(literal[j])
        if left_open and right_open:
            return False
        i = j
    return True


def _is_hex(c: str) -> bool:
    return c in HEX or c.lower() in HEX  # a letter that may match one under IGNORECASE


def _ends_a_run(c: str) -> bool:
    """A character that no run holds and that cannot follow a run: an ASCII word character, in either case no hex
    digit."""
    return c in _WORD and not _is_hex(c)


def _step(states: int, chars: Iterable[str]) -> int:
    """The run finder's states after reading one of `chars` in one of `states`."""
    out = 0
    for c in chars:
        for s in (B, Z, R, N):
            if not states & s:
                continue
            if (c in HEX and s == R) or (c in "xX" and s == Z):
                out |= R
            elif c == "0" and s == B:
                out |= Z
            elif c in BOUNDARY:
                out |= B
            else:
                out |= N
    return out


def _flow(items: list, states: int) -> int:
    """The states after a sequence of items entered in `states`; _Sensitive where a way may read a run unalike."""
    for k, (op, arg) in enumerate(items):
        states = _literal(items, k, states) if op == _C.LITERAL else _item(op, arg, states)
    return states


def _literal(items: list, k: int, states: int) -> int:
    c = chr(items[k][1])
    chars = {c, c.lower(), c.upper()}
    if states & R and _is_hex(c):
        j = k
        while j < len(items) and items[j][0] == _C.LITERAL and _is_hex(chr(items[j][1])):
            j += 1
        if not (j < len(items) and items[j][0] == _C.LITERAL and _ends_a_run(chr(items[j][1]))):
            raise _Sensitive(c)  # (else a way that read it inside a run fails at items[j] in every line alike)
    return _step(states, chars)


def _item(op, arg, states: int) -> int:
    if op in (_C.IN, _C.NOT_LITERAL, _C.ANY):
        every, none, taken = _takes(op, arg)
        if states & R and not (every or none):
            raise _Sensitive("a class holding some hex digits only, where a run may be")
        return _step(states, taken)
    if op == _C.AT:
        return B if arg in _BEGIN else states
    if op in _REPEATS:
        return _repeat(arg[2], states, arg[0])
    if op == _C.SUBPATTERN:
        return _flow(list(arg[-1]), states)
    if op in _ATOMIC:
        return _flow(list(arg), states)
    if op in (_C.ASSERT, _C.ASSERT_NOT):
        _flow(list(arg[1]), states if arg[0] >= 0 else ANY_STATE)  # a look-behind starts before this place
        return states
    if op == _C.BRANCH:
        out = 0
        for branch in arg[1]:
            out |= _flow(list(branch), states)
        return out
    raise _Sensitive(op)  # a back-reference, or an opcode this check does not know


def _repeat(body, states: int, least: int) -> int:
    """A body repeated at least `least` times: the states after those turns, and after any more (until a turn
    adds none)."""
    for _ in range(min(least, 2)):  # (a third turn's states are within the fixed point below)
        states = _flow(list(body), states)
    while True:
        reached = states | _flow(list(body), states)
        if reached == states:
            return states
        states = reached


def _takes(op, arg) -> tuple[bool, bool, tuple[str, ...]]:
    """(takes every hex digit surely, takes none surely, the characters it may take that the run finder tells
    apart) of `.`, a negated literal or a class, either case counted where IGNORECASE may apply."""
    if op == _C.ANY:
        return True, False, (*sorted(HEX), *_PROBES)
    if op == _C.NOT_LITERAL:
        c = chr(arg)
        return not _is_hex(c), False, tuple(p for p in (*sorted(HEX), *_PROBES) if p != c)
    negated = bool(arg) and arg[0][0] == _C.NEGATE
    items = arg[1:] if negated else arg

    def held(c: str) -> bool:
        return _in_class(c, items)

    def maybe(c: str) -> bool:  # c, or another case of it (IGNORECASE)
        return held(c) or held(c.upper()) or held(c.lower())

    takes, may = ((lambda c: not maybe(c)), (lambda c: not held(c))) if negated else (held, maybe)
    probes = tuple(c for c in (*sorted(HEX), *_PROBES) if may(c))
    # a character of no kind probed (a letter g-z, punctuation, non-ASCII) reads as "g": any other is N too
    return all(takes(c) for c in HEX), not any(may(c) for c in HEX), (*probes, "g")


def _in_class(c: str, items) -> bool:
    """Whether the class items (not negated) hold the character c, as written."""
    code = ord(c)
    for op, arg in items:
        if op == _C.LITERAL:
            if arg == code:
                return True
        elif op == _C.RANGE:
            if arg[0] <= code <= arg[1]:
                return True
        elif op == _C.CATEGORY:
            if arg not in _CATEGORIES:
                raise _Sensitive(arg)
            if _category(arg, c):
                return True
        else:
            raise _Sensitive(op)
    return False


def _category(category, c: str) -> bool:
    """Whether an ASCII character c is in a class category (the Unicode ones agree on ASCII)."""
    digit, word, space = c in "0123456789", c in _WORD, c in " \t\n\r\f\v"
    found = {_C.CATEGORY_DIGIT: digit, _C.CATEGORY_UNI_DIGIT: digit, _C.CATEGORY_WORD: word,
             _C.CATEGORY_UNI_WORD: word, _C.CATEGORY_SPACE: space, _C.CATEGORY_UNI_SPACE: space,
             _C.CATEGORY_LINEBREAK: c == "\n", _C.CATEGORY_UNI_LINEBREAK: c == "\n"}
    if category in found:
        return found[category]
    opposite = {_C.CATEGORY_NOT_DIGIT: _C.CATEGORY_DIGIT, _C.CATEGORY_UNI_NOT_DIGIT: _C.CATEGORY_DIGIT,
                _C.CATEGORY_NOT_WORD: _C.CATEGORY_WORD, _C.CATEGORY_UNI_NOT_WORD: _C.CATEGORY_WORD,
                _C.CATEGORY_NOT_SPACE: _C.CATEGORY_SPACE, _C.CATEGORY_UNI_NOT_SPACE: _C.CATEGORY_SPACE,
                _C.CATEGORY_NOT_LINEBREAK: _C.CATEGORY_LINEBREAK, _C.CATEGORY_UNI_NOT_LINEBREAK: _C.CATEGORY_LINEBREAK}
    return not found[opposite[category]]
