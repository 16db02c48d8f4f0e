"""Lines that differ only in their digits: which signatures cannot tell them apart.

16,384 ranks print the same watchdog line with a different rank, sequence number or time. A signature whose
regex treats every ASCII digit alike (`\\d`, `\\w`, `.`, `[^\\]]`; no literal digit but one right before a
literal `x`, as in `0x`; no class holding some digits only, no back-reference) and whose literals hold no digit
but such ones matches a line exactly where it matches the line's *shape*, the line with every ASCII digit written
as `0` but one right before an `x` or `X` (`line_shape`; `hex_runs` masks NCCL's hex ids too). Such a signature
is *digit-blind*; what the set of them decides for one line holds for every line of the same shape
(`signatures.SignatureSet.match`). `shape` is the plain form (every digit as 0), for comparing texts.
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


#: a digit right before an `x` or `X` (the `0` of `0x`): `line_shape` keeps it as written
_DIGIT_X = re.compile(r"[0-9](?=[xX])")
#: what may come before the `0x` of a hex run (or the line's start)
BOUNDARY = " \t=({,"
#: a hex run: the lowercase hex digits after a `0x` at the start or after a BOUNDARY, up to a character that is not
#: an ASCII word character (or the end); one followed by a word character is no run (`0xdeadBEEF`, `0x12_3`)
HEX_RUN = re.compile(rf"(?:^|(?<=[{re.escape(BOUNDARY)}]))0[xX](?P<run>[0-9a-f]+)(?![0-9A-Za-z_])")


def line_shape(text: str) -> str:
    """The shape lines are remembered by (signatures' plans, line recipes): `shape`, but a digit right before an
    `x` or `X` kept as written, and every hex run (`HEX_RUN`: NCCL's `comm 0x7f3a...`) written as `0`s, so that
    16k ranks' communicator ids make one shape. What holds for one line of a shape holds for all only for
    patterns blind to both (`digit_blind`, and `hex_runs.run_blind` where `has_run`)."""
    masked = text.translate(_TO_ZERO)
    if _DIGIT_X.search(text) is None:
        return masked
    chars = list(masked)
    for m in _DIGIT_X.finditer(text):
        chars[m.start()] = m[0]
    for m in HEX_RUN.finditer(text):
        start, end = m.span("run")
        chars[start:end] = "0" * (end - start)
    return "".join(chars)


def has_run(text: str) -> bool:
    """Whether `text` holds a hex run (`HEX_RUN`); lines of one `line_shape` all do or all do not."""
    return ("x" in text or "X" in text) and HEX_RUN.search(text) is not None


def has_digit(text: str) -> bool:
    """Whether `text` holds an ASCII digit."""
    return any(d in text for d in DIGITS)


def digit_gated(literal: str) -> bool:
    """Whether `literal` may be in one line and not in another of the same `line_shape`: it holds a digit that is
    not right before an `x` or `X` (such a digit is kept in the shape, as `0x` is)."""
    return any(c in DIGITS and literal[i + 1:i + 2] not in ("x", "X") for i, c in enumerate(literal))


def digit_blind(pattern: str, literals: Iterable[str] = ()) -> bool:
    """Whether a signature with this regex and these literals matches a line exactly where it matches the line's
    `line_shape`. False when unsure: a pattern Python's parser cannot read (`regex`-only syntax) is not
    digit-blind."""
    if any(digit_gated(lit) for lit in literals if lit):
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
    items = list(items)
    for k, (op, arg) in enumerate(items):
        if op == _C.LITERAL and chr(arg) in DIGITS:  # blind only right before a literal x: `line_shape` keeps it
            if not (k + 1 < len(items) and items[k + 1][0] == _C.LITERAL and chr(items[k + 1][1]) in "xX"):
                return False
        elif not _blind_item(op, arg):
            return False
    return True


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
