"""Property-based tests (hypothesis) over what hostile input reaches: the line-prefix and time parsers,
hostlist expansion, the record reader, the report renderers and the #SBATCH value check (issue 16).

CI runs a fixed number of derandomized examples (a fixed seed: the same inputs every run, fast);
`benchmarks/fuzz_long.py` runs these same properties with many random examples
(DDPSLURM_FUZZ_EXAMPLES, DDPSLURM_FUZZ_RANDOM=1).
"""

from __future__ import annotations

import calendar
import contextlib
import datetime as dt
import io
import itertools
import json
import math
import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rich.console import Console

from ddpslurm.analyze.model import Diagnosis, Evidence, RankRow, SourceFile
from ddpslurm.analyze.parse.attribution import strip_prefixes
from ddpslurm.analyze.parse.records import EPOCH_RANGE, FIELD_RULES, MAX_MESSAGE_CHARS, MAX_WORLD_SIZE, record_events
from ddpslurm.analyze.parse.timestamps import parse_time
from ddpslurm.analyze.report.text import render_text, to_json, to_markdown
from ddpslurm.analyze.rules.loading import load_signatures
from ddpslurm.errors import EnvDerivationError
from ddpslurm.sbatch_values import HOSTLIST_OPTIONS, SYNTAX, hostlist_problem, sbatch_value_problem, time_problem
from ddpslurm.scheduler.hostlist import MAX_HOSTS, compress_hostlist, expand_hostlist, expand_tasks_per_node

FUZZ = settings(
    max_examples=int(os.environ.get("DDPSLURM_FUZZ_EXAMPLES", "120")),
    derandomize=os.environ.get("DDPSLURM_FUZZ_RANDOM") != "1",
    deadline=None, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
SIGS = load_signatures()
RAW_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
FAMILIES = {"iso", "iso-tz", "glog", "ctime", "syslog"}

#: characters that matter to terminals, parsers and Markdown, mixed with anything Unicode has
HOSTILE_CHARS = st.one_of(
    st.sampled_from(list("[]:,<>|`*_#\\\"' -0123456789rankRdefault\n\r\t\x00\x1b\x07\x9b\x9c\x85\u2028\u202e\ufeff")),
    st.characters(categories=["L", "N", "P", "S", "Z", "Cc", "Cf", "Cs"]),
)
HOSTILE_TEXT = st.text(HOSTILE_CHARS, max_size=120)


# --- parsers -----------------------------------------------------------------------------------------

@FUZZ
@given(HOSTILE_TEXT)
@example("[rank99999999999]: x")
@example("[1,3]<stdout>:[default0]:[rank3]: 12: node02: [pod-1] x")
def test_strip_prefixes_returns_a_suffix_of_the_line(line: str) -> None:
    found = strip_prefixes(line)
    assert line.endswith(found.text)
    assert found.rank is None or found.rank >= 0


@FUZZ
@given(st.integers(0, 10**12), st.integers(0, 999),
       st.from_regex(r"[A-Z][a-z]{2,12}Error: [a-z ]{0,30}", fullmatch=True))
def test_stacked_prefixes_are_peeled_exactly(rank: int, local: int, body: str) -> None:
    found = strip_prefixes(f"[default{local}]:[rank{rank}]: {body}")
    assert (found.rank, found.local_rank, found.text) == (rank, local, body)
    label = strip_prefixes(f"{rank % 1_000_000:>3}: {body}")
    assert (label.rank, label.rank_from_label, label.text) == (rank % 1_000_000, True, body)


@pytest.mark.parametrize("line", ["[rank" + "9" * 5000 + "]: RuntimeError: boom", "[1," + "7" * 5000 + "]<stdout>: x",
                                  "[default" + "3" * 5000 + "]: x", "9" * 5000 + ": x"])
def test_a_number_beyond_int_conversion_is_no_crash(line: str) -> None:
    """int() refuses more than 4300 digits (ValueError): a prefix with such a number names no rank."""
    found = strip_prefixes(line)
    assert found.rank is None or 0 <= found.rank < 10**18


@FUZZ
@given(HOSTILE_TEXT, st.none() | st.integers(1970, 2100))
@example("2024-02-30T25:61:61.9999999999+99:99", None)
@example("E1399 99:99:99.000000 1 f.cc:1]", 2024)
def test_parse_time_is_none_or_a_finite_time(text: str, year: int | None) -> None:
    found = parse_time(text, year)
    if found is not None:
        seconds, family = found
        assert math.isfinite(seconds) and family in FAMILIES


@FUZZ
@given(st.datetimes(dt.datetime(1990, 1, 1), dt.datetime(2099, 12, 31)), st.sampled_from(["", "[", "x "]))
def test_iso_and_glog_times_round_trip(moment: dt.datetime, lead: str) -> None:
    epoch = calendar.timegm(moment.timetuple()) + moment.microsecond / 1e6
    iso = parse_time(f"{lead}{moment:%Y-%m-%dT%H:%M:%S}.{moment.microsecond:06d}Z] rest")
    assert iso is not None and iso[1] == "iso-tz" and abs(iso[0] - epoch) < 1e-5
    glog = parse_time(f"{lead}E{moment:%m%d %H:%M:%S}.{moment.microsecond:06d} 42 f.cc:1] x", moment.year)
    assert glog is not None and glog[1] == "glog" and abs(glog[0] - epoch) < 1e-5


HOST_NAMES = st.lists(st.builds(lambda p, n, w: f"{p}{str(n).zfill(w)}", st.sampled_from(["n", "gpu-a", "x1-"]),
                                st.integers(0, 120), st.integers(1, 3)), min_size=1, max_size=40)


@FUZZ
@given(HOST_NAMES)
def test_hostlist_compress_then_expand_is_the_identity(hosts: list[str]) -> None:
    assert expand_hostlist(compress_hostlist(hosts)) == hosts


@FUZZ
@given(st.lists(st.sampled_from([*"ab0123456789[]-,x() \n", "99999999999", "1-999999"]), max_size=40).map("".join))
@example("a[1-1000][1-1000][1-1000]")
@example("n[1-999999,1-999999,1-999999]")
@example("4(x99999999999)")
def test_hostlist_expansion_is_bounded_or_refused(text: str) -> None:
    for expand in (expand_hostlist, expand_tasks_per_node):
        with contextlib.suppress(EnvDerivationError):
            assert len(expand(text)) <= MAX_HOSTS


# --- the record reader --------------------------------------------------------------------------------

JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.floats(allow_nan=True),
                         st.sampled_from([-5, 0, 3, MAX_WORLD_SIZE, 10**11, 1e11, 1e300]), HOSTILE_TEXT)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                 st.dictionaries(HOSTILE_TEXT, inner, max_size=3)),
                           max_leaves=8)
