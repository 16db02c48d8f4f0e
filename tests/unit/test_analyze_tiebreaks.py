"""Tie-breaks are not evidence: a launcher's pick among same-second deaths, the order processes printed in or files
were given in, and signature priority between causes never name a rank; every rank timing out alike is a job-level
finding that a teardown line does not outweigh. Each job is built here and perturbed (ranks renumbered, files in the
other order, hosts renamed): the answer must not move. A control where the logs do order the ranks keeps every test
able to fail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddpslurm.analyze.api import analyze_paths

WHEN = "2024-03-27_14:52:55"
SIGNALS = {-9: "SIGKILL", -11: "SIGSEGV"}
ENTRY = """[{idx}]:
  time      : {time}
  host      : {host}
  rank      : {rank} (local_rank: {local})
  exitcode  : {code} (pid: {pid})
  error_file: <N/A>
  traceback : Signal {sig} ({name}) received by PID {pid}"""


def _entry(idx: int, host: str, rank: int, local: int, code: int, pid: int, when: str) -> str:
    return ENTRY.format(idx=idx, time=when, host=host, rank=rank, local=local, code=code, pid=pid, sig=-code,
                        name=SIGNALS[code])


def torchrun_node(host: str, node: int, per_node: int, world: int, dead: list[int], *, code: int = -9,
                  block: bool = True, sigterm: bool = True, pid0: int = 45619, when: str = WHEN) -> str:
    """One node's torchrun log: NCCL's init of each worker (host:pid -> rank), the agent's SIGTERM of the survivors,
    its `failed (exitcode: ...) local_rank: L` line for its pick (the lowest local rank of `dead`), and optionally
    the ChildFailedError block listing every dead worker in the same second."""
    pid = {local: pid0 + local for local in range(per_node)}
    lines = [f"{host}:{pid[lo]}:{pid[lo] + 90} [{lo}] NCCL INFO comm 0x55d5c0a{lo}e0 rank {node * per_node + lo} "
             f"nranks {world} cudaDev {lo} busId {lo}000 - Init COMPLETE" for lo in range(per_node)]
    stamp = when.replace("_", " ")
    if sigterm:
        lines += [f"[{stamp},101] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process {pid[lo]} "
                  "closing signal SIGTERM" for lo in range(per_node) if lo not in dead]
    first = min(dead)
    lines.append(f"[{stamp},300] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: {code}) "
                 f"local_rank: {first} (pid: {pid[first]}) of binary: /usr/bin/python")
    if block:
        lines += ["Traceback (most recent call last):", '  File "/usr/bin/torchrun", line 8, in <module>',
                  "    sys.exit(main())", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
                  "=" * 60, "train.py FAILED", "-" * 60, "Failures:"]
        others = [lo for lo in sorted(dead) if lo != first]
        lines += [_entry(i, host, node * per_node + lo, lo, code, pid[lo], when) for i, lo in enumerate(others, 1)]
        lines += [] if others else ["  <NO_OTHER_FAILURES>"]
        lines += ["-" * 60, "Root Cause (first observed failure):",
                  _entry(0, host, node * per_node + first, first, code, pid[first], when), "=" * 60]
    return "\n".join(lines) + "\n"


def _analyze(tmp_path: Path, files: list[tuple[str, str]]) -> dict[str, Any]:
    paths = []
    for name, text in files:
        path = tmp_path / name
        path.write_text(text)
        paths.append(path)
    return analyze_paths(paths, workers=1).to_dict()


def _answer(got: dict[str, Any]) -> tuple[str, int | None, str | None]:
    return got["cause"], got["first_failing_rank"], got["first_failing_host"]


@pytest.mark.parametrize("host", ["node01", "gpu-a17"])
@pytest.mark.parametrize("dead", [[0, 1, 2], [1, 2, 3], [2, 3]])
def test_the_agents_pick_among_workers_it_spared_names_no_rank(tmp_path: Path, dead: list[int], host: str) -> None:
    """The agent SIGTERMs the workers still alive; those it spares had died already. Its failure line names the
    lowest local rank among them: a tie-break, whichever workers died (renumbered) on whatever host."""
    got = _analyze(tmp_path, [("slurm-7.out", torchrun_node(host, 0, 4, 4, dead, block=False))])
    assert _answer(got) == ("host_oom", None, host), got["summary"]
    assert any(f"{len(dead)} ranks failed within the launcher's 1 s resolution" in n for n in got["notes"]), got
    assert got["exclude_nodes"] == []


@pytest.mark.parametrize("dead", [[0, 1, 2], [1, 3]])
def test_a_summary_of_same_second_deaths_names_no_rank(tmp_path: Path, dead: list[int]) -> None:
    got = _analyze(tmp_path, [("slurm-7.out", torchrun_node("node01", 0, 4, 4, dead))])
    assert _answer(got) == ("host_oom", None, "node01"), got["summary"]


@pytest.mark.parametrize("block", [True, False])
def test_one_worker_that_died_alone_is_named(tmp_path: Path, block: bool) -> None:
    """The control: the agent spared one pid only, so its line names the one worker that died."""
    got = _analyze(tmp_path, [("slurm-7.out", torchrun_node("node01", 0, 4, 4, [2], block=block))])
    assert _answer(got) == ("host_oom", 2, "node01"), got["summary"]


def _two_nodes(hosts: tuple[str, str], dead: tuple[int, int], codes: tuple[int, int], when: tuple[str, str],
               names: tuple[str, str]) -> list[tuple[str, str]]:
    """Two nodes of four workers each; on each one worker died (local rank dead[i], exit code codes[i])."""
    return [(names[i], torchrun_node(hosts[i], i, 4, 8, [dead[i]], code=codes[i], pid0=45619 + 5000 * i,
                                     when=when[i])) for i in range(2)]


@pytest.mark.parametrize("codes", [(-11, -9), (-9, -11), (-9, -9)])
def test_deaths_on_two_nodes_in_one_second_name_no_rank_in_any_order(tmp_path: Path, codes: tuple[int, int]) -> None:
    """A segfault on one node and a SIGKILL on another in the same second (or two alike): their signatures'
    priorities, the order the files are given in and the host names order nothing."""
    answers = set()
    for i, (hosts, dead, names) in enumerate([
            (("node01", "node02"), (1, 2), ("a.out", "b.out")),
            (("node01", "node02"), (1, 2), ("b.out", "a.out")),  # the other file first
            (("gpu-x9", "gpu-b3"), (1, 2), ("a.out", "b.out")),  # hosts renamed
            (("node01", "node02"), (3, 0), ("a.out", "b.out"))]):  # other ranks died
        (tmp_path / str(i)).mkdir()
        got = _analyze(tmp_path / str(i), _two_nodes(hosts, dead, codes, (WHEN, WHEN), names))
        assert got["first_failing_rank"] is None, got["summary"]
        assert any(n.startswith("no single rank") for n in got["notes"]), got["notes"]
        host = got["first_failing_host"]
        answers.add((got["cause"], None if host is None else hosts.index(host)))
    assert len(answers) == 1, answers


def test_deaths_seconds_apart_are_ordered(tmp_path: Path) -> None:
    """The control: the same two nodes, the second node's worker dying 20 s later, in either file order."""
    for i, names in enumerate([("a.out", "b.out"), ("b.out", "a.out")]):
        (tmp_path / str(i)).mkdir()
        files = _two_nodes(("node01", "node02"), (1, 2), (-11, -9), ("2024-03-27_14:52:55", "2024-03-27_14:53:15"),
                           names)
        got = _analyze(tmp_path / str(i), files)
        assert _answer(got) == ("segfault", 1, "node01"), got["summary"]


