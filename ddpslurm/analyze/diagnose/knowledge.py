"""The combiner's knowledge as declared data: `analyzer/combiner.toml`, loaded and validated once.

In: the TOML file (thresholds, the own-weight scale, cause groups, and each producer's weights and traits). Out: a
frozen `Knowledge` that the producers and the combiner read (`knowledge()`, cached), so no code branches on a
producer's name. The schema (which names exist) is here; every value is in the file. A bad file is one
`AnalyzeInputError` naming the file and the key: an unknown or missing key, an unknown cause, a producer the code
does not have or one it has and the file lacks, a value that is not a non-negative number.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ddpslurm.analyze.model import CAUSES
from ddpslurm.errors import AnalyzeInputError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

KNOWLEDGE_FILE = "combiner.toml"
THRESHOLDS = ("time_tolerance", "systemic_window", "systemic_share", "strong_own", "margin", "min_weight",
              "job_decisive", "only_high", "weight_medium_margin", "victim_discount")
OWN_WEIGHT = ("culprit_base", "culprit_per_priority", "either_base", "either_per_priority")
CAUSE_GROUPS = ("waiting", "broken_transfer", "lost_peer", "teardown_consequence", "wait_ends", "requeue_marks",
                "ran_again", "retried", "store")
#: what a producer's votes are (analyzer/combiner.toml explains each)
TRAITS = ("ends_job", "names_awaited", "names_lost_peer", "node_report", "by_priority", "every_rank")
#: every producer the code has, with the names of its weights (`()`: one `weight`; None: weighs `own_weight`)
PRODUCERS: Mapping[str, tuple[str, ...] | None] = MappingProxyType({
    "own failure": None,
    "launcher pick": None,
    "host report": ("scale",),
    "detector": (),
    "srun order": ("first", "later", "exit_code_factor"),
    "vanished": ("gone_shared",),
    "agent teardown": ("spared_shared",),
    "log stops early": ("early_shared",),
    "slurm": ("job_least",),
    "lost peer": ("base", "per_reporter"),
    "named peer": ("base", "per_reporter"),
    "monitored barrier": ("named_shared",),
    "unique id": (),
    "store barrier": ("world_disagrees", "impossible_rank_shared", "too_many", "too_few", "missing_shared"),
    "store keys": ("own_key_shared", "awaited"),
    "stuck in NCCL init": ("missing_shared",),
    "absent from timeouts": ("absent_shared",),
    "timed out alike": (),
    "lowest completed": ("behind_shared",),
    "never issued": ("behind_shared",),
    "mismatched collectives": (),
    "odd collective": ("in_timeouts", "in_reports"),
    "hang stacks": ("outside_shared", "all_alike", "mismatch", "minority_shared"),
    "flight recorder": ("behind_shared", "mismatch", "minority_shared"),
    "mismatch reports": (),
    "desync report": ("every_rank", "named_shared"),
    "odd version": (),
    "interface pick": ("every_rank", "ranks_shared", "unreachable_peer"),
    "ranks beyond world": (),
    "duplicate ranks": (),
})
_ONE = ""  # the key of a producer's single `weight`


@dataclass(frozen=True)
class Producer:
    """One producer's declared weights and traits."""

    name: str
    description: str
    weights: Mapping[str, float]
    traits: frozenset[str] = frozenset()
    tie: str | None = None  # why no single rank, when the ranks tied all have its votes (`{n}`: how many)

    @property
    def ends_job(self) -> bool:
        return "ends_job" in self.traits

    @property
    def names_awaited(self) -> bool:
        return "names_awaited" in self.traits

    @property
    def names_lost_peer(self) -> bool:
        return "names_lost_peer" in self.traits

    @property
    def node_report(self) -> bool:
        return "node_report" in self.traits

    @property
    def by_priority(self) -> bool:
        return "by_priority" in self.traits

    @property
    def every_rank(self) -> bool:
        return "every_rank" in self.traits


@dataclass(frozen=True)
class Knowledge:
    """The whole file, validated."""

    path: Path
    thresholds: Mapping[str, float]
    own_weight: Mapping[str, float]
    groups: Mapping[str, tuple[str, ...]]
    producers: Mapping[str, Producer] = field(default_factory=dict)

    def weight(self, producer: str, name: str = _ONE) -> float:
        """A producer's weight: its one `weight`, or the one of its `weights` called `name`."""
        return self.producers[producer].weights[name]


def shipped_path() -> Path:
    """The shipped analyzer/combiner.toml (beside the signature folder, installed or in a checkout)."""
    from ddpslurm._data import data_dir

    return data_dir("analyzer") / KNOWLEDGE_FILE


@cache
def knowledge() -> Knowledge:
    """The shipped knowledge, loaded and validated on first use."""
    return load_knowledge(shipped_path())


def threshold(name: str) -> float:
    return knowledge().thresholds[name]


def group(name: str) -> tuple[str, ...]:
    return knowledge().groups[name]


def weight(producer: str, name: str = _ONE) -> float:
    return knowledge().weight(producer, name)


def own_scale(name: str) -> float:
    """A term of `[own_weight]`: what a rank's own line weighs by its role and priority."""
    return knowledge().own_weight[name]