RECORDS = st.dictionaries(st.sampled_from([*FIELD_RULES, "exception"]) | HOSTILE_TEXT, JSON_VALUES, max_size=12)
EXCEPTIONS = st.fixed_dictionaries({"type": st.sampled_from(["ValueError", "torch.OutOfMemoryError"]) | HOSTILE_TEXT,
                                    "message": HOSTILE_TEXT | st.just("NCCL error " * 2000)})


@pytest.fixture(scope="module")
def record_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("records")


def _check_events(path: Path, kind: str) -> None:
    source = SourceFile(path=str(path), display=path.name, rank=1, host="n1", kind=kind)
    events, facts = record_events(source, SIGS)
    for event in events:
        assert event.rank is None or 0 <= event.rank < MAX_WORLD_SIZE
        assert event.time is None or EPOCH_RANGE[0] <= event.time < EPOCH_RANGE[1]
        assert event.host is None or (event.host.isascii() and event.host.isprintable() and " " not in event.host)
        assert len(event.text) <= MAX_MESSAGE_CHARS
        event.text.encode("utf-8")  # no lone surrogate
    assert facts.get("world_size") is None or 1 <= facts["world_size"] <= MAX_WORLD_SIZE


@FUZZ
@given(RECORDS | st.builds(lambda r, e: {**r, "exception": e, "status": "error"}, RECORDS, EXCEPTIONS),
       st.sampled_from(["start_record", "exit_record", "job_record", "elastic_error"]))
def test_any_json_record_gives_bounded_events(record_dir: Path, record: dict, kind: str) -> None:
    path = record_dir / "rank_1.exit.json"
    path.write_text(json.dumps(record, allow_nan=True), encoding="utf-8", errors="surrogatepass")
    _check_events(path, kind)


@FUZZ
@given(st.binary(max_size=300) | st.builds(lambda n: b"[" * n + b"]" * n, st.integers(900, 100_000)))
def test_any_bytes_as_a_record_are_survived(record_dir: Path, data: bytes) -> None:
    path = record_dir / "rank_1.start.json"
    path.write_bytes(data)
    _check_events(path, "start_record")


# --- the report renderers -----------------------------------------------------------------------------

def _diagnosis(texts: list[str], rank: int | None) -> Diagnosis:
    t = itertools.cycle(texts)
    return Diagnosis(
        cause="cuda_oom", first_failing_rank=rank, first_failing_host=next(t), confidence="high", summary=next(t),
        advice=[next(t), next(t)], evidence=[Evidence(next(t), 7, rank, next(t), next(t)), Evidence(next(t), 1, None,
                                                                                                  None, next(t))],
        ranks=[RankRow(r, next(t), "culprit", next(t)) for r in range(3)], retry="stop",
        exclude_nodes=[next(t), next(t)], notes=[next(t)])


