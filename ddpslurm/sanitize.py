"""The one sanitizer for text that reaches a terminal, a Markdown ticket or a JSON document.

Log lines, file names, host and job names are chosen by whoever wrote the logs or submitted the job:
they must never drive the terminal (C0/C1 controls, ESC and 8-bit CSI sequences, bidi overrides),
forge report lines (a newline in a single-line field) or become markup in a ticket. Undecodable
bytes of a file name (Python keeps them as lone surrogates) are shown as `\\xNN`, so the output is
always valid UTF-8. Pure functions, no imports beyond the standard library.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

#: ESC-introduced sequences (CSI, OSC/DCS/APC/PM/SOS strings, two-byte escapes) and 8-bit CSI/OSC.
_ESCAPE_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI
    r"|\x1b[\]PX^_][^\x07\x1b\x9c]{0,4096}(?:\x07|\x1b\\|\x9c)?"  # OSC, DCS, SOS, PM, APC up to BEL or ST
    r"|\x1b[ -/]*[0-~]?"  # other escapes (nF, Fp, Fe, Fs), or a lone ESC
    r"|\x9b[0-?]*[ -/]*[@-~]?"  # 8-bit CSI
    r"|[\x90\x98\x9d\x9e\x9f][^\x07\x1b\x9c]{0,4096}(?:\x07|\x1b\\|\x9c)?"  # 8-bit DCS, SOS, OSC, PM, APC
)
#: what ends a line for a terminal or a reader: kept in multi-line text only, a space in single-line text
_LINE_BREAK = re.compile(r"\r\n|[\n\r\x0b\x0c\x85\u2028\u2029]")
#: C0 (tab aside), DEL, C1, and the bidi controls that reorder what a terminal shows (Trojan Source)
_INVISIBLE = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
#: characters a JSON document carries as `\uXXXX` although JSON allows them raw (a terminal may act on them)
_JSON_RISKY = re.compile(r"[\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
#: Markdown punctuation that can start markup (CommonMark lets any ASCII punctuation be backslash-escaped)
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>|#~!{}])")
#: what a Markdown renderer links without any markup (GFM's extended autolinks: `www.`, a scheme's `x://`, an
#: e-mail address, `mailto:`/`xmpp:`; GitLab's and others' any `scheme://`): up to a space, a backtick or a table's `|`
_BARE_LINK = re.compile(r"(?:\b[A-Za-z][A-Za-z0-9+.-]*://|\bwww\.|\b(?:mailto|xmpp):|[\w.+-]+@[\w-]+\.[\w-])"
                        r"[^\s`|<>]*", re.ASCII)


def _show_surrogate(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte kept by surrogateescape (os.fsdecode)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def escape_undecodable(text: str) -> str:
    """Lone surrogates (undecodable bytes of a file name, broken JSON escapes) as visible `\\xNN`/`\\uXXXX`."""
    return _SURROGATE.sub(_show_surrogate, text) if _SURROGATE.search(text) else text


def terminal(text: object, *, single_line: bool = True) -> str:
    """`text` safe for a terminal: no escape sequence, no control character, valid UTF-8.

    Single-line text (a host, a file name, a summary) gets its line breaks and tabs as spaces, so it
    cannot forge a report line; multi-line text keeps `\\n` only.
    """
    value = escape_undecodable(text if isinstance(text, str) else "" if text is None else str(text))
    if "\x1b" in value or _has_8bit_introducer(value):
        value = _ESCAPE_SEQUENCE.sub("", value)
    breaks = " " if single_line else "\n"
    value = _LINE_BREAK.sub(breaks, value)
    if single_line:
        value = value.replace("\t", " ")
    return _INVISIBLE.sub("", value)


def _has_8bit_introducer(value: str) -> bool:
    return any(ch in value for ch in "\x90\x98\x9b\x9d\x9e\x9f")


def _link_end(text: str, start: int, end: int) -> int:
    """Where a bare link ends for the reader: without a sentence's trailing punctuation, and without a closing
    parenthesis it did not open (`see [here](http://x/y).`: the link is `http://x/y`)."""
    while end > start:
        last = text[end - 1]
        unopened = last == ")" and text.count("(", start, end) < text.count(")", start, end)
        if last not in ".,:;!?'\"" and not unopened:
            break
        end -= 1
    return end


def markdown(text: object) -> str:
    """Single-line text for a Markdown ticket: terminal-safe, every markup character escaped, and each bare URL or
    e-mail address in a code span, where no renderer makes it a live link."""
    value = terminal(text)
    out, at = [], 0
    for link in _BARE_LINK.finditer(value):
        end = _link_end(value, link.start(), link.end())
        out += [_MARKDOWN_SPECIAL.sub(r"\\\1", value[at:link.start()]), f"`{value[link.start():end]}`"]
        at = end
    out.append(_MARKDOWN_SPECIAL.sub(r"\\\1", value[at:]))
    return "".join(out)


def code_text(text: object) -> str:
    """Single-line text inside a Markdown code span or fence: terminal-safe, with no backtick to close it."""
    return terminal(text).replace("`", "'")


def json_safe(value: Any) -> Any:
    """A JSON-ready copy of `value`: strings (keys too) without lone surrogates, non-finite floats as null."""
    if isinstance(value, str):
        return escape_undecodable(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {json_safe(k) if isinstance(k, str) else k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def json_dumps(value: Any, *, indent: int | None = 2) -> str:
    """Strict JSON (no NaN), valid UTF-8, with C0, C1, DEL, line separators and bidi controls as `\\uXXXX`."""
    return "".join(json_pieces(value, indent=indent))


def json_pieces(value: Any, *, indent: int | None = 2, size: int = 1 << 16) -> Iterator[str]:
    """`json_dumps(value)` in pieces of about `size` characters: a big object (a 65k-rank job's report) is written
    without its whole text held at once, twice (the text, then its encoded bytes). Escaping is per character, so
    it holds across pieces."""
    encoder = json.JSONEncoder(indent=indent, ensure_ascii=False, allow_nan=False)
    held: list[str] = []
    count = 0
    for chunk in encoder.iterencode(json_safe(value)):
        held.append(chunk)
        count += len(chunk)
        if count >= size:
            yield _escape_risky("".join(held))
            held, count = [], 0
    if held:
        yield _escape_risky("".join(held))


def _escape_risky(text: str) -> str:
    return _JSON_RISKY.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
