"""Lines that differ only in their digits: which signatures cannot tell them apart.

16,384 ranks print the same watchdog line with a different rank, sequence number or time. A signature whose
regex treats every ASCII digit alike (`\\d`, `\\w`, `.`, `[^\\]]`; no literal digit, no class holding some
digits only, no back-reference) and whose literals hold no digit matches a line exactly where it matches the
line's *shape*, the line with every ASCII digit written as `0`. Such a signature is *digit-blind*; what the set
of them decides for one line holds for every line of the same shape (`signatures.SignatureSet.match`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

try:
    import re._constants as sre_constants
    import re._parser as sre_parse
except ImportError:  # Python 3.10
    import sre_constants  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

DIGITS = "0123456789"
_TO_ZERO = str.maketrans(DIGITS[1:], "0" * 9)
_C = sre_constants
#: character categories holding every ASCII digit, and those holding none
_ALL_DIGITS = {_C.CATEGORY_DIGIT, _C.CATEGORY_WORD, _C.CATEGORY_NOT_SPACE, _C.CATEGORY_NOT_LINEBREAK,
               _C.CATEGORY_UNI_DIGIT, _C.CATEGORY_UNI_WORD, _C.CATEGORY_UNI_NOT_SPACE, _C.CATEGORY_UNI_NOT_LINEBREAK,
               _C.CATEGORY_LOC_WORD}
_NO_DIGITS = {_C.CATEGORY_NOT_DIGIT, _C.CATEGORY_NOT_WORD, _C.CATEGORY_SPACE, _C.CATEGORY_LINEBREAK,
              _C.CATEGORY_UNI_NOT_DIGIT, _C.CATEGORY_UNI_NOT_WORD, _C.CATEGORY_UNI_SPACE, _C.CATEGORY_UNI_LINEBREAK,
              _C.CATEGORY_LOC_NOT_WORD}
#: opcodes that compare a position with what a group matched: the digits matter
_BACKREFS = {_C.GROUPREF, _C.GROUPREF_EXISTS} | ({_C.GROUPREF_IGNORE} if hasattr(_C, "GROUPREF_IGNORE") else set())

_REPEATS = {_C.MAX_REPEAT, _C.MIN_REPEAT} | ({_C.POSSESSIVE_REPEAT} if hasattr(_C, "POSSESSIVE_REPEAT") else set())
_ATOMIC = {_C.ATOMIC_GROUP} if hasattr(_C, "ATOMIC_GROUP") else set()


def shape(text: str) -> str:
    """`text` with every ASCII digit written as `0` (same length, same positions)."""
    return text.translate(_TO_ZERO)


def has_digit(text: str) -> bool:
    """Whether `text` holds an ASCII digit."""
    return any(d in text for d in DIGITS)


def digit_blind(pattern: str, literals: Iterable[str] = ()) -> bool:
    """Whether a signature with this regex and these literals matches a line exactly where it matches the line's
    shape. False when unsure: a pattern Python's parser cannot read (`regex`-only syntax) is not digit-blind."""
    if any(has_digit(lit) for lit in literals if lit):
        return False
    return _pattern_blind(pattern)


@functools.lru_cache(maxsize=4096)
def _pattern_blind(pattern: str) -> bool:
    """`digit_blind` of the regex alone (parsed once per process: ~0.3 ms a pattern, for each signature set)."""
    try:
        tree = sre_parse.parse(python_syntax(pattern))
    except Exception:  # any syntax Python's parser does not know: unsure
        return False
    try:
        return _blind(tree)
    except _Unsure:
        return False


_NAMED_GROUP = re.compile(r"\(\?P<(\w+)>")


def python_syntax(pattern: str) -> str:
    """`pattern` with each group name kept on its first group only: `regex` lets alternatives name their groups
    alike (`(?P<peer>...)|...(?P<peer>...)`), Python's parser refuses that. Names do not change what matches (a
    back-reference by name, which would, makes a pattern digit-sensitive anyway)."""
    seen: set[str] = set()

    def first_only(m: re.Match[str]) -> str:
        if m[1] in seen:
            return "("
        seen.add(m[1])
        return m[0]
    return _NAMED_GROUP.sub(first_only, pattern)


class _Unsure(Exception):
    """An opcode this module does not know how to judge."""


def _blind(items) -> bool:
    return all(_blind_item(op, arg) for op, arg in items)


def _blind_item(op, arg) -> bool:
    if op in (_C.LITERAL, _C.NOT_LITERAL):
        return chr(arg) not in DIGITS
    if op == _C.IN:
        return _uniform_set(arg)
    if op in _BACKREFS:
        return False
    if op in (_C.ANY, _C.AT):
        return True
    if op in _REPEATS:
        return _blind(arg[2])
    if op == _C.SUBPATTERN:
        return _blind(arg[-1])
    if op in _ATOMIC:
        return _blind(arg)
    if op in (_C.ASSERT, _C.ASSERT_NOT):
        return _blind(arg[1])
    if op == _C.BRANCH:
        return all(_blind(branch) for branch in arg[1])
    if op == _C.CATEGORY:
        return arg in _ALL_DIGITS or arg in _NO_DIGITS
    raise _Unsure(op)


def _uniform_set(items) -> bool:
    """A character class that holds every ASCII digit or none of them (negated or not)."""
    held = set()
    for op, arg in items:
        if op == _C.NEGATE:
            continue
        if op == _C.LITERAL:
            held |= {chr(arg)} & set(DIGITS)
        elif op == _C.RANGE:
            held |= {d for d in DIGITS if arg[0] <= ord(d) <= arg[1]}
        elif op == _C.CATEGORY:
            if arg in _ALL_DIGITS:
                held |= set(DIGITS)
            elif arg not in _NO_DIGITS:
                raise _Unsure(arg)
        else:
            raise _Unsure(op)
    return len(held) in (0, len(DIGITS))
