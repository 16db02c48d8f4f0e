"""Who said a line: prefixes and file names -> rank, local rank, host (table-driven)."""

from __future__ import annotations

import re
from pathlib import PurePath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpslurm.analyze.parse import attribution
from ddpslurm.analyze.parse.attribution import (
    ANY_RULE,
    RULES,
    clean,
    nccl_source,
    prefix_spans,
    strip_prefixes,
)
from ddpslurm.analyze.read.file_names import path_info
from tests.unit.test_analyze_digit_shape import corpus_lines


@pytest.mark.parametrize(("line", "rank", "local_rank", "host", "text"), [
    ("[rank3]:RuntimeError: boom", 3, None, None, "RuntimeError: boom"),
    ("[rank12]: Traceback (most recent call last):", 12, None, None, "Traceback (most recent call last):"),
    ("[default0]:[rank3]: RuntimeError: x", 3, 0, None, "RuntimeError: x"),
    ("[default5]:hello", None, 5, None, "hello"),
    ("[trainer2]:loss=1.0", None, 2, None, "loss=1.0"),
    ("3: RuntimeError: boom", 3, None, None, "RuntimeError: boom"),
    (" 12: Traceback", 12, None, None, "Traceback"),
    ("[1,3]<stdout>:epoch 1", 3, None, None, "epoch 1"),
    ("[0,15]<stderr>:Error", 15, None, None, "Error"),
    ("node02: [rank5]: Traceback", 5, None, "node02", "Traceback"),
    ("10.0.0.2: [rank3]: x", 3, None, "10.0.0.2", "x"),
    ("gpu-st-p4d-24xlarge-1: loss", None, None, "gpu-st-p4d-24xlarge-1", "loss"),
    ("[trainer-worker-1] RuntimeError: x", None, None, "trainer-worker-1", "RuntimeError: x"),
    ("[2024-02-27T21:35:32.106313Z] 0c41e7b2 || [rank6]: RuntimeError: x", 6, None, "0c41e7b2", "RuntimeError: x"),
    # Determined's trial log heads: the CLI's `[] [rank=N] `, the stored `<time> <container> [rank=N] || `
    ("[] [rank=0] RuntimeError: CUDA out of memory.", 0, None, None, "RuntimeError: CUDA out of memory."),
    ("[2024-02-27T21:35:28.926822Z] fa88a9df [rank=3] || Traceback", 3, None, None, "Traceback"),
    ("[rank=23]: step=29 memory peak_mem_gib=2.08", 23, None, None, "step=29 memory peak_mem_gib=2.08"),
    # a log viewer's line number is not a rank
    ("[80746] RuntimeError: x", None, None, None, "RuntimeError: x"),
    ("2024-05-08T08:47:31.1234567Z [rank2]: boom", 2, None, None, "boom"),
    # not prefixes
    ("RuntimeError: x", None, None, None, "RuntimeError: x"),
    ("srun: error: node02: task 3: Killed", None, None, None, "srun: error: node02: task 3: Killed"),
    ("slurmstepd: error: *** JOB 1 ON n1 CANCELLED", None, None, None, "slurmstepd: error: *** JOB 1 ON n1 CANCELLED"),
    ("node02:1234:5678 [0] NCCL WARN x", None, None, None, "node02:1234:5678 [0] NCCL WARN x"),
    ("[info] starting", None, None, None, "[info] starting"),
])
def test_strip_prefixes(line: str, rank: int | None, local_rank: int | None, host: str | None, text: str) -> None:
    got = strip_prefixes(line)
    assert (got.rank, got.local_rank, got.host, got.text) == (rank, local_rank, host, text)


def test_time_prefix_is_kept_as_time() -> None:
    got = strip_prefixes("[2024-05-08 08:47:31,261] torch.distributed.elastic: [WARNING] x")
    assert got.time_text == "2024-05-08 08:47:31,261"
    assert got.host is None


@pytest.mark.parametrize(("line", "expected"), [
    ("node02:1234:5678 [3] NCCL INFO x", ("node02", 1234)),
    ("gpu-a.cluster:99:100 [0] NCCL WARN y", ("gpu-a.cluster", 99)),
    ("NCCL INFO no source", None),
    ("10-1-2-3:77:78 [1] NCCL INFO starts with a digit", ("10-1-2-3", 77)),
    ("-worker-1:946:988 [0] NCCL WARN NET/IB : a paste cut inside the host", None),
    (".cluster:99:100 [0] NCCL WARN cut before the dot", None),
])
def test_nccl_source(line: str, expected: tuple[str, int] | None) -> None:
    assert nccl_source(line) == expected