OOM = ["Traceback (most recent call last):", '  File "train.py", line 88, in <module>', "    loss.backward()",
       "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
       "79.10 GiB of which 1.02 GiB is free."]
SEGV = ["Fatal Python error: Segmentation fault", "", "Current thread 0x00007f1c (most recent call first):",
        '  File "train.py", line 91 in step']


def _untimed(oom_rank: int, segv_rank: int, oom_first: bool, world: int = 8) -> str:
    """An srun --label log: progress of every rank, then one rank's CUDA OOM and another's segfault, untimed."""
    blocks = [[f"{oom_rank}: {line}" for line in OOM], [f"{segv_rank}: {line}" for line in SEGV]]
    lines = [f"{r}: step 10 loss 2.31" for r in range(world)]
    for block in blocks if oom_first else blocks[::-1]:
        lines += block
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("oom_rank", "segv_rank"), [(1, 5), (5, 1), (0, 3)])
@pytest.mark.parametrize("oom_first", [True, False])
def test_untimed_failures_of_two_causes_are_not_ordered_by_priority(tmp_path: Path, oom_rank: int, segv_rank: int,
                                                                    oom_first: bool) -> None:
    got = _analyze(tmp_path, [("slurm-9.out", _untimed(oom_rank, segv_rank, oom_first))])
    assert got["first_failing_rank"] is None and got["first_failing_host"] is None, got["summary"]
    assert got["cause"] == "cuda_oom" and got["confidence"] == "low", got


