"""Rules: the culprit is not the loudest traceback. Small synthetic jobs, one per rule."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.diagnose.resolve import expand_ranks
from ddpslurm.analyze.model import RankRow
from ddpslurm.analyze.report.text import collapse_rows

WATCHDOG_V3 = ("[rank{r}]:[E612 10:24:03.2 ProcessGroupNCCL.cpp:1] [PG ID 0 PG GUID 0(default_pg) Rank {r}] failure "
               "detected by watchdog at work sequence id: {seq} PG status: last enqueued work: {seq}, last completed "
               "work: {done}\n")
DIST_BACKEND = ("[rank{r}]: torch.distributed.DistBackendError: [Rank {r}] Watchdog caught collective operation "
                "timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
                "for 600039 milliseconds before timing out.\n")


def write_ranks(tmp_path: Path, texts: dict[int, str]) -> list[Path]:
    paths = []
    for rank, text in texts.items():
        path = tmp_path / f"4242_{rank}_log.err"
        path.write_text(text)
        paths.append(path)
    return paths


def diagnose(paths: list[Path]) -> dict:
    return analyze_paths(paths).to_dict()


def diagnose_one(path: Path, text: str) -> dict:
    """The diagnosis of one pasted log."""
    path.write_text(text)
    return diagnose([path])


def test_rank0_straggler_absent_from_timeouts(tmp_path: Path) -> None:
    texts = {r: WATCHDOG_V3.format(r=r, seq=90, done=89) + DIST_BACKEND.format(r=r, seq=90) for r in range(1, 4)}
    texts[0] = "evaluating and saving a checkpoint...\n"
    got = diagnose(write_ranks(tmp_path, texts))
    assert (got["cause"], got["first_failing_rank"]) == ("collective_timeout", 0)


def test_lowest_last_completed_is_the_suspect(tmp_path: Path) -> None:
    texts = {r: WATCHDOG_V3.format(r=r, seq=90, done=89) for r in range(4)}
    texts[2] = WATCHDOG_V3.format(r=2, seq=88, done=87)
    got = diagnose(write_ranks(tmp_path, texts))
    assert (got["cause"], got["first_failing_rank"]) == ("collective_timeout", 2)


def test_one_oom_then_watchdog_timeouts_everywhere(tmp_path: Path) -> None:
    texts = {r: WATCHDOG_V3.format(r=r, seq=90, done=89) + DIST_BACKEND.format(r=r, seq=90) for r in range(4)}
    texts[3] = ("Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n    loss.backward()\n"
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    got = diagnose(write_ranks(tmp_path, texts))
    assert (got["cause"], got["first_failing_rank"], got["retry"]) == ("cuda_oom", 3, "stop")
    roles = {row["rank"]: row["role"] for row in got["ranks"]}
    assert roles == {0: "victim", 1: "victim", 2: "victim", 3: "culprit"}
    assert got["evidence"][0]["rank"] == 3 and "OutOfMemoryError" in got["evidence"][0]["text"]


@pytest.mark.parametrize("closing", ["Sending process {pid} closing signal SIGTERM",
                                     "Closing process {pid} via signal SIGTERM"])  # elastic_launch's `_close`
def test_agent_sigterms_survivors_the_missing_pid_died_first(tmp_path: Path, closing: str) -> None:
    log = tmp_path / "slurm-77.out"
    lines = [f"node01:{pid}:{pid} [{lr}] NCCL INFO comm 0x1{lr} rank {lr} nranks 4 cudaDev {lr} busId 1 - Init COMPLETE"
             for lr, pid in enumerate((100, 101, 102, 103))]
    agent = "W0217 08:19:10.679000 99 torch/distributed/elastic/multiprocessing/api.py:890] "
    lines += [agent + closing.format(pid=pid) for pid in (100, 101, 103)]
    log.write_text("\n".join(lines) + "\n")
    got = diagnose([log])
    assert got["first_failing_rank"] == 2
    assert got["first_failing_host"] == "node01"


def test_peer_named_by_gloo_victims(tmp_path: Path) -> None:
    texts = {r: f"distributed init: rank {r}/3 host node0{r} addr 10.0.0.{r}\n" for r in range(3)}
    for r in (0, 1):
        texts[r] += ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                     "[node02]:5290\n")
    texts[2] = "start of step 7\n"
    paths = write_ranks(tmp_path, texts)
    (tmp_path / "4242_2_log.out").write_text(
        "submitit INFO (2024-01-01 00:00:00,000) - Starting with JobEnvironment(job_id=4242, hostname=node02, "
        "local_rank=0(1), node=2(3), global_rank=2(3))\n")
    got = diagnose([*paths, tmp_path / "4242_2_log.out"])
    assert (got["first_failing_rank"], got["first_failing_host"]) == (2, "node02")


def test_store_barrier_missing_rank_is_rendezvous_timeout(tmp_path: Path) -> None:
    texts = {r: ("RuntimeError: Timed out initializing process group in store based barrier on rank: "
                 f"{r}, for key: store_based_barrier_key:1 (world_size=4, worker_count=3, timeout=0:30:00)\n")
             for r in (0, 1, 3)}
    texts[2] = "loading dataset index...\n"
    got = diagnose(write_ranks(tmp_path, texts))
    assert (got["cause"], got["first_failing_rank"]) == ("rendezvous_timeout", 2)


def test_monitored_barrier_names_the_rank(tmp_path: Path) -> None:
    texts = {0: "RuntimeError: [Rank 0]: Ranks 6 failed to pass monitoredBarrier in 1800000 ms\n"}
    got = diagnose(write_ranks(tmp_path, texts))
    assert (got["cause"], got["first_failing_rank"]) == ("collective_timeout", 6)


def test_earliest_culprit_by_time_wins(tmp_path: Path) -> None:
    texts = {1: "[E0101 10:00:05.000 x.py:1] [rank1] RuntimeError: CUDA error: an illegal memory access was "
                "encountered\n",
             3: "[E0101 10:00:02.000 x.py:1] [rank3] torch.OutOfMemoryError: CUDA out of memory.\n"}
    got = diagnose(write_ranks(tmp_path, texts))
    assert (got["cause"], got["first_failing_rank"], got["confidence"]) == ("cuda_oom", 3, "high")


def test_time_limit_outranks_the_tracebacks_it_causes(tmp_path: Path) -> None:
    log = tmp_path / "slurm-9.out"
    log.write_text("slurmstepd: error: *** JOB 9 ON node01 CANCELLED AT 2024-05-08T08:47:31 DUE TO TIME LIMIT ***\n"
                   "0: Traceback (most recent call last):\n0:   File \"t.py\", line 1, in <module>\n"
                   "0: KeyboardInterrupt\n")
    got = diagnose([log])
    assert (got["cause"], got["first_failing_rank"], got["retry"]) == ("slurm_time_limit", None, "requeue")


def test_hardware_fault_excludes_the_node(tmp_path: Path) -> None:
    log = tmp_path / "slurm-5.out"
    log.write_text("5: [rank5]: RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
                   "srun: error: gpu-a07: task 5: Exited with exit code 1\n")
    got = diagnose([log])
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == ("gpu_hardware", 5, "gpu-a07")
    assert got["exclude_nodes"] == ["gpu-a07"] and got["retry"] == "requeue"
    assert any("--exclude=gpu-a07" in a for a in got["advice"])


def test_nothing_matched_is_unknown_with_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("step 1 loss 2.0\nstep 2 loss 1.9\nstep 3 loss 1.8\n")
    got = diagnose([log])
    assert got["cause"] == "unknown" and got["confidence"] == "low"
    assert got["evidence"] and got["evidence"][-1]["text"] == "step 3 loss 1.8"


def test_json_schema_is_exactly_the_design(tmp_path: Path) -> None:
    got = diagnose(write_ranks(tmp_path, {0: "ValueError: bad config\n"}))
    assert set(got) == {"schema_version", "cause", "first_failing_rank", "first_failing_host", "confidence", "summary",
                        "advice", "evidence", "ranks", "retry", "exclude_nodes", "skipped", "notes"}
    assert got["schema_version"] == 1 and all(isinstance(n, str) for n in got["notes"])
    assert all(set(e) == {"file", "line", "rank", "time", "text"} for e in got["evidence"])
    assert all(set(r) == {"rank", "host", "role", "first_error"} for r in got["ranks"])
    json.dumps(got)


@pytest.mark.parametrize(("text", "ranks"), [
    ("2-7", [2, 3, 4, 5, 6, 7]),
    ("0,3-5", [0, 3, 4, 5]),
    ("6, 7", [6, 7]),
    ("x", []),
])
def test_expand_ranks(text: str, ranks: list[int]) -> None:
    assert expand_ranks(text) == ranks


def test_rank_table_collapses_runs_of_alike_victims() -> None:
    rows = [RankRow(r, "n", "victim", f"[Rank {r}] Watchdog caught collective operation timeout") for r in range(512)]
    rows[300] = RankRow(300, "n", "culprit", "OOM")
    groups = collapse_rows(rows)
    assert [(label, count) for label, _, count in groups] == [("0-299", 300), ("300", 1), ("301-511", 211)]


@pytest.mark.parametrize(("state", "cause"), [
    ("timeout", "slurm_time_limit"),
    ("out_of_memory", "host_oom"),
    ("node_fail", "node_failure"),
    ("failed", "unknown"),  # sacct's FAILED says nothing the logs did not
])
def test_sacct_names_the_cause_when_the_logs_are_silent(tmp_path: Path, state: str, cause: str) -> None:
    from ddpslurm.analyze.api import apply_accounting

    log = tmp_path / "run.log"
    log.write_text("step 1 loss 2.0\n")
    diagnosis = analyze_paths([log])
    apply_accounting(diagnosis, {"state": state, "slurm_state": state.upper(), "exit_code": 0, "signal": 9,
                                 "requeue_count": 0, "nodes": ["n1", "n2"]})
    assert diagnosis.cause == cause
    assert any("sacct: state" in note for note in diagnosis.notes)


def test_sacct_does_not_override_the_logs(tmp_path: Path) -> None:
    from ddpslurm.analyze.api import apply_accounting

    diagnosis = analyze_paths(write_ranks(tmp_path, {1: "torch.OutOfMemoryError: CUDA out of memory.\n"}))
    apply_accounting(diagnosis, {"state": "timeout"})
    assert (diagnosis.cause, diagnosis.first_failing_rank) == ("cuda_oom", 1)


def test_rank_whose_log_stops_early_is_the_suspect(tmp_path: Path) -> None:
    texts = {r: "".join(f"rank {r} step {s} loss 1.0\n" for s in range(20)) + "ddpslurm: rank terminated by SIGTERM\n"
             for r in range(4)}
    texts[2] = "rank 2 step 0 loss 1.0\nrank 2 step 1 loss 1.0\nddpslurm: rank terminated by SIGTERM\n"
    paths = write_ranks(tmp_path, texts)
    (tmp_path / "slurm-1.out").write_text("srun: error: n1: tasks 0-3: Killed\n")
    got = diagnose([*paths, tmp_path / "slurm-1.out"])
    assert got["first_failing_rank"] == 2


@pytest.mark.parametrize(("culprit", "host", "stepd"), [(37, "gpu-0005", "slurmstepd"), (2, "cn17", "slurmstepd-cn17")])
def test_task_out_of_memory_names_the_task_and_says_what_srun_meant(tmp_path: Path, culprit: int, host: str,
                                                                     stepd: str) -> None:
    """A cgroup OOM kill: the task's log just stops (no error of its own), slurmstepd's oom_kill line (no host on a
    production build, `slurmstepd-<node>` on a multiple-slurmd one) sits in some task's file, srun says `Out Of
    Memory` once and terminates the rest. The answer names the task srun named, and says what that status means
    rather than guessing between the OOM killer and a memory limit."""
    texts = {r: f"step {r} ok\n" for r in range(48)}
    texts[culprit] += f"{stepd}: error: Detected 1 oom_kill event in StepId=4242.0. Some of the step tasks have been " \
                      "OOM Killed.\n"
    texts[0] += f"srun: error: {host}: task {culprit}: Out Of Memory\n" \
                "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n" + \
                "".join(f"srun: error: node{n:02d}: tasks {n * 8}-{n * 8 + 7}: Terminated\n" for n in range(6)
                        if not n * 8 <= culprit < n * 8 + 8)
    got = diagnose(write_ranks(tmp_path, texts))
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == ("host_oom", culprit, host)
    assert f"task {culprit} on {host} Out Of Memory" in got["summary"]
    assert "most often" not in got["summary"]


def _ib_job(tmp_path: Path, hosts: list[str], reporters: dict[int, int], gpn: int = 4,
            deaths: dict[int, str] | None = None, lost: str = "ib") -> None:
    """Ranks `gpn` to a host; every rank's NCCL bootstrap line names its host's address; each reporter's IB completion
    error (`lost` "socket": NCCL 2.24+'s failed socket send) names the address of the rank `reporters[rank]`; each rank
    of `deaths` fails on its own (`DEATHS`); no rank logs anything else."""
    def address(rank: int) -> str:
        return f"10.7.{rank // gpn}.{20 + rank // gpn}"

    for rank in range(len(hosts) * gpn):
        host, pid = hosts[rank // gpn], 4000 + rank
        head = f"{host}:{pid}:{pid} [{rank % gpn}] NCCL INFO "
        (tmp_path / f"4242_{rank}_log.out").write_text(f"{head}Bootstrap : Using ib0:{address(rank)}<0>\nstep 1\n")
        text = "step 1\n"
        if rank in reporters:
            peer = address(reporters[rank])
            text += (f"{host}:{pid}:{pid + 9} [{rank % gpn}] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got "
                     f"completion from peer {peer}<4711> with status=12 opcode=0 len=0 vendor err 129 (Recv)\n"
                     if lost == "ib" else
                     f"{host}:{pid}:{pid + 9} [{rank % gpn}] misc/socket.cc:46 NCCL WARN socketProgressOpt: Call to "
                     f"send to {peer}<4711> failed : Connection reset by peer\n")
        if rank in (deaths or {}):
            text += DEATHS[deaths[rank]][1]  # type: ignore[index]
        if rank == 0:
            text += "".join(DEATHS[how][0].format(host=hosts[r // gpn], rank=r) for r, how in (deaths or {}).items())
        (tmp_path / f"4242_{rank}_log.err").write_text(text)


#: a rank failing on its own: what srun says of it (in rank 0's file), what its own log says
DEATHS = {
    "segfault": ("srun: error: {host}: task {rank}: Segmentation fault (core dumped)\n", ""),
    "cuda_oom": ("", "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n"
                     "    loss.backward()\n"
                     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                     "capacity of 79.10 GiB of which 1.02 GiB is free.\n"),
}


@pytest.mark.parametrize(("hosts", "reporters", "peer"), [
    (["gpu-01", "gpu-02", "gpu-03", "gpu-04"], {1: 9, 13: 9}, "gpu-03"),
    (["cn7", "cn3", "cn9"], {0: 5, 10: 6, 2: 4}, "cn3"),
    (["a-node-100", "a-node-101", "a-node-102", "a-node-103", "a-node-104"], {3: 19, 7: 16, 11: 17, 15: 18},
     "a-node-104"),
])
def test_ranks_on_several_nodes_losing_one_ib_peer_name_that_node(tmp_path: Path, hosts: list[str],
                                                                   reporters: dict[int, int], peer: str) -> None:
    """Several ranks on different nodes report InfiniBand completion errors toward the same peer address, which the
    peer node's NCCL bootstrap line says is its own: that node is named (and excluded), no rank of theirs is."""
    _ib_job(tmp_path, hosts, reporters)
    got = analyze_paths([tmp_path]).to_dict()
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == ("infiniband_error", None, peer)
    assert got["exclude_nodes"] == [peer]


@pytest.mark.parametrize(("reporters", "want_host"), [
    ({1: 9, 13: 9}, "gpu-03"),  # two nodes lose their sockets to gpu-03: look there
    ({13: 9}, "gpu-03"),
    ({1: 9, 13: 5}, None),  # two different peers: nobody in common
])
def test_lost_sockets_to_one_node_say_where_to_look_without_a_cause(tmp_path: Path, reporters: dict[int, int],
                                                                     want_host: str | None) -> None:
    """Failed socket sends toward one node's address, and nothing on that node: the cause is unknown (a process
    killed without a word, the node, its link), the node is named as where to look, and not excluded."""
    _ib_job(tmp_path, ["gpu-01", "gpu-02", "gpu-03", "gpu-04"], reporters, lost="socket")
    got = analyze_paths([tmp_path]).to_dict()
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"], got["exclude_nodes"]) == \
        ("unknown", None, want_host, []), got["summary"]
    assert (want_host or "No failure of a rank's own") in got["summary"]


@pytest.mark.parametrize(("reporters", "want_rank", "want_host"), [
    ({1: 9, 13: 5}, None, None),  # two different peers: nobody in common
    ({1: 9, 2: 9}, None, "gpu-01"),  # both reporters on one node: that node, as before
    ({13: 9}, 13, "gpu-04"),  # one reporter: it is the first failing rank, as the corpus' single reports are
])
def test_no_common_ib_peer_is_made_up(tmp_path: Path, reporters: dict[int, int], want_rank: int | None,
                                      want_host: str | None) -> None:
    _ib_job(tmp_path, ["gpu-01", "gpu-02", "gpu-03", "gpu-04"], reporters)
    got = analyze_paths([tmp_path]).to_dict()
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == \
        ("infiniband_error", want_rank, want_host), got["summary"]


@pytest.mark.parametrize(("hosts", "reporters", "dead", "how"), [
    (["gpu-01", "gpu-02", "gpu-03", "gpu-04"], {1: 9, 13: 9}, 9, "segfault"),
    (["cn7", "cn3", "cn9"], {0: 5, 10: 6, 2: 4}, 6, "segfault"),
    (["a-node-100", "a-node-101", "a-node-102", "a-node-103", "a-node-104"], {3: 19, 7: 16, 11: 17, 15: 18}, 17,
     "cuda_oom"),
    (["gpu-01", "gpu-02", "gpu-03", "gpu-04"], {13: 9}, 10, "cuda_oom"),  # one reporter; the address is the node's
])
@pytest.mark.parametrize("lost", ["ib", "socket"])
def test_ranks_losing_a_peer_whose_rank_died_on_its_own_name_that_rank(
        tmp_path: Path, hosts: list[str], reporters: dict[int, int], dead: int, how: str, lost: str) -> None:
    """A rank dies (srun: segmentation fault; its own CUDA OOM) and its net peers on other nodes report InfiniBand
    completion errors (or failed socket sends) toward its node's address, as a dead link would look: the dead rank
    failed first, of its own cause, and the reporters are its victims, however many, whatever the names and
    numbers."""
    _ib_job(tmp_path, hosts, reporters, deaths={dead: how}, lost=lost)
    got = analyze_paths([tmp_path]).to_dict()
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == (how, dead, hosts[dead // 4]), \
        got["summary"]
    roles = {r["rank"]: r["role"] for r in got["ranks"]}
    assert roles[dead] == "culprit" and all(roles[r] != "culprit" for r in reporters)


@pytest.mark.parametrize(("reporters", "want"), [
    ({1: 9, 13: 9}, ("infiniband_error", None, "gpu-03")),  # the node they name, as without the death elsewhere
    ({13: 9}, ("infiniband_error", 13, "gpu-04")),  # the one reporter, as without it
])
def test_a_death_on_another_node_explains_no_lost_peer(tmp_path: Path, reporters: dict[int, int],
                                                      want: tuple) -> None:
    """Rank 5 (gpu-02) segfaults, the reporters name gpu-03's address: their reports are not its doing."""
    _ib_job(tmp_path, ["gpu-01", "gpu-02", "gpu-03", "gpu-04"], reporters, deaths={5: "segfault"})
    got = analyze_paths([tmp_path]).to_dict()
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == want, got["summary"]


def test_a_peer_that_reports_a_lost_peer_itself_is_not_a_death(tmp_path: Path) -> None:
    """Two nodes that name each other (a link between them broke): neither is explained by the other."""
    _ib_job(tmp_path, ["gpu-01", "gpu-02", "gpu-03", "gpu-04"], {1: 9, 9: 1})
    got = analyze_paths([tmp_path]).to_dict()
    assert got["cause"] == "infiniband_error" and got["first_failing_rank"] is None, got["summary"]


def test_a_report_before_the_peer_failed_is_not_explained_by_it() -> None:
    # the combiner's ordering rule itself is under test: its clock tolerance and families, too fine for a whole job
    from ddpslurm.analyze.diagnose.combiner import Candidate, _came_first
    from ddpslurm.analyze.diagnose.producers import Vote

    def candidate(t: float | None, family: str = "iso") -> Candidate:
        return Candidate(1, "n1", [Vote("own failure", 95.0, "", own=True, time=t, time_family=family)])
    assert _came_first(candidate(100.0), candidate(200.0))
    assert not _came_first(candidate(200.0), candidate(100.0))
    assert not _came_first(candidate(100.0), candidate(100.5))  # within the clocks' tolerance
    assert not _came_first(candidate(100.0), candidate(None))  # srun's lines carry no time
    assert not _came_first(candidate(100.0, "iso"), candidate(200.0, "iso-tz"))  # a local and a UTC clock


def test_an_address_several_nodes_use_names_no_node(tmp_path: Path) -> None:
    """Every node's docker0-like bridge or a shared VIP: an address more than one host says it uses maps to none."""
    _ib_job(tmp_path, ["gpu-01", "gpu-02", "gpu-03", "gpu-04"], {1: 9, 13: 9})
    for rank in (4, 5, 6, 7):  # gpu-02 claims gpu-03's address too
        path = tmp_path / f"4242_{rank}_log.out"
        path.write_text(path.read_text().replace("10.7.1.21", "10.7.2.22"))
    got = analyze_paths([tmp_path]).to_dict()
    assert got["first_failing_host"] is None, got["summary"]


@pytest.mark.parametrize(("named", "host"), [("[login02.hpc.example.edu]:29500", "login02.hpc.example.edu"),
                                             ("[node7]", "node7"), ("node7", "node7"), ("[::1]:29500", "::1")])
def test_a_peer_c10d_writes_in_brackets_with_its_port_is_the_bare_host(named: str, host: str) -> None:
    from ddpslurm.analyze.diagnose.peers import bare_host

    assert bare_host(named) == host


def _init_job(tmp_path: Path, hosts: list[str], gpn: int, absent: set[int], ending: str, *,
              complete: frozenset[int] = frozenset(), start_lines: bool = True, submitit: bool = True) -> None:
    """Ranks `gpn` to a host, each starting NCCL's init of the whole world (2.19+ `Init START`, or only 2.18's
    `Init COMPLETE` without `start_lines`): the `absent` ranks never start it, the `complete` ones finish it; the
    others log nothing after Init START. Each log starts with submitit's JobEnvironment line (its host), or a line
    naming nothing. `ending`: Slurm's time limit, a scancel, or nothing (the logs just end)."""
    world = len(hosts) * gpn
    for rank in range(world):
        host, pid = hosts[rank // gpn], 5000 + rank
        text = (f"submitit INFO (2026-03-02 03:00:00,000) - Starting with JobEnvironment(job_id=777, hostname={host}, "
                f"local_rank={rank % gpn}({gpn}), node={rank // gpn}({len(hosts)}), global_rank={rank}({world}))\n"
                if submitit else "loading the dataset\n")
        init = f"{host}:{pid}:{pid + 3} [{rank % gpn}] NCCL INFO ncclCommInitRank comm 0x55d{rank:04x}a0 rank {rank} " \
               f"nranks {world} cudaDev {rank % gpn} nvmlDev {rank % gpn} busId 1b000 commId 0x9f3c - Init "
        if rank not in absent:
            text += f"{host}:{pid}:{pid} [{rank % gpn}] NCCL INFO Bootstrap : Using ib0:10.9.{rank // gpn}.7<0>\n"
            text += init + "START\n" if start_lines else ""
            text += init + "COMPLETE\n" if rank in complete else ""
        if rank == 0 and ending:
            at = "2026-03-02T07:00:03"
            why = " DUE TO TIME LIMIT" if ending == "time_limit" else ""
            text += f"slurmstepd: error: *** JOB 777 ON {hosts[0]} CANCELLED AT {at}{why} ***\n"
        (tmp_path / f"777_{rank}_log.out").write_text(text)


@pytest.mark.parametrize(("hosts", "gpn", "absent", "ending", "submitit", "start_lines"), [
    (["gpu-01", "gpu-02"], 4, 5, "time_limit", True, True),
    (["c3", "c9", "c1", "c4", "c8", "c2"], 8, 0, "time_limit", True, True),
    (["node-a17", "node-b02", "node-c33"], 2, 5, "scancel", True, True),
    (["x1000c0s0b0n0", "x1000c0s0b0n1"], 8, 11, "", True, True),
    (["gpu-01", "gpu-02", "gpu-03"], 4, 11, "time_limit", False, True),  # no line names the absent rank's host
    (["gpu-01", "gpu-02"], 8, 5, "time_limit", True, False),  # NCCL 2.18: its bootstrap, then no Init COMPLETE
])
def test_ranks_waiting_in_nccl_init_name_the_rank_that_never_started_it(
        tmp_path: Path, hosts: list[str], gpn: int, absent: int, ending: str, submitit: bool,
        start_lines: bool) -> None:
    """Every rank but one sets NCCL up (its bootstrap line, `Init START` from 2.19) and logs nothing more: NCCL's
    init is collective, they waited for the one that logged no NCCL line. Not the time limit or the scancel that
    ended the wait: the rank, whatever the names, numbers and sizes."""
    _init_job(tmp_path, hosts, gpn, {absent}, ending, submitit=submitit, start_lines=start_lines)
    got = analyze_paths([tmp_path]).to_dict()
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == \
        ("rendezvous_timeout", absent, hosts[absent // gpn] if submitit else None), got["summary"]


@pytest.mark.parametrize(("absent", "complete", "start_lines", "want"), [
    (set(), set(), True, "slurm_time_limit"),  # every rank waits, none is missing: nobody to name
    ({5}, set(range(16)), True, "slurm_time_limit"),  # the others finished their init: it was no wait for rank 5
    ({5}, {3}, True, "slurm_time_limit"),  # one rank finished the init: every rank had joined it
    ({5}, {3}, False, "slurm_time_limit"),  # the same with NCCL 2.18's lines
    (set(range(6, 16)), set(), True, "slurm_time_limit"),  # most ranks logged no NCCL line: NCCL_DEBUG unset there
])
def test_no_init_wait_is_made_up(tmp_path: Path, absent: set[int], complete: set[int], start_lines: bool,
                                 want: str) -> None:
    _init_job(tmp_path, ["gpu-01", "gpu-02"], 8, absent, "time_limit", complete=frozenset(complete - absent),
              start_lines=start_lines)
    got = analyze_paths([tmp_path]).to_dict()
    assert (got["cause"], got["first_failing_rank"]) == (want, None), got["summary"]


def test_two_ranks_that_never_started_nccl_init_are_no_single_rank(tmp_path: Path) -> None:
    _init_job(tmp_path, ["gpu-01", "gpu-02", "gpu-03"], 4, {2, 9}, "time_limit")
    got = analyze_paths([tmp_path]).to_dict()
    assert (got["cause"], got["first_failing_rank"]) == ("rendezvous_timeout", None), got["summary"]


def _late_job(tmp_path: Path, hosts: list[str], gpn: int, straggler: int, lost_at: str, how: str) -> None:
    """Every rank but `straggler` logs torch's watchdog timeout at 10:34:03 (a collective that began at 10:24:03);
    the straggler logs no timeout but, at `lost_at`, loses its net peer on the next node (`how`: NCCL's IB completion
    error and torch's remote-error abort, or NCCL's socket closed by the peer)."""
    world = len(hosts) * gpn
    peer_host = hosts[(straggler // gpn + 1) % len(hosts)]
    for rank in range(world):
        host, pid = hosts[rank // gpn], 6000 + rank
        text = f"{host}:{pid}:{pid} [{rank % gpn}] NCCL INFO Bootstrap : Using ib0:10.7.{rank // gpn}.20<0>\n"
        if rank != straggler:
            text += (f"[rank{rank}]:[E0612 10:34:03.{rank:03d}000 ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog "
                     "caught collective operation timeout: WorkNCCL(SeqNum=41, OpType=ALLREDUCE, NumelIn=1, "
                     "NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n")
        elif how == "ib":
            peer = f"10.7.{(rank // gpn + 1) % len(hosts)}.20"
            text += (f"{host}:{pid}:{pid + 5} [{rank % gpn}] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got "
                     f"completion from peer {peer}<4711> with status=12 opcode=0 len=0 vendor err 129 (Recv)\n"
                     f"[rank{rank}]:[E0612 {lost_at}.000000 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank {rank}] "
                     "Process group watchdog thread terminated with exception: NCCL error: remote process exited or "
                     "there was a network error, NCCL version 2.21.5\n")
        else:
            text += (f"[rank{rank}]:[E0612 {lost_at}.000000 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank {rank}] "
                     "Process group watchdog thread terminated with exception: NCCL error: remote process exited or "
                     "there was a network error, NCCL version 2.21.5\n"
                     f"{host}:{pid}:{pid + 5} [{rank % gpn}] misc/socket.cc:49 NCCL WARN socketProgress: Connection "
                     f"closed by remote peer {peer_host}<50512>\n")
        (tmp_path / f"888_{rank}_log.err").write_text(text)


@pytest.mark.parametrize(("hosts", "gpn", "straggler", "how"), [
    (["gpu-01", "gpu-02", "gpu-03"], 4, 6, "ib"),
    (["nid001234", "nid001235", "nid001236", "nid001237"], 2, 1, "ib"),
    (["gpu-01", "gpu-02", "gpu-03"], 4, 9, "socket"),
])
def test_a_peer_lost_after_the_others_timed_out_is_the_stragglers_consequence(
        tmp_path: Path, hosts: list[str], gpn: int, straggler: int, how: str) -> None:
    """The rank the others waited for (absent from their timeouts) loses its peers a minute after they timed out
    and aborted: it was late, its lost peers are their abort, not a broken link (nothing to exclude)."""
    _late_job(tmp_path, hosts, gpn, straggler, "10:35:10", how)
    got = analyze_paths([tmp_path]).to_dict()
    assert (got["cause"], got["first_failing_rank"], got["exclude_nodes"]) == \
        ("collective_timeout", straggler, []), got["summary"]


def test_a_peer_lost_before_the_others_timed_out_stays_the_cause(tmp_path: Path) -> None:
    """The same lines, the peer lost seconds after the collective began: the link broke first, the others then
    waited for the rank that lost it."""
    _late_job(tmp_path, ["gpu-01", "gpu-02", "gpu-03"], 4, 6, "10:24:09", "ib")
    got = analyze_paths([tmp_path]).to_dict()
    assert (got["cause"], got["first_failing_rank"]) == ("infiniband_error", 6), got["summary"]


@pytest.mark.parametrize(("straggler_last", "want"), [(True, "collective_timeout"), (False, "infiniband_error")])
def test_without_times_srun_orders_the_lost_peer(tmp_path: Path, straggler_last: bool, want: str) -> None:
    """No timestamps (the lines' times stripped): srun's order of the tasks' ends tells whether the straggler lost
    its peer after the others had aborted (its task ended last) or before (first)."""
    hosts, gpn, straggler = ["gpu-01", "gpu-02", "gpu-03"], 4, 6
    _late_job(tmp_path, hosts, gpn, straggler, "10:35:10", "ib")
    for path in tmp_path.iterdir():
        path.write_text(re.sub(r"\[E0612 [\d:.]+ ", "[E ", path.read_text()))
    others = [f"srun: error: {h}: tasks {n * gpn}-{n * gpn + gpn - 1}: Aborted (core dumped)\n"
              for n, h in enumerate(hosts) if n != straggler // gpn]
    mine = [f"srun: error: {hosts[straggler // gpn]}: task {straggler}: Aborted (core dumped)\n"]
    with (tmp_path / "888_0_log.err").open("a") as handle:
        handle.write("".join(others + mine if straggler_last else mine + others))
    got = analyze_paths([tmp_path]).to_dict()
    assert (got["cause"], got["first_failing_rank"]) == (want, straggler), got["summary"]


def _dump_job(tmp_path: Path, hosts: list[str], gpn: int, culprit: int, torch: str, pg: str = "0") -> None:
    """A culprit that never issued collective 41: the ranks of even nodes time out in it and signal the flight
    recorder's dump (torch `2.5`: its watchdog's two lines, then the dump signal `from this local rank`; torch `2.3`:
    the v2 watchdog line, then the dump signal); those of odd nodes and the culprit learn of it through the store
    first and log only the signal, each with its last enqueued work (the culprit's 40). srun reports the first
    watchdog's task aborted first, then every other task."""
    first = next(r for r in range(len(hosts) * gpn) if (r // gpn) % 2 == 0 and r != culprit)
    prefix = f"[PG ID {pg} PG GUID {pg}(default_pg)" if torch == "2.5" else f"[PG {pg} (default_pg)"
    for rank in range(len(hosts) * gpn):
        timed_out = (rank // gpn) % 2 == 0 and rank != culprit
        last = 41 if rank != culprit else 40
        head = f"[rank{rank}]:[E0612 10:34:0{3 if timed_out else 4}.{rank:03d}000 ProcessGroupNCCL.cpp:1987] " \
               f"{prefix} Rank {rank}] "
        if torch == "2.5":
            told = "this local rank" if timed_out else f" rank {first}"
            dump = (f"Received a dump signal due to a collective timeout from {told} and we will try our best to "
                    f"dump the debug info. Last enqueued NCCL work: {last}, last completed NCCL work: 40.This is most "
                    "likely caused by incorrect usages of collectives\n")
        else:
            told = "a dump signal from this local rank" if timed_out else "a global timeout from another rank"
            dump = (f"Received {told} and will start to dump the debug info. Last enqueued NCCL work: {last}, last "
                    "completed NCCL work: 40.\n")
        text = f"{hosts[rank // gpn]}:{600 + rank}:{600 + rank} [{rank % gpn}] NCCL INFO Bootstrap : Using " \
               f"ib0:10.7.{rank // gpn}.{rank % gpn + 10}<0>\n"
        if timed_out and torch == "2.5":
            text += (f"{head}Watchdog caught collective operation timeout: WorkNCCL(SeqNum=41, OpType=ALLREDUCE, "
                     "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n"
                     f"{head} failure detected by watchdog at work sequence id: 41 PG status: last enqueued work: 41, "
                     "last completed work: 40\n")
        elif timed_out:
            text += (f"{head}Exception (either an error or timeout) detected by watchdog at work: 41, last enqueued "
                     "NCCL work: 41, last completed NCCL work: 40.\n")
        (tmp_path / f"515_{rank}_log.err").write_text(text + head + dump)
    with (tmp_path / "515_0_log.err").open("a") as handle:  # srun: the first watchdog's task aborted first
        handle.write(f"srun: error: {hosts[first // gpn]}: task {first}: Aborted (core dumped)\n")
        for n, host in enumerate(hosts):
            tasks = ",".join(str(r) for r in range(n * gpn, n * gpn + gpn) if r != first)
            handle.write(f"srun: error: {host}: tasks {tasks}: Aborted (core dumped)\n")


@pytest.mark.parametrize(("hosts", "gpn", "culprit", "torch", "pg"), [
    (["gpu-01", "gpu-02", "gpu-03", "gpu-04"], 4, 11, "2.5", "0"),
    (["nid001234", "nid001235", "nid001236", "nid001237"], 2, 0, "2.3", "0"),
    (["a1", "a2", "a3"], 8, 13, "2.5", "4"),
    (["gpu-01", "gpu-02"], 4, 2, "2.3", "1"),
])
def test_the_rank_that_never_issued_the_timed_out_collective_is_the_one_waited_for(
        tmp_path: Path, hosts: list[str], gpn: int, culprit: int, torch: str, pg: str) -> None:
    """Half the ranks never log a timeout of their own (the store's dump signal came first), so no rank is absent
    from the timeouts alone; the culprit's last enqueued work, one behind, names it."""
    _dump_job(tmp_path, hosts, gpn, culprit, torch, pg)
    got = analyze_paths([tmp_path]).to_dict()
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == \
        ("collective_timeout", culprit, hosts[culprit // gpn]), got["summary"]
    # the decisive line is its own, the one that tells its last enqueued work, not a line about others
    assert (got["evidence"][0]["rank"], "Last enqueued NCCL work: 40," in got["evidence"][0]["text"]) == (culprit, True)
    row = next(r for r in got["ranks"] if r["rank"] == culprit)
    assert "Last enqueued NCCL work: 40," in row["first_error"]


@pytest.mark.parametrize(("event", "hosts", "reporter"), [
    ("Got async event : port error", ["gpu-01", "gpu-02"], 5),
    ("Got non-fatal async event: port error(10)", ["nid0017", "nid0018", "nid0019"], 2),
    ("async fatal event on QP (0x732d78661238): invalid request local work queue error", ["a", "b"], 0),
])
def test_an_ib_port_error_names_its_node(tmp_path: Path, event: str, hosts: list[str], reporter: int) -> None:
    """NCCL's IB async event thread reports this node's port going down (or a fatal QP event) while the others time
    out waiting: the node's link, to be excluded."""
    gpn = 4
    for rank in range(len(hosts) * gpn):
        host, pid = hosts[rank // gpn], 700 + rank
        text = f"{host}:{pid}:{pid} [{rank % gpn}] NCCL INFO Bootstrap : Using ib0:10.9.{rank // gpn}.{rank % gpn}<0>\n"
        if rank == reporter:
            text += f"{host}:{pid}:{pid + 9} [{rank % gpn}] transport/net_ib.cc:101 NCCL WARN NET/IB : mlx5_2:1 " \
                    f"{event}\n"
        else:
            text += (f"[rank{rank}]:[E0612 10:34:03.{rank:03d}000 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank "
                     f"{rank}] Exception (either an error or timeout) detected by watchdog at work: 41, last enqueued "
                     "NCCL work: 41, last completed NCCL work: 40.\n")
        (tmp_path / f"616_{rank}_log.err").write_text(text)
    got = analyze_paths([tmp_path]).to_dict()
    assert (got["cause"], got["first_failing_host"], got["exclude_nodes"]) == \
        ("infiniband_error", hosts[reporter // gpn], [hosts[reporter // gpn]]), got["summary"]


@pytest.mark.parametrize(("odd", "world"), [(0, 4), (5, 8)])
def test_the_rank_every_other_rank_finds_with_another_model_is_named(tmp_path: Path, odd: int, world: int) -> None:
    """DDP's constructor compares parameter counts: every rank names the odd one, the odd one names another."""
    texts = {}
    for r in range(world):
        other = odd if r != odd else (odd + 1) % world
        mine, theirs = (0, 338) if r == odd else (338, 0)
        texts[r] = ("Traceback (most recent call last):\n  File \"train.py\", line 80, in <module>\n"
                    "    model = DDP(model, device_ids=[local_rank])\n"
                    f"RuntimeError: DDP expects same model across all ranks, but Rank {r} has {mine} params, while "
                    f"rank {other} has inconsistent {theirs} params.\n")
    got = diagnose(write_ranks(tmp_path, texts))
    assert (got["cause"], got["first_failing_rank"]) == ("collective_mismatch", odd), got["summary"]


UNIQUE_ID = ("[rank{r}]: torch.distributed.DistBackendError: [{printed}] is setting up NCCL communicator and "
             "retrieving ncclUniqueId from [{root}] via c10d key-value store by key '0', but store->get('0') got "
             "error: {reason}\n")


@pytest.mark.parametrize(("world", "root", "reason", "ending"), [
    (8, 0, "Socket Timeout", ""),
    (4, 0, "wait timeout after 600000ms. This may indicate a possible application crash on rank 0 or a network set "
           "up issue.", "slurmstepd: error: *** JOB 77 ON n1 CANCELLED AT 2025-06-02T10:14:03 ***\n"),
    (6, 0, "failed to recv, got 0 bytes",
     "slurmstepd: error: *** STEP 77.0 ON n1 CANCELLED AT 2025-06-02T10:14:03 DUE TO TIME LIMIT ***\n"),
])
def test_ranks_waiting_for_the_unique_id_name_the_root_that_never_posted_it(tmp_path: Path, world: int, root: int,
                                                                            reason: str, ending: str) -> None:
    """Every other rank of the job's communicator waits in the store for the ncclUniqueId its root posts; the root
    logged nothing (waiting for input, saving, hung): it is the one they waited for, also when a cancel or the time
    limit ended the root's wait later."""
    texts = {r: UNIQUE_ID.format(r=r, printed=r, root=root, reason=reason) for r in range(world) if r != root}
    texts[root] = "step 100 loss 2.31\nsaving checkpoint...\n" + ending
    got = diagnose(write_ranks(tmp_path, texts))
    assert (got["cause"], got["first_failing_rank"]) == ("rendezvous_timeout", root), got["summary"]


def test_a_sub_communicators_root_is_no_rank_of_the_job(tmp_path: Path) -> None:
    """Ranks 5-7 wait for the root of their 4-rank group ([1]-[3] waiting on [0]): their numbers there are not their
    ranks in the job, so group rank 0 names no job rank."""
    texts = {r: UNIQUE_ID.format(r=r, printed=r - 4, root=0, reason="Socket Timeout") for r in (5, 6, 7)}
    texts.update({r: "step 100 loss 2.31\n" for r in (0, 1, 2, 3, 4)})
    got = diagnose(write_ranks(tmp_path, texts))
    assert got["first_failing_rank"] not in (0,), got["summary"]


@pytest.mark.parametrize("pair", [(0, 1), (6, 2)])
def test_duplicate_gpu_summary_names_the_pair_of_the_node_report(tmp_path: Path, pair: tuple[int, int]) -> None:
    """NCCL's duplicate-GPU report accuses the node, not a rank; the summary still names both ranks it reports
    (a real 2-rank job on one H100 read 'Two ranks (rank 1 and another)')."""
    a, b = pair
    line = "{host}:{pid}:{pid} [0] init.cc:904 NCCL WARN Duplicate GPU detected : rank {me} and rank {other} both on " \
           "CUDA device 60\n"
    texts = {a: line.format(host="gpu-7", pid=538, me=a, other=b), b: line.format(host="gpu-7", pid=539, me=b, other=a)}
    got = diagnose(write_ranks(tmp_path, texts))
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == ("duplicate_gpu", None, "gpu-7")
    assert re.search(rf"Two ranks \(({a} and {b}|{b} and {a})\) use the same GPU 60 on gpu-7", got["summary"])


WATCHDOG_2_11 = ("[rank{r}]:[E1127 12:19:35.829864914 ProcessGroupNCCL.cpp:689] [Rank {r}] Watchdog caught collective "
                 "operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=561, NumelOut=561, "
                 "Timeout(ms)=20000) ran for 20025 milliseconds before timing out.\n"
                 "[rank{r}]:[E1127 12:19:35.830118096 ProcessGroupNCCL.cpp:2303] [PG ID 0 PG GUID 0(default_pg) Rank "
                 "{r}]  failure detected by watchdog at work sequence id: 12 PG status: last enqueued work: 12, last "
                 "completed work: 11\n")


def _start_record(rank: int, world: int, host: str) -> str:
    return json.dumps({"schema": 1, "kind": "start", "rank": rank, "local_rank": rank, "node_rank": 0,
                       "world_size": world, "local_world_size": world, "host": host, "pid": 4100 + rank,
                       "job_id": "9", "attempt": 0, "launcher": "srun", "time": "2026-11-27T12:18:00+00:00",
                       "unix": 1795781880.0})


@pytest.mark.parametrize(("rank", "world", "with_record", "named"), [
    (0, 1, True, True),     # ddpslurm's start record: a job of one rank
    (0, None, False, True),  # NCCL's communicator: nranks 1
    (3, 8, True, False),    # one rank's log of an 8-rank job: it waited on the others
    (0, None, None, False),  # one rank's log and nothing saying how many ranks the job had
])
def test_a_one_rank_job_that_timed_out_waited_on_itself(tmp_path: Path, rank: int, world: int | None,
                                                      with_record: bool | None, named: bool) -> None:
    """A real one-rank NCCL job on an H100 whose kernel never ended: its watchdog timed out the all_reduce with no
    peer to wait for. The rank is named only when the logs say the job had one rank."""
    attempt = tmp_path / "job_9" / "attempt_0"
    attempt.mkdir(parents=True)
    log = WATCHDOG_2_11.format(r=rank)
    if with_record is False:
        log = (f"gpu-3:4100:4100 [0] NCCL INFO ncclCommInitRankConfig comm 0xf7773b0 rank {rank} nranks 1 cudaDev 0 "
               "nvmlDev 0 busId 60 commId 0x2f059b04c3a90844 - Init START\n") + log
    (attempt / f"rank_{rank}.log").write_text(log)
    if with_record:
        (attempt / f"rank_{rank}.start.json").write_text(_start_record(rank, world or 1, "gpu-3"))
    got = analyze_paths([tmp_path / "job_9"]).to_dict()
    assert got["cause"] == "collective_timeout"
    if named:
        assert (got["first_failing_rank"], got["first_failing_host"]) == (rank, "gpu-3")
        assert f"on rank {rank} of a 1-rank job" in got["summary"]
    else:
        assert got["first_failing_rank"] is None and "1-rank job" not in got["summary"]


GLOO_TIMEOUT = ("Traceback (most recent call last):\n  File \"train.py\", line 40, in <module>\n"
                "    dist.all_reduce(t)\n"
                "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
                "25000ms for recv operation to complete\n")


@pytest.mark.parametrize("cut", ["RuntimeError: [", "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tc"])
def test_a_cut_catch_all_exception_line_is_not_the_ranks_own(tmp_path: Path, cut: str) -> None:
    """Rank 3's log ends mid-line in the exception line of the same traceback its peers printed whole: only its type
    survived, so it is not read as an exception of the rank's own (a bug in the script); what is left is a rank
    whose log stops before any timeout, while the others' gloo collectives timed out."""
    texts = {r: GLOO_TIMEOUT for r in range(3)}
    texts[3] = GLOO_TIMEOUT.rsplit("RuntimeError", 1)[0] + cut  # no line end: the log was cut here
    got = diagnose(write_ranks(tmp_path, texts))
    assert got["cause"] == "collective_timeout"


def test_a_whole_exception_line_without_a_line_end_still_counts(tmp_path: Path) -> None:
    """A culprit line the catch-all did not read alone (a signature of its own) keeps its cause when cut."""
    texts = {r: GLOO_TIMEOUT for r in range(3)}
    texts[3] = "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n" \
               "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of"
    got = diagnose(write_ranks(tmp_path, texts))
    assert (got["cause"], got["first_failing_rank"]) == ("cuda_oom", 3)


def test_torchelastic_error_json_without_a_line_end_is_not_a_cut_line(tmp_path: Path) -> None:
    """torchelastic writes error.json as one JSON line with no line end: parsed whole, it is no cut log line."""
    for local_rank, message in ((0, "ValueError: bad batch 17 in shard 3"), (1, GLOO_TIMEOUT.splitlines()[-1])):
        folder = tmp_path / "run_abc" / "attempt_0" / str(local_rank)
        folder.mkdir(parents=True)
        (folder / "error.json").write_text(json.dumps({"message": {"message": message, "extraInfo": {
            "py_callstack": "Traceback ...", "timestamp": "1795781880"}}}))
        (folder / "stderr.log").write_text("")
    got = analyze_paths([tmp_path / "run_abc"]).to_dict()
    # local rank 0's folder; no world size the logs state puts the world on one node: no global rank
    assert (got["cause"], got["first_failing_rank"]) == ("user_code_exception", None)


HEARTBEAT = ("[rank{r}]:[E626 05:14:36.393067540 ProcessGroupNCCL.cpp:1743] [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
             "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued "
             "collectives.\n")
TIMEOUT_V2 = ("[rank{r}]:[E626 05:06:30.929096625 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
              "operation timeout: WorkNCCL(SeqNum=120049, OpType=_ALLGATHER_BASE, NumelIn=16384000, "
              "NumelOut=131072000, Timeout(ms)=1800000) ran for 1800065 milliseconds before timing out.\n")


@pytest.mark.parametrize(("own_timeout", "culprit"), [(True, None), (False, 7)])
def test_a_heartbeat_after_the_ranks_own_timeout_is_a_consequence(tmp_path: Path, own_timeout: bool,
                                                                   culprit: int | None) -> None:
    """The heartbeat monitor fires when the watchdog thread makes no progress: 480 s after a rank's own collective
    timeout it is the timeout's teardown that hung (ArcticTraining#219), not a hang of that rank's own; without a
    timeout of its own, its NCCL call hung while the others timed out waiting for it."""
    texts = {r: TIMEOUT_V2.format(r=r) for r in range(7)}
    texts[7] = (TIMEOUT_V2.format(r=7) if own_timeout else "") + HEARTBEAT.format(r=7)
    got = diagnose(write_ranks(tmp_path, texts))
    assert (got["cause"], got["first_failing_rank"]) == ("collective_timeout", culprit)


@pytest.mark.parametrize(("index", "signal", "cause"), [(0, "SIGKILL", "host_oom"), (3, "SIGSEGV", "segfault")])
def test_mp_spawn_names_the_child_that_died(tmp_path: Path, index: int, signal: str, cause: str) -> None:
    """torch.multiprocessing.spawn reports the child by its index (the local rank; on one node the rank) and the
    signal that ended it, at the end of the parent's traceback (Prompt4NR#3). No world size that fits one node is
    stated (`nprocs=4` is the node's, not the world's): the local rank is known, the global one is not."""
    log = ("Traceback (most recent call last):\n  File \"main.py\", line 9, in <module>\n"
           "    mp.spawn(train, nprocs=4, join=True)\n"
           "  File \"/opt/conda/lib/python3.10/site-packages/torch/multiprocessing/spawn.py\", line 146, in join\n"
           "    raise ProcessExitedException(\n"
           f"torch.multiprocessing.spawn.ProcessExitedException: process {index} terminated with signal {signal}\n")
    got = diagnose_one(tmp_path / "console.log", log)
    assert (got["cause"], got["first_failing_rank"]) == (cause, None)
    assert any(f"local rank {index} " in note for note in got["notes"]), got["notes"]


@pytest.mark.parametrize(("node", "pid"), [("g1002", 2128869), ("gpu-a17", 4242)])
def test_a_launchers_pid_takes_the_host_nccls_head_prints_with_it(tmp_path: Path, node: str, pid: int) -> None:
    """torchrun's 'failed (exitcode: -11) local_rank: 0 (pid: P)' names no host; NCCL's `host:pid:tid` head of a line
    the same process printed does (pytorch#135486, a segfault in a site's own RCCL build). Its global rank is not
    known (no world size is stated): host and local rank are."""
    log = (f"0: {node}:{pid}:{pid + 11} [0] NCCL INFO NET/Socket : Using [0]ib0:10.0.0.2<0>\n"
           "0: Fatal Python error: Segmentation fault\n"
           "0: E0909 14:03:50.013000 22579342468928 torch/distributed/elastic/multiprocessing/api.py:833] failed "
           f"(exitcode: -11) local_rank: 0 (pid: {pid}) of binary: /usr/bin/python3\n")
    got = diagnose_one(tmp_path / "slurm-77.out", log)
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == ("segfault", None, node)


@pytest.mark.parametrize("stamp", ["2025-11-09 15:39:31.043 +08:00 ", "2025-11-09T15:39:31.043+08:00 ", ""])
def test_a_collectors_stamp_with_its_offset_leaves_nccls_head_readable(tmp_path: Path, stamp: str) -> None:
    """A log collector's stamp (with its UTC offset after a space) before NCCL 2.23+'s own stamp: the `host:pid:tid`
    head behind them still names the node of an InfiniBand fault (NVIDIA/nccl#1905)."""
    log = (f"{stamp}[2025-11-09 07:39:30] h100-28:238:1219 [0] transport/net_ib.cc:180 NCCL WARN NET/IB : mlx5_ib0:1 "
           "async fatal event on QP (0x7f69f01519a8): local access violation work queue error\n")
    got = diagnose_one(tmp_path / "console.log", log)
    assert (got["cause"], got["first_failing_host"]) == ("infiniband_error", "h100-28")


def test_two_halves_with_different_models_name_no_rank(tmp_path: Path) -> None:
    """Each rank names the lowest rank whose parameter count differs from its own: ranks 0-3 (399) all name rank 4,
    ranks 4-7 (400) all name rank 0; neither is the odd one (accelerate#1481)."""
    texts = {}
    for r in range(8):
        mine, other, theirs = (399, 4, 400) if r < 4 else (400, 0, 399)
        texts[r] = (f"[rank{r}]: RuntimeError: DDP expects same model across all ranks, but Rank {r} has {mine} "
                    f"params, while rank {other} has inconsistent {theirs} params.\n")
    got = diagnose(write_ranks(tmp_path, texts))
    assert (got["cause"], got["first_failing_rank"]) == ("collective_mismatch", None), got["summary"]


def _lost_peer_paste(host: str, peer: str, pid: int = 183006) -> str:
    """NCCL's lines on a node whose socket to a peer broke (NCCL 2.14, pasted without rank prefixes)."""
    return (f"{host}:{pid}:{pid + 214} [1] misc/socket.cc:518 NCCL WARN Net : Call to recv from {peer}<58355> "
            f"failed : Broken pipe\n"
            f"{host}:{pid}:{pid + 214} [1] NCCL INFO misc/socket.cc:535 -> 6\n"
            f"{host}:{pid}:{pid + 175} [1] misc/socket.cc:538 NCCL WARN Net : Connection closed by remote peer "
            f"{host}.cluster.internal<47861>\n"
            f"{host}:{pid}:{pid + 214} [1] NCCL INFO proxy.cc:991 -> 6\n")


@pytest.mark.parametrize(("host", "peer"), [("a100-st-22", "10.200.84.247"), ("gpu007", "172.16.3.9"),
                                            ("n1", "fd00::1:5")])
def test_a_paste_of_victims_names_the_peer_no_log_here_belongs_to(tmp_path: Path, host: str, peer: str) -> None:
    d = diagnose_one(tmp_path / "console.log", _lost_peer_paste(host, peer))
    assert (d["cause"], d["first_failing_rank"], d["first_failing_host"]) == ("unknown", None, None)
    assert f"lost their connection to {peer}," in d["summary"]
    assert d["advice"][0].startswith(f"Find the node behind {peer} ")
    assert f"{host}.cluster" not in d["summary"]  # its own host, as NCCL's closed-peer line names it, is no peer
    assert [e["line"] for e in d["evidence"]][:1] == [1]  # the lines read as failures, not the file's last lines


def test_a_lost_peer_whose_log_is_read_is_not_called_unread(tmp_path: Path) -> None:
    paste = _lost_peer_paste("a100-st-22", "10.200.84.247")
    peer_log = "a100-st-23:5001:5001 [0] NCCL INFO Bootstrap : Using ens5:10.200.84.247<0>\nstep 10 loss 0.4\n"
    d = diagnose([*write_ranks(tmp_path, {}), _write(tmp_path / "a.log", paste), _write(tmp_path / "b.log", peer_log)])
    assert "10.200.84.247" not in d["summary"] and not any("Find the node behind" in a for a in d["advice"])


def test_no_untied_peer_leaves_the_plain_unknown_report(tmp_path: Path) -> None:
    d = diagnose_one(tmp_path / "console.log", "step 1 loss 0.5\nsomething odd happened\n")
    assert d["summary"].startswith("No failure of a rank's own was recognised")
    assert all(a for a in d["advice"]) and not any("Find the node behind" in a for a in d["advice"])


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("elided", ["172....", "10.x.x.x", "xxxxxxxx", "<redacted>"])
def test_a_peer_address_masked_in_a_paste_is_not_named(tmp_path: Path, elided: str) -> None:
    d = diagnose_one(tmp_path / "console.log", _lost_peer_paste("gpu007", elided))
    assert "lost their connection" not in d["summary"] and elided not in " ".join(d["advice"])
    assert [e["line"] for e in d["evidence"]][:1] == [1]