@pytest.mark.parametrize(("path", "rank", "local_rank", "host", "attempt", "kind"), [
    ("123_4_log.out", 4, None, None, None, "log"),
    ("123_17_log.err", 17, None, None, None, "log"),
    ("45_2_7_log.out", 7, None, None, None, "log"),
    ("attempt_0/rank_3.log", 3, None, None, 0, "log"),
    ("attempt_2/rank_3.exit.json", 3, None, None, 2, "exit_record"),
    ("attempt_1/rank_0.start.json", 0, None, None, 1, "start_record"),
    ("node02/attempt_0/3/stdout.log", None, 3, "node02", 0, "log"),
    ("none_i9e0dj_h/attempt_0/3/stdout.log", None, 3, None, 0, "log"),  # torchrun's run folder, not a host
    ("gpu-0009/4817_k2_9x_a1/attempt_1/0/stderr.log", None, 0, "gpu-0009", 1, "log"),
    ("logs/attempt_0/2/error.json", None, 2, None, 0, "elastic_error"),
    ("ddpslurm.json", None, None, None, None, "job_record"),
    ("slurm-123.out", None, None, None, None, "log"),
    ("node02/slurm-1.out", None, None, "node02", None, "log"),
    ("rank1.log", 1, None, None, None, "log"),  # a person's own names for per-rank logs
    ("logs/rank-12.txt", 12, None, None, None, "log"),
    ("ranks.log", None, None, None, None, "log"),
    ("rank1_old.log", None, None, None, None, "log"),
])
def test_path_info(path: str, rank, local_rank, host, attempt, kind) -> None:
    info = path_info(PurePath(path))
    assert (info.rank, info.local_rank, info.host, info.attempt, info.kind) == (rank, local_rank, host, attempt, kind)


@pytest.mark.parametrize(("raw", "expected"), [
    ("\x1b[31mRuntimeError\x1b[0m: x", "RuntimeError: x"),
    ("progress 10%\rprogress 100%\rRuntimeError: y", "RuntimeError: y"),
    ("bell\x07 and nul\x00", "bell and nul"),
    ("tab\tkept", "tab\tkept"),
])
def test_clean(raw: str, expected: str) -> None:
    assert clean(raw) == expected


#: text made of what line prefixes are made of, to reach the rules' corners
prefixish = st.text(alphabet="[]():|,.-_ 0123456789rRankdefaultpid=ipstdoutTZ+<>|", max_size=40)


@settings(max_examples=3000, deadline=None)
@given(prefixish, st.sampled_from(["", "x", " hello", "[rank3]: y", "gpu-01:1:2 [0] NCCL INFO z"]))
def test_the_one_match_for_all_rules_misses_no_rule(head: str, rest: str) -> None:
    """Where some rule matches (not empty) at the start, the one-pattern test says so too: it only ever spares the
    per-rule loop lines that loop would find nothing in."""
    text = head + rest
    if any((m := rule.match(text)) and m.end() for rule, _ in RULES):
        assert ANY_RULE.match(text), text


def test_prefixes_of_the_corpus_read_the_same_with_the_one_match_first(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = corpus_lines(limit=40_000, with_prefixes=True)
    fast = [prefix_spans(line) for line in lines]
    monkeypatch.setattr(attribution, "ANY_RULE", re.compile(""))  # every line tried rule by rule
    assert [prefix_spans(line) for line in lines] == fast
    assert len(lines) > 20_000


@given(run_id=st.from_regex(r"[A-Za-z0-9][\w.-]{0,20}", fullmatch=True),
       suffix=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=8, max_size=8),
       host=st.sampled_from([None, "gpu-0009", "node02", "a100-12.cluster"]),
       local=st.integers(0, 15), attempt=st.integers(0, 9))
def test_torchrun_log_dir_run_folder_is_never_a_host(run_id: str, suffix: str, host: str | None, local: int,
                                                      attempt: int) -> None:
    """torchrun --log-dir writes `<log_dir>/<run_id>_<8 of tempfile's characters>/attempt_N/<local rank>/`: the
    agent's folder names no host whatever its random part; a host folder above it still does."""
    parts = (*([host] if host else []), f"{run_id}_{suffix}", f"attempt_{attempt}", str(local), "stdout.log")
    info = path_info(parts)
    assert (info.host, info.local_rank, info.attempt) == (host, local, attempt)