def test_one_untimed_failure_is_named(tmp_path: Path) -> None:
    """The control: one rank's OOM alone names it."""
    text = "\n".join([f"{r}: step 10 loss 2.31" for r in range(8)] + [f"3: {line}" for line in OOM]) + "\n"
    got = _analyze(tmp_path, [("slurm-9.out", text)])
    assert got["cause"] == "cuda_oom" and got["first_failing_rank"] == 3, got["summary"]


def _watchdogs(world: int, hosts: tuple[str, ...], order: list[int] | None = None, behind: int | None = None,
               cancel: bool = True) -> str:
    """An srun --label log of an NCCL job whose ranks' watchdogs time out (rank `behind` one work behind), srun's
    report of the first task's exit and the step's teardown (`STEP ... CANCELLED`, --kill-on-bad-exit)."""
    per = world // len(hosts)
    lines = [f"{r}: [rank{r}]:[E ProcessGroupNCCL.cpp:563] [Rank {r}] Watchdog caught collective operation timeout: "
             f"WorkNCCL(SeqNum={116 if r == behind else 117}, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, "
             "Timeout(ms)=600000) ran for 600031 milliseconds before timing out." for r in order or range(world)]
    lines.append(f"srun: error: {hosts[0]}: task 0: Exited with exit code 1")
    if cancel:
        lines.append(f"slurmstepd: error: *** STEP 4242.0 ON {hosts[0]} CANCELLED AT 2024-05-01T10:20:30 ***")
    lines += [f"srun: error: {h}: tasks {i * per}-{i * per + per - 1}: Terminated" for i, h in enumerate(hosts)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("world", "hosts", "order"), [
    (4, ("node01", "node02"), None), (4, ("node01", "node02"), [2, 0, 3, 1]), (8, ("gpu-q1", "gpu-q2"), None),
    (8, ("gpu-q1", "gpu-q2", "gpu-q3", "gpu-q4"), [7, 6, 5, 4, 3, 2, 1, 0])])
@pytest.mark.parametrize("cancel", [True, False])
def test_every_rank_timing_out_alike_outweighs_the_steps_cancel(tmp_path: Path, world: int, hosts: tuple[str, ...],
                                                                order: list[int] | None, cancel: bool) -> None:
    got = _analyze(tmp_path, [("slurm-4242.out", _watchdogs(world, hosts, order, cancel=cancel))])
    assert _answer(got) == ("collective_timeout", None, None), got["summary"]
    assert any(f"all {world} ranks timed out in the same collective" in n for n in got["notes"]), got["notes"]


def test_a_rank_behind_the_others_is_still_named_with_the_cancel(tmp_path: Path) -> None:
    """The control: one rank a work behind is the one the others waited for; the cancel does not hide it."""
    got = _analyze(tmp_path, [("slurm-4242.out", _watchdogs(4, ("node01", "node02"), behind=2))])
    assert _answer(got) == ("collective_timeout", 2, "node02"), got["summary"]
