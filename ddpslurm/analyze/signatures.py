"""Failure signatures as data: load `analyzer/signatures/*.toml` (+ site folders), validate, compile.

A bad file is an `AnalyzeInputError` naming the file and the signature id. The scanner's cheap prefilter
is built here: a buffer is searched for a few byte strings (ANCHORS) before any regex runs, and only lines
holding one are parsed. A matching line holds ANY ONE of a signature's `prefilter` literals, so every
literal must contain an anchor; a literal that contains none (a site's `SITE GPU FAULT`) becomes an anchor
itself. Per line, a signature's regex runs only when one of its literals is in the line.
"""

from __future__ import annotations

import functools
import os
import re as _re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regex

from ddpslurm.analyze.events import CAUSES, RETRY, ROLES
from ddpslurm.errors import AnalyzeInputError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

#: Short substrings that nearly every interesting line contains one of; signature literals that contain an
#: anchor are found through it, the others become anchors themselves. Case-sensitive, like all prefilters.
ANCHORS: tuple[str, ...] = (
    "rror", "Traceback", "WARN", "Init COMPLETE", "atchdog", "ignal", "illed", "exitcode", "imed out", "RESTART_COUNT",
)
#: looked for only in the first HEAD_BYTES of a file (submitit writes it first)
HEAD_ANCHORS: tuple[str, ...] = ("JobEnvironment(",)
#: signature kinds the engine attaches to events it builds itself (never matched against a raw line)
ENGINE_KINDS = ("elastic_failure",)
_KEYS = {"id", "cause", "role", "pattern", "prefilter", "priority", "advice", "summary", "retry", "exclude_node",
         "kind", "description"}
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


@dataclass
class SignatureSet:
    """All signatures, ordered by priority (highest first), with the scanner's anchors."""

    signatures: list[Signature]
    causes: dict[str, CauseInfo] = field(default_factory=dict)
    anchors: tuple[bytes, ...] = ()
    always: tuple[Signature, ...] = ()
    _by_literal: dict[str, list[int]] = field(default_factory=dict, repr=False)
    _no_literal: set[int] = field(default_factory=set, repr=False)

    def match(self, text: str) -> tuple[Signature, regex.Match] | None:
        """The highest-priority signature matching `text` (a line without its prefixes), or None."""
        if not self._by_literal:
            self._index()
        hits = {i for lit, idx in self._by_literal.items() if lit in text for i in idx}
        for i in sorted(hits | self._no_literal):
            sig = self.signatures[i]
            m = sig.pattern.search(text, timeout=0.5) if len(text) > 2000 else sig.pattern.search(text)
            if m:
                return sig, m
        return None

    def _index(self) -> None:
        """literal -> indexes of the signatures it gates (signatures are ordered by priority)."""
        for i, sig in enumerate(self.signatures):
            if sig.kind in ENGINE_KINDS:
                continue
            if not sig.prefilter:
                self._no_literal.add(i)
            for lit in sig.prefilter:
                self._by_literal.setdefault(lit, []).append(i)

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


def derive_literal(pattern: str) -> str | None:
    """The longest top-level literal run that every match of `pattern` must contain, or None when unsure."""
    if "(?i" in pattern or "|" in _strip_groups(pattern).replace("\\|", ""):
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
            i += 2
            continue
        if ch in "*?{":
            current = current[:-1]
            close()
            if ch == "{":
                i = pattern.find("}", i) if pattern.find("}", i) > 0 else n
        elif ch == "[":
            close()
            j = i + 1
            while j < n and (pattern[j] != "]" or j == i + 1):
                j += 2 if pattern[j] == "\\" else 1
            i = j
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


def _strip_groups(pattern: str) -> str:
    """The pattern with parenthesized parts removed (to look for a top-level `|`)."""
    out, depth, i = [], 0, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            if depth == 0:
                out.append(pattern[i:i + 2])
            i += 2
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
        i += 1
    return "".join(out)


def _fail(path: Path, sig_id: str, what: str) -> AnalyzeInputError:
    return AnalyzeInputError(f"signature {sig_id!r} in {path}: {what}",
                             "fix that entry (the schema is in analyzer/signatures/README.md)")