def producer(name: str) -> Producer:
    """The declared producer `name`; a name the file does not declare is a programming error (KeyError)."""
    return knowledge().producers[name]


def load_knowledge(path: Path) -> Knowledge:
    """`path` read and validated against the schema above."""
    try:
        with path.open("rb") as handle:
            raw = tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise AnalyzeInputError(f"{path} is not valid TOML: {error}", "fix the file") from None
    except OSError as error:
        raise AnalyzeInputError(f"cannot read {path}: {error.strerror}", "reinstall ddpslurm") from None
    _keys(path, "", raw, required=("thresholds", "own_weight", "cause_groups", "producers"))
    return Knowledge(path=path, thresholds=_numbers(path, "thresholds", raw["thresholds"], THRESHOLDS),
                     own_weight=_numbers(path, "own_weight", raw["own_weight"], OWN_WEIGHT),
                     groups=_groups(path, raw["cause_groups"]), producers=_producers(path, raw["producers"]))


def _fail(path: Path, where: str, what: str) -> AnalyzeInputError:
    return AnalyzeInputError(f"{path}: {where}: {what}", "fix the file (its header says what each key means)")


def _table(path: Path, where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, where, "must be a table")
    return value


def _keys(path: Path, where: str, table: dict[str, Any], required: tuple[str, ...],
          optional: tuple[str, ...] = ()) -> None:
    """Every key of `table` is known and every required one is there."""
    for key in table:
        if key not in required and key not in optional:
            raise _fail(path, f"{where}.{key}" if where else f"[{key}]", "unknown key")
    for key in required:
        if key not in table:
            raise _fail(path, f"{where}.{key}" if where else f"[{key}]", "missing")


def _number(path: Path, where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise _fail(path, where, f"must be a non-negative number, not {value!r}")
    return float(value)


def _numbers(path: Path, section: str, value: Any, names: tuple[str, ...]) -> Mapping[str, float]:
    table = _table(path, f"[{section}]", value)
    _keys(path, f"[{section}]", table, required=names)
    return MappingProxyType({k: _number(path, f"[{section}].{k}", table[k]) for k in names})


def _causes(path: Path, where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise _fail(path, where, "must be a list of cause names")
    for cause in value:
        if cause not in CAUSES:
            raise _fail(path, where, f"{cause!r} is not a cause of the vocabulary (DESIGN.md)")
    return tuple(value)


def _groups(path: Path, value: Any) -> Mapping[str, tuple[str, ...]]:
    """Each group a list of causes, or `{causes = [...], includes = [groups]}` (a group defined before it)."""
    table = _table(path, "[cause_groups]", value)
    _keys(path, "[cause_groups]", table, required=CAUSE_GROUPS)
    out: dict[str, tuple[str, ...]] = {}
    for name, spec in table.items():
        where = f"[cause_groups].{name}"
        if not isinstance(spec, dict):
            out[name] = _causes(path, where, spec)
            continue
        _keys(path, where, spec, required=("causes",), optional=("includes",))
        causes = list(_causes(path, f"{where}.causes", spec["causes"]))
        for included in spec.get("includes", []):
            if included not in out:
                raise _fail(path, f"{where}.includes", f"{included!r} is not a group defined before it")
            causes += [c for c in out[included] if c not in causes]
        out[name] = tuple(causes)
    return MappingProxyType(out)


def _producers(path: Path, value: Any) -> Mapping[str, Producer]:
    table = _table(path, "[producers]", value)
    for name in table:
        if name not in PRODUCERS:
            raise _fail(path, f"[producers.{name!r}]", "no such producer in the code")
    out: dict[str, Producer] = {}
    for name, names in PRODUCERS.items():
        where = f"[producers.{name!r}]"
        if name not in table:
            raise _fail(path, where, "missing: every producer is declared")
        spec = _table(path, where, table[name])
        weights: dict[str, float] = {}
        optional = (*TRAITS, "tie")
        if names == ():
            _keys(path, where, spec, required=("description", "weight"), optional=optional)
            weights[_ONE] = _number(path, f"{where}.weight", spec["weight"])
        elif names is None:
            _keys(path, where, spec, required=("description",), optional=optional)
        else:
            _keys(path, where, spec, required=("description", "weights"), optional=optional)
            named = _table(path, f"{where}.weights", spec["weights"])
            _keys(path, f"{where}.weights", named, required=names)
            weights = {k: _number(path, f"{where}.weights.{k}", named[k]) for k in names}
        for trait in TRAITS:
            if trait in spec and not isinstance(spec[trait], bool):
                raise _fail(path, f"{where}.{trait}", "must be true or false")
        for key in ("description", "tie"):
            if key in spec and (not isinstance(spec[key], str) or not spec[key].strip()):
                raise _fail(path, f"{where}.{key}", "must be a non-empty string")
        tie = spec.get("tie")
        if tie is not None and any(ch in tie.replace("{n}", "") for ch in "{}"):
            raise _fail(path, f"{where}.tie", "may hold `{n}` (how many ranks) and no other braces")
        out[name] = Producer(name=name, description=spec["description"], weights=MappingProxyType(weights),
                             traits=frozenset(t for t in TRAITS if spec.get(t) is True), tie=tie)
    return MappingProxyType(out)