def _benign(texts: list[str]) -> list[str]:
    return ["x" * max(1, len(text)) for text in texts]


@FUZZ
@given(st.lists(HOSTILE_TEXT, min_size=4, max_size=8), st.none() | st.integers(0, 10**6))
def test_markdown_is_clean_and_keeps_its_shape(texts: list[str], rank: int | None) -> None:
    out = to_markdown(_diagnosis(texts, rank))
    assert not RAW_CONTROLS.search(out.replace("\n", "")), ascii(out)
    out.encode("utf-8")
    shape = to_markdown(_diagnosis(_benign(texts), rank))
    assert len(out.splitlines()) == len(shape.splitlines())  # a single-line field stayed on its line
    assert sum(line.startswith("## ") for line in out.splitlines()) == 1
    assert out.count("```") == 2


@FUZZ
@given(st.lists(HOSTILE_TEXT, min_size=4, max_size=8), st.none() | st.integers(0, 10**6))
def test_json_is_strict_and_clean(texts: list[str], rank: int | None) -> None:
    out = to_json(_diagnosis(texts, rank))
    assert not RAW_CONTROLS.search(out.replace("\n", "")), ascii(out)
    out.encode("utf-8")
    report = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert report["first_failing_rank"] == rank
    assert len(report["ranks"]) == 3


@FUZZ
@given(st.lists(HOSTILE_TEXT, min_size=4, max_size=8), st.none() | st.integers(0, 10**6))
def test_terminal_report_is_clean_and_forges_no_line(texts: list[str], rank: int | None) -> None:
    buffer = io.StringIO()
    render_text(_diagnosis(texts, rank), Console(file=buffer, width=200, color_system=None, highlight=False))
    out = buffer.getvalue()
    assert not RAW_CONTROLS.search(out.replace("\n", "")), ascii(out)
    out.encode("utf-8")
    lines = out.splitlines()
    assert sum(line.startswith("Cause:") for line in lines) == 1
    assert sum(line.startswith("First failing rank:") for line in lines) == 1
    assert sum(line.startswith("Retry:") for line in lines) == 1


# --- the #SBATCH value check --------------------------------------------------------------------------

def sbatch_arguments(line: str) -> list[str]:
    """What sbatch's directive reader (src/sbatch/opt.c, _get_argument) takes from the text after `#SBATCH`:
    white-space separated, quotes group, a backslash escapes, an unquoted `#` ends the line."""
    args, i = [], 0
    while True:
        while i < len(line) and line[i].isspace() and line[i] != "\n":
            i += 1
        if i >= len(line) or line[i] in "\n#":
            return args
        arg, quote = "", ""
        while i < len(line) and (quote or not line[i].isspace()) and line[i] != "\n":
            ch = line[i]
            if ch == "\\" and i + 1 < len(line):
                arg, i = arg + line[i + 1], i + 2
                continue
            if (quote and ch == quote) or (not quote and ch in "\"'"):
                quote = "" if quote else ch
            elif not quote and ch == "#":
                return [*args, arg] if arg else args
            else:
                arg += ch
            i += 1
        args.append(arg)


@FUZZ
@given(st.sampled_from([*SYNTAX, "mail-type", "gres", "comment"]), HOSTILE_TEXT)
@example("partition", "gpu\ntouch /tmp/PWNED #")
@example("mem", "16G\n")
@example("mem", "\u0666\u0664G")
def test_an_accepted_value_is_exactly_one_sbatch_argument(option: str, value: str) -> None:
    if sbatch_value_problem(option, value) is None:
        assert value.isascii() and value.isprintable()
        assert sbatch_arguments(f" --{option}={value}\n#SBATCH --requeue") == [f"--{option}={value}"]


@FUZZ
@given(st.data())
def test_every_value_in_an_options_syntax_is_accepted(data: st.DataObject) -> None:
    option = data.draw(st.sampled_from(sorted(SYNTAX)))
    value = data.draw(st.from_regex(re.compile(SYNTAX[option][0], re.ASCII), fullmatch=True))
    problem = sbatch_value_problem(option, value)
    # a value of the syntax may still mean nothing: a time out of range (`99:99`) or zero (no limit), a hostlist
    # with an empty name; only those checks may refuse it
    meaning = time_problem(value)[1] if option == "time" else \
        hostlist_problem(value) if option in HOSTLIST_OPTIONS else None
    assert problem is None or problem == meaning, problem