def parse_signature(raw: dict[str, Any], path: Path, validate: bool = True) -> Signature:
    """Validate one `[[signature]]` table; `validate` also compiles its pattern now (site files)."""
    sig_id = raw.get("id")
    if not isinstance(sig_id, str) or not _ID.match(sig_id):
        raise _fail(path, str(sig_id), "`id` must be a kebab-case string")
    unknown = set(raw) - _KEYS
    if unknown:
        raise _fail(path, sig_id, f"unknown key(s) {', '.join(sorted(unknown))}")
    cause = raw.get("cause")
    if cause not in CAUSES:
        raise _fail(path, sig_id, f"unknown cause {cause!r} (the vocabulary is in DESIGN.md)")
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
    if not isinstance(kind, str):
        raise _fail(path, sig_id, "`kind` must be a string")
    return Signature(id=sig_id, cause=cause, role=role, pattern_text=pattern, prefilter=tuple(prefilter),
                     priority=priority, advice=tuple(advice), summary=summary, retry=retry, exclude_node=exclude,
                     kind=kind, source=str(path))


def load_signature_file(path: Path, validate: bool = True) -> list[Signature]:
    """All signatures of one TOML file (`validate=False` defers compiling to first use: shipped files are tested)."""
    data = _load_toml(path)
    tables = data.get("signature", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise AnalyzeInputError(f"signature file {path} must hold a list of [[signature]] tables",
                                "write each signature as a [[signature]] table")
    return [parse_signature(t, path, validate) for t in tables]


def load_causes(path: Path) -> dict[str, CauseInfo]:
    """Cause-level defaults; every table name must be in the vocabulary."""
    if not path.is_file():
        return {}
    out: dict[str, CauseInfo] = {}
    for cause, raw in _load_toml(path).items():
        if cause not in CAUSES or not isinstance(raw, dict):
            raise AnalyzeInputError(f"{path}: [{cause}] is not a cause of the vocabulary",
                                    "use one of the causes listed in DESIGN.md")
        retry = raw.get("retry", "unknown")
        if retry not in RETRY:
            raise AnalyzeInputError(f"{path}: [{cause}] retry must be one of {', '.join(RETRY)}", "fix the value")
        out[cause] = CauseInfo(cause=cause, summary=str(raw.get("summary", cause.replace("_", " "))),
                               advice=tuple(str(a) for a in raw.get("advice", [])), retry=retry,
                               exclude_node=bool(raw.get("exclude_node", False)))
    return out


def default_dirs() -> list[Path]:
    """The shipped signature folder."""
    from ddpslurm._data import data_dir

    return [data_dir("analyzer") / "signatures"]


def load_signatures(extra_dirs: Sequence[str | Path] = (), *, use_env: bool = True) -> SignatureSet:
    """The shipped signatures, then `$DDPSLURM_SIGNATURES` (os.pathsep-separated) and `extra_dirs`.

    A later folder may redefine an id of an earlier one (a site overrides a shipped signature); the same id
    twice within one folder is an error.
    """
    dirs: list[Path] = default_dirs()
    if use_env and os.environ.get("DDPSLURM_SIGNATURES"):
        dirs += [Path(p) for p in os.environ["DDPSLURM_SIGNATURES"].split(os.pathsep) if p]
    dirs += [Path(d) for d in extra_dirs]
    by_id: dict[str, Signature] = {}
    for index, folder in enumerate(dirs):
        if not folder.is_dir():
            raise AnalyzeInputError(f"signature folder {folder} does not exist or is not a folder",
                                    "give a folder of *.toml files to --signatures")
        seen: dict[str, Path] = {}
        for path in sorted(folder.glob("*.toml")):
            for sig in load_signature_file(path, validate=index > 0):
                if sig.id in seen:
                    raise _fail(path, sig.id, f"duplicate id (also in {seen[sig.id]})")
                seen[sig.id] = path
                if index == 0 and sig.id in by_id:
                    raise _fail(path, sig.id, "duplicate id")
                by_id[sig.id] = sig
    causes = load_causes(dirs[0].parent / "causes.toml")
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
