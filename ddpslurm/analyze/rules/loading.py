"""Loading the signature knowledge: `analyzer/signatures/*.toml` (+ site folders) and the cause tables, validated.

In: the shipped signature folder, `$DDPSLURM_SIGNATURES` and any folders given (`--signatures`), each of TOML
files of `[[signature]]` tables beside an optional `causes.toml`. Out: the compiled `SignatureSet` (build_set) with
the layered cause table. A bad file is an `AnalyzeInputError` naming the file and the signature id; a signature
without a `prefilter` gets the literal its pattern must contain (literals.py).
"""

from __future__ import annotations

import os
import re as _re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import regex

from ddpslurm.analyze.model import CAUSES, RETRY, ROLES
from ddpslurm.analyze.rules.cause_shapes import parse_shapes
from ddpslurm.analyze.rules.ib_status import IB_STATUS_FILE, IbStatuses, check_reads, parse_ib_statuses
from ddpslurm.analyze.rules.literals import derive_literal
from ddpslurm.analyze.rules.signatures import (
    CauseInfo,
    Signature,
    SignatureSet,
    build_set,
    compile_pattern,
    shipped_dir,
)
from ddpslurm.analyze.rules.went_on import WENT_ON_FILE, WentOn, parse_went_on
from ddpslurm.errors import AnalyzeInputError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

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
         "desync_verdict", "hostlist")
#: kinds logged by a rank that DETECTED a fault in data a peer sent (it is not the offender)
DETECTOR_KINDS = ("mismatch_detected",)
#: named groups that make a victim's line name a peer (`accuses = "peer"` by default)
PEER_GROUPS = ("peer_rank", "peer_host", "peer_host2", "peer_ip")
_ID = _re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


def _load_toml(path: Path) -> dict[str, Any]:
    """A signature or cause file's tables; an unreadable or invalid file is an AnalyzeInputError."""
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise AnalyzeInputError(f"signature file {path} is not valid TOML: {error}",
                                "fix the file or remove it from the signature folder") from None
    except OSError as error:
        raise AnalyzeInputError(f"cannot read signature file {path}: {error.strerror}",
                                "check the path given to --signatures") from None


def _fail(path: Path, sig_id: str, what: str) -> AnalyzeInputError:
    """The error for signature `sig_id` of file `path`: `what` is wrong with it."""
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
            compile_pattern(pattern)
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
                               node_level=bool(raw.get("node_level", False)),
                               shapes=parse_shapes(raw.get("shapes"), path, cause))
    return out


def default_dirs() -> list[Path]:
    """The shipped signature folder."""
    return [shipped_dir()]



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
        for path in sorted(p for p in folder.glob("*.toml") if p.name not in (CAUSES_FILE, WENT_ON_FILE,
                                                                             IB_STATUS_FILE)):
            for sig in load_signature_file(path, validate=index > 0, causes=causes):
                if sig.id in seen:
                    raise _fail(path, sig.id, f"duplicate id (also in {seen[sig.id]})")
                seen[sig.id] = path
                if index == 0 and sig.id in by_id:
                    raise _fail(path, sig.id, "duplicate id")
                by_id[sig.id] = sig
    went_on = load_went_on(dirs)
    missing = went_on.agent_survives - set(by_id)
    if missing:
        raise AnalyzeInputError(f"went_on.toml names unknown signature(s) {', '.join(sorted(missing))}",
                                "name a signature id of the signature folders in [[agent_survives]]")
    statuses, sources = load_ib_statuses(dirs)
    check_reads(statuses, {sig_id: sig.pattern_text for sig_id, sig in by_id.items()}, sources)
    built = build_set(by_id.values(), causes, went_on)
    built.ib_statuses = statuses
    return built


def load_ib_statuses(dirs: Sequence[Path]) -> tuple[IbStatuses, list[Path]]:
    """The InfiniBand completion statuses: the shipped `analyzer/ib_status.toml`, then each site folder's own
    `ib_status.toml`; with the files read."""
    statuses, sources = IbStatuses(), []
    for path in (dirs[0].parent / IB_STATUS_FILE, *(d / IB_STATUS_FILE for d in dirs[1:])):
        if path.is_file():
            statuses = statuses.extended(parse_ib_statuses(_load_toml(path), path))
            sources.append(path)
    return statuses, sources


def load_went_on(dirs: Sequence[Path]) -> WentOn:
    """The rules that say a process went on after an exception: the shipped `analyzer/went_on.toml`, then each
    site folder's own `went_on.toml`."""
    rules = WentOn()
    for path in (dirs[0].parent / WENT_ON_FILE, *(d / WENT_ON_FILE for d in dirs[1:])):
        if path.is_file():
            rules = rules.extended(parse_went_on(_load_toml(path), path))
    return rules

