"""Prefilter literals derived from a signature's pattern text.

In: a regex pattern as written in a signature file. Out: the literal text every match of it must contain
(`derive_literal`: one run; `derive_any_literal`: one of several, an alternation's), or None when the pattern's
text cannot tell (flags that change what its letters mean, fuzzy matching, an alternative without one). The
loader fills a signature's missing `prefilter` with them; the compiled set skips a regex on lines holding none
of what every match of it holds.
"""

from __future__ import annotations

import functools
import itertools
import re as _re
from collections.abc import Iterator, Sequence

try:
    import ahocorasick_rs as _ahocorasick
except ImportError:  # no wheel for this platform or Python: a substring test per literal
    _ahocorasick = None

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


#: the parts of a pattern that its structure is read from: an escape and a character class (to its `]`, or to the
#: end when none closes it), each passed over whole, and the group bounds and alternation bars between them
_PARTS = _re.compile(r"\\.?|\[\^?\]?(?:\\.?|[^\]\\])*(?:\]|\Z)|[()|]", _re.DOTALL)


def _structure(pattern: str) -> Iterator[tuple[int, str, int]]:
    """Each `(`, `)` and `|` of `pattern` outside escapes and character classes: its index, itself, and the depth of
    groups it leaves open (a `(` counts in, a `)` out)."""
    depth = 0
    for m in _PARTS.finditer(pattern):
        ch = m.group()
        if len(ch) == 1 and ch in "()|":
            depth += (ch == "(") - (ch == ")")
            yield m.start(), ch, depth


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


class LiteralsIn:
    """Which of some literals a line holds: one automaton pass (overlapping matches, so a literal inside another
    is found too), or a substring test per literal where the wheel is missing. Same answer either way."""

    def __init__(self, literals: Sequence[str], pure: bool = False) -> None:
        self.literals = tuple(dict.fromkeys(lit for lit in literals if lit))
        self.pure = pure
        self.automaton = None if pure or _ahocorasick is None or not self.literals else \
            _ahocorasick.AhoCorasick(list(self.literals), matchkind=_ahocorasick.MATCHKIND_STANDARD)

    def __reduce__(self) -> tuple:  # the automaton cannot be pickled (a spawned worker): it is rebuilt there
        return (LiteralsIn, (self.literals, self.pure))

    def __call__(self, text: str) -> set[str]:
        if self.automaton is None:
            return {lit for lit in self.literals if lit in text}
        return {self.literals[k] for k, _, _ in self.automaton.find_matches_as_indexes(text, overlapping=True)}
