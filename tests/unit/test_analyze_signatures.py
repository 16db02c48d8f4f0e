"""Signature files: validation errors name the file and the id; shipped data is complete and consistent."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpslurm.analyze.model import CAUSES
from ddpslurm.analyze.read.prefilter import minimal
from ddpslurm.analyze.rules import literals as literal_rules
from ddpslurm.analyze.rules.literals import derive_any_literal, derive_literal
from ddpslurm.analyze.rules.loading import load_signature_file, load_signatures
from ddpslurm.analyze.rules.signatures import ANCHORS, SignatureSet
from ddpslurm.errors import AnalyzeInputError

CASES = Path(__file__).resolve().parents[2] / "analyzer" / "cases"

GOOD = """
[[signature]]
id = "site-thing"
cause = "gpu_hardware"
role = "culprit"
pattern = 'SITE GPU FAULT (?P<slot>\\d+)'
prefilter = ["SITE GPU FAULT"]
advice = ["call the admins"]
"""


def write(tmp_path: Path, text: str, name: str = "site.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(("replace", "by", "message"), [
    ('cause = "gpu_hardware"', 'cause = "gpu_broke"', "unknown cause 'gpu_broke'"),
    ('role = "culprit"', 'role = "boss"', "role must be one of"),
    ("pattern = 'SITE GPU FAULT (?P<slot>\\d+)'", "pattern = 'SITE (GPU'", "bad pattern"),
    ('id = "site-thing"', 'id = "Site Thing"', "kebab-case"),
    ('prefilter = ["SITE GPU FAULT"]', 'prefilter = "SITE"', "prefilter"),
    ('advice = ["call the admins"]', 'advice = "call"', "advice"),
    ('advice = ["call the admins"]', 'colour = "red"', "unknown key(s) colour"),
])
def test_bad_signature_names_file_and_id(tmp_path: Path, replace: str, by: str, message: str) -> None:
    assert replace in GOOD
    path = write(tmp_path, GOOD.replace(replace, by))
    with pytest.raises(AnalyzeInputError) as info:
        load_signature_file(path)
    text = info.value.one_line()
    assert message in text
    assert str(path) in text
    assert "site-thing" in text or "Site Thing" in text


def test_invalid_toml_is_one_clear_error(tmp_path: Path) -> None:
    path = write(tmp_path, "[[signature]\nid = ")
    with pytest.raises(AnalyzeInputError, match="not valid TOML"):
        load_signature_file(path)


def test_duplicate_id_in_one_folder(tmp_path: Path) -> None:
    write(tmp_path, GOOD, "a.toml")
    write(tmp_path, GOOD, "b.toml")
    with pytest.raises(AnalyzeInputError, match="duplicate id"):
        load_signatures([tmp_path], use_env=False)


def test_site_folder_adds_a_signature_and_its_anchor(tmp_path: Path) -> None:
    write(tmp_path, GOOD)
    sigs = load_signatures([tmp_path], use_env=False)
    hit = sigs.match("node07 SITE GPU FAULT 3 detected")
    assert hit is not None and hit[0].id == "site-thing" and hit[1]["slot"] == "3"
    assert b"SITE GPU FAULT" in sigs.anchors


def test_site_folder_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, GOOD)
    monkeypatch.setenv("DDPSLURM_SIGNATURES", str(tmp_path))
    assert load_signatures().by_id("site-thing") is not None


def test_missing_signature_folder(tmp_path: Path) -> None:
    with pytest.raises(AnalyzeInputError, match="does not exist"):
        load_signatures([tmp_path / "nope"], use_env=False)


@pytest.mark.parametrize(("pattern", "literal"), [
    ("NCCL WARN Duplicate GPU", "NCCL WARN Duplicate GPU"),
    (r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+)",
     "Watchdog caught collective operation timeout: WorkNCCL(SeqNum="),
    (r"foo\.bar baz", "foo.bar baz"),
    (r"abc?defgh", "defgh"),
    (r"(?P<a>x)|y", None),  # top-level alternation: no literal every match contains
    (r"(?i:cuda out of memory)", None),  # case-insensitive: a literal would miss
    (r"\d+", None),
    (r"\x27ssh\x27 returned", " returned"),  # an escape's hex digits are not text
    (r"\101bcdef", "bcdef"),  # nor an octal escape's digits
    (r"\N{BULLET} item list", " item list"),
    (r"(?x) abcd efgh", None),  # verbose: its spaces match nothing
    (r"(?:abcdef){e<=1}", None),  # fuzzy: a match may differ from the text
    # a class's `)` closes no group, so the `|` after it stays inside (torch's `[PG 0 (default_pg) Rank 3]` heads)
    (r"\[(?:PG \S+ \([^)]*\) |PG \S+ )?Rank (?P<rank>\d+)\] Timeout at NCCL work: (?P<seq>\d+)",
     "] Timeout at NCCL work: "),
    (r"x[^]abc]defgh", "defgh"),  # a class whose first member is `]` ends at the second `]`
])
def test_derive_literal(pattern: str, literal: str | None) -> None:
    assert derive_literal(pattern) == literal


@pytest.mark.parametrize(("pattern", "literals"), [
    (r"(?:Segmentation fault|SIGSEGV|Signal 11\b)", ("Segmentation fault", "SIGSEGV", "Signal 11")),
    (r"^(?:KeyboardInterrupt|SystemExit: (?:143|130)\b)", ("KeyboardInterrupt", "SystemExit: ")),
    (r"(?P<all>(?:Bus error|SIGBUS))", ("Bus error", "SIGBUS")),
    (r"Bus error|SIGBUS|SIGBUS", ("Bus error", "SIGBUS")),
    (r"abcd", ("abcd",)),
    (r"abcd|ef", None),  # an alternative too short to tell
    (r"abcd|(?:efgh)?", None),  # an alternative that may match nothing
    (r"(?:abcd|efgh)+x|ijkl", None),  # the group is no whole alternative: its literals are not required
    (r"(?i)abcd|efgh", None),
    (r"[|]abcd|efgh", ("abcd", "efgh")),  # a class's `|` is no alternation
    (r"[^]|]abcd|efgh", ("abcd", "efgh")),  # nor is it in a class whose first member is `]`
])
def test_derive_any_literal(pattern: str, literals: tuple[str, ...] | None) -> None:
    assert derive_any_literal(pattern) == literals


def _walked_structure(pattern: str) -> list[tuple[int, str, int]]:
    """The `(`, `)` and `|` of a pattern outside escapes and classes, found character by character (the reference
    `literals._structure` is held to)."""
    out, depth, i, n = [], 0, 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "[":
            j = i + 1
            j += pattern[j:j + 1] == "^"
            j += pattern[j:j + 1] == "]"
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i = j + 1
            continue
        depth += (ch == "(") - (ch == ")")
        if ch in "()|":
            out.append((i, ch, depth))
        i += 1
    return out


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="ab^]|()\\[", max_size=24))
def test_a_patterns_structure_is_read_as_a_walk_through_it_reads_it(pattern: str) -> None:
    """Groups, bars, escapes and classes (unclosed ones, `[]...]`, `[^]...]`, a trailing backslash) in any order."""
    assert list(literal_rules._structure(pattern)) == _walked_structure(pattern)


@pytest.mark.parametrize("sig_id", [s.id for s in load_signatures(use_env=False).signatures])
def test_each_shipped_pattern_is_cut_into_branches_as_a_walk_cuts_it(sig_id: str) -> None:
    sig = next(s for s in load_signatures(use_env=False).signatures if s.id == sig_id)
    assert list(literal_rules._structure(sig.pattern_text)) == _walked_structure(sig.pattern_text)


def _re_compatible(pattern: str):
    try:
        return re.compile(pattern)
    except re.error:
        return None


@pytest.mark.parametrize("sig_id", [s.id for s in load_signatures(use_env=False).signatures
                                    if derive_any_literal(s.pattern_text) and _re_compatible(s.pattern_text)])
def test_every_text_a_signature_matches_holds_one_of_its_derived_literals(sig_id: str) -> None:
    """Texts drawn from the regex itself (hypothesis's from_regex, where `re` reads the pattern as `regex` does)."""
    sig = next(s for s in load_signatures(use_env=False).signatures if s.id == sig_id)
    literals = derive_any_literal(sig.pattern_text)

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.from_regex(_re_compatible(sig.pattern_text)))
    def check(text: str) -> None:
        if sig.pattern.search(text):
            assert any(lit in text for lit in literals), (text, literals)
    check()


def test_every_real_line_a_signature_matches_holds_one_of_its_derived_literals(shipped) -> None:
    """The lines of the corpus's real logs: where a gated signature's regex matches, its literals are there."""
    shipped.match("")  # builds the literal index
    assert len(shipped.caches.required) > 60
    checked = 0
    for path in sorted(CASES.glob("real-*/*")):
        if path.suffix in (".json", ".md") or not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            for i, literals in shipped.caches.required.items():
                if shipped.signatures[i].pattern.search(line[:4000], timeout=1.0):
                    checked += 1
                    assert any(lit in line[:4000] for lit in literals), (shipped.signatures[i].id, line[:200])
    assert checked > 300  # 506 on 2026-11-27


@pytest.fixture(scope="module")
def shipped():
    return load_signatures(use_env=False)


def test_every_cause_has_signatures_and_advice(shipped) -> None:
    with_sigs = {s.cause for s in shipped.signatures}
    missing = [c for c in CAUSES if c not in with_sigs and c != "unknown"]
    assert not missing, f"causes without a signature: {missing}"
    no_advice = [c for c in CAUSES if c not in shipped.causes or not shipped.causes[c].advice]
    assert not no_advice, f"causes without advice in causes.toml: {no_advice}"


def test_shipped_ids_are_unique_and_prefiltered(shipped) -> None:
    ids = [s.id for s in shipped.signatures]
    assert len(ids) == len(set(ids))
    assert not shipped.always, "a shipped signature without prefilter forces a full regex scan of every line"


def test_every_prefilter_literal_is_reached_by_an_anchor(shipped) -> None:
    """A line may hold any ONE of a signature's literals; the scanner only looks at lines holding an anchor."""
    unreached = [(sig.id, lit) for sig in shipped.signatures if sig.kind != "elastic_failure"
                 for lit in sig.prefilter if not any(a.decode() in lit for a in shipped.anchors)]
    assert not unreached


def test_a_line_with_only_one_of_the_literals_is_scanned(tmp_path: Path) -> None:
    """gloo's size-mismatch abort has 'mismatch' but no 'rror': it must still be seen (lab-collective_mismatch)."""
    from ddpslurm.analyze.api import analyze_paths

    log = tmp_path / "rank_4.log"
    log.write_text(
        "rank 4/6 on n03: process group ready\n"
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
        "  what():  [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456] "
        "op.preamble.length <= op.nbytes. 344 vs 4. Received data size doesn't match expected size. "
        "Is there a distributed collective mismatch in your code?\n")
    assert analyze_paths([log], workers=1).to_dict()["cause"] == "collective_mismatch"


def test_shipped_anchors_stay_few(shipped) -> None:
    """Every 64 anchors are one more automaton pass over every byte (prefilter.TEDDY_PATTERNS), and more anchors
    make more lines candidates: a new signature reuses an anchor where one of its literals holds one. Counted as
    the finders look for them: an anchor holding another is not looked for (prefilter.minimal)."""
    looked_for = minimal(shipped.anchors)
    extra = [a for a in looked_for if a.decode() not in ANCHORS]
    assert len(looked_for) <= 76, f"{len(looked_for)} anchors slow the prefilter: {extra}"


def test_no_shipped_anchor_is_a_common_word_of_healthy_logs(shipped) -> None:
    """An anchor found in lines every healthy job prints makes each of them a candidate, read in full or replayed
    (torch's deprecation warning for NCCL_ASYNC_ERROR_HANDLING, printed by every rank, held the anchor `ERROR`:
    121 candidate lines per node log of the 256-rank torchrun job, 16 us each)."""
    healthy = [
        b"[W Utils.hpp:133] Warning: Environment variable NCCL_ASYNC_ERROR_HANDLING is deprecated; use "
        b"TORCH_NCCL_ASYNC_ERROR_HANDLING instead (function getCvarInt)",
        b"2025-03-14 06:27:51,000 INFO train [rank 24]: step 914 | loss 2.9077 | lr 3.000e-04 | grad_norm 0.831",
    ]
    for line in healthy:
        assert not [a for a in minimal(shipped.anchors) if a in line], line


@pytest.mark.parametrize(("line", "sig_id", "fields"), [
    # watchdog, three generations
    ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5121, OpType=ALLREDUCE, NumelIn=1, "
     "NumelOut=1, Timeout(ms)=600000) ran for 600039 milliseconds before timing out.", "watchdog-timeout-v1",
     {"rank": "3", "seq": "5121", "op": "ALLREDUCE"}),
    ("[E612 14:11:40.147 ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank 3] Exception (either an error or timeout) "
     "detected by watchdog at work: 5121, last enqueued NCCL work: 5121, last completed NCCL work: 5120.",
     "watchdog-timeout-v2", {"rank": "3", "seq": "5121", "last_enqueued": "5121", "last_completed": "5120"}),
    ("[PG ID 0 PG GUID 0(default_pg) Rank 11] failure detected by watchdog at work sequence id: 88 PG status: "
     "last enqueued work: 88, last completed work: 86", "watchdog-timeout-v3",
     {"rank": "11", "seq": "88", "last_enqueued": "88", "last_completed": "86"}),
    ("[E219 08:58:32.606667496 ProcessGroupNCCL.cpp:1785] [PG ID 2 PG GUID 3 Rank 3] Exception (either an error or "
     "timeout) detected by watchdog at work: 31, last enqueued NCCL work: 58, last completed NCCL work: 30.",
     "watchdog-timeout-v2", {"pg": "2", "rank": "3", "seq": "31", "last_enqueued": "58", "last_completed": "30"}),
    ("[PG ID 0 PG GUID 0(default_pg) Rank 2] Timeout at NCCL work: 45, last enqueued NCCL work: 47, last completed "
     "NCCL work: 44.", "watchdog-timeout-v2", {"pg": "0", "rank": "2", "seq": "45", "last_enqueued": "47"}),
    # vendor forks of ProcessGroupNCCL (torch_npu's HCCL) print the same watchdog lines with their backend's name
    ("[E324 13:00:25.428029551 compiler_depend.ts:574] [Rank 1] Watchdog caught collective operation timeout: "
     "WorkHCCL(SeqNum=196, OpType=ALLREDUCE, Timeout(ms)=3600000) ran for 3600185 milliseconds before timing out.",
     "watchdog-timeout-v1", {"rank": "1", "seq": "196", "op": "ALLREDUCE", "timeout_ms": "3600000"}),
    ("[E324 13:00:25.4 compiler_depend.ts:628] Some HCCL operations have failed or timed out. Due to the "
     "asynchronous nature of ASCEND kernels, subsequent NPU operations might run on corrupted/incomplete data.",
     "watchdog-generic", {}),
    ("[Rank 0] ProcessGroupHCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued "
     "collectives.", "heartbeat-monitor", {"stuck_s": "480"}),
    ("[E1002 18:16:40.662691402 ProcessGroupNCCL.cpp:756] [Rank 1] Work WorkNCCL(SeqNum=2521, OpType=ALLREDUCE, "
     "NumelIn=160672064, NumelOut=160672064, Timeout(ms)=600000) timed out in blocking wait.", "blocking-wait-timeout",
     {"rank": "1", "seq": "2521", "op": "ALLREDUCE", "timeout_ms": "600000"}),
    ("[PG ID 0 PG GUID 0(default_pg) Rank 0]  failure detected by watchdog at work sequence id: 20585 PG status: "
     "last enqueued work: 20589, last completed work: 20584", "watchdog-timeout-v3",  # torch prints two spaces
     {"rank": "0", "seq": "20585", "last_enqueued": "20589", "last_completed": "20584"}),
    ("[E703 21:51:54.112142364 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID 0(default_pg) Rank 6] Received a dump "
     "signal due to a collective timeout from  rank 7 and we will try our best to dump the debug info. Last enqueued "
     "NCCL work: 56116, last completed NCCL work: 56116.This is most likely caused by incorrect usages of collectives",
     "watchdog-dump-signal", {"pg": "0", "rank": "6", "from_rank": "7", "last_enqueued": "56116",
                              "last_completed": "56116"}),
    ("[PG ID 1 PG GUID 5 Rank 6] Received a dump signal due to a collective timeout from this local rank and we will "
     "try our best to dump the debug info. Last enqueued NCCL work: 56116, last completed NCCL work: 56115.",
     "watchdog-dump-signal", {"pg": "1", "rank": "6", "last_enqueued": "56116", "last_completed": "56115"}),
    ("[PG 2 (tp) Rank 1] Received a global timeout from another rank and will start to dump the debug info. Last "
     "enqueued NCCL work: 12, last completed NCCL work: -1.", "watchdog-dump-signal",
     {"pg": "2", "rank": "1", "last_enqueued": "12", "last_completed": "-1"}),
    ("[PG 0 Rank 3] Received a dump signal from this local rank and will start to dump the debug info. Last "
     "enqueued HCCL work: 9, last completed HCCL work: 8.", "watchdog-dump-signal",
     {"pg": "0", "rank": "3", "last_enqueued": "9", "last_completed": "8"}),
    ("RuntimeError: Timed out initializing process group in store based barrier on rank: 4, for key: "
     "store_based_barrier_key:1 (world_size=8, worker_count=7, timeout=0:30:00)", "store-barrier-timeout",
     {"rank": "4", "world_size": "8", "worker_count": "7"}),
    ("torch.distributed.DistStoreError: Timed out after 1801 seconds waiting for clients. 7/8 clients joined.",
     "store-clients-timeout", {"worker_count": "7", "world_size": "8"}),
    ("RuntimeError: [Rank 0]: Ranks 6, 7 failed to pass monitoredBarrier in 1800000 ms", "monitored-barrier",
     {"ranks": "6, 7"}),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.12]:5290",
     "gloo-closed-by-peer", {"peer_ip": "10.0.0.12"}),
    ("[W socket.cpp:426] [c10d] The server socket has failed to bind to [::]:29400 "
     "(errno: 98 - Address already in use).", "port-in-use", {"port": "29400"}),
    ("torch.distributed.DistNetworkError: The client socket has timed out after 15000ms while trying to connect to "
     "(lab-n01, 24411).", "client-connect-timeout", {"peer_host": "lab-n01", "port": "24411"}),
    ("node1:11:12 [1] init.cc:611 NCCL WARN Mismatched NCCL version detected : rank 8 version 21903 rank 0 version "
     "21805", "nccl-version-mismatch", {"peer_rank": "8", "rank": "0"}),
    ("gpu-3:1:2 [2] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.1.1.2<44178> "
     "with error 12, opcode 0, len 0, vendor err 129", "nccl-ib-completion-error",
     {"peer_ip": "10.1.1.2", "status": "12"}),
    ("include/socket.h:403 NCCL WARN Connect to 10.0.0.2<40433> failed : Connection refused", "nccl-connect-refused",
     {"peer_ip": "10.0.0.2"}),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB.", "cuda-oom", {"tried": "6.00 GiB"}),
    ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB", "cuda-oom", {}),
    ("slurmstepd: error: *** STEP 123.0 ON node01 CANCELLED AT 2024-05-08T08:47:31 DUE TO TIME LIMIT ***",
     "slurm-time-limit", {"at": "2024-05-08T08:47:31"}),
    ("slurmstepd: error: *** JOB 123 ON node01 CANCELLED AT 2024-05-08T08:47:31 ***", "slurm-job-cancelled", {}),
    ("srun: error: node02: tasks 2-7: Exited with exit code 1", "srun-task-exited", {"host": "node02", "tasks": "2-7"}),
    ("srun: error: node02: task 3: Segmentation fault", "srun-task-segfault", {"tasks": "3"}),
    # srun's and salloc's node-fail handlers (allocate.c, salloc.c): the same message, either client's prefix
    ("srun: error: Node failure on gpu-17", "srun-node-failure", {"host": "gpu-17"}),
    ("salloc: error: Node failure on worker-1", "srun-node-failure", {"host": "worker-1"}),
    ("mpirun noticed that process rank 1 with PID xxxxxx on node xxxxxxxx exited on signal 9 (Killed).",
     "mpirun-rank-signal", {"rank": "1", "signum": "9"}),  # a pasted log with the pid masked
    ("mpirun noticed that process rank 3 with PID 4242 on node gpu-07 exited on signal 11 (Segmentation fault).",
     "mpirun-rank-signal", {"rank": "3", "host": "gpu-07", "signum": "11"}),  # not the bare segfault signature
    ("torch.multiprocessing.spawn.ProcessExitedException: process 2 terminated with signal SIGKILL",
     "spawn-process-signal", {"local_rank": "2", "signal": "SIGKILL"}),
    ("slurmstepd: error:  mpi/pmix_v3: pmixp_coll_ring_reset_if_to: adas-ml [0]: pmixp_coll_ring.c:742: "
     "0x14ce0c02cb20: collective timeout seq=0", "pmix-fence-timeout", {"reporter": "adas-ml", "seq": "0"}),
    ("e66aa18dc444:3171:3171 [0] include/socket.h:311 WARN Socket creation failed : Address family not supported by "
     "protocol", "nccl-socket-no-address", {}),
    ("ncclSocketInit: connecting to address  with family 0 is neither AF_INET(2) nor AF_INET6(10)",
     "nccl-socket-no-address", {}),
    ("node-3:11:11 [0] bootstrap.cc:131 NCCL WARN Bootstrap Root : rank 1 of 8 ranks has already checked in",
     "nccl-bootstrap-root-ranks", {"dup_rank": "1", "nranks": "8"}),
    ("gpu-1:7:7 [0] bootstrap.cc:120 NCCL WARN Bootstrap Root : mismatch in rank count from procs 8 : 16",
     "nccl-bootstrap-root-ranks", {"root_nranks": "8", "peer_nranks": "16"}),
    ("[1,1]<stderr>:tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with "
     "shape[2,1023,50257] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
     "cuda-oom", {}),
    ("ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task. The actor is dead because "
     "its node has died. Node Id: 677df2a9020c5db4", "ray-actor-node-died", {"node_id": "677df2a9020c5db4"}),
    # older slurmstepd banners (req.c): the node after the time or the reason, no 'ON node' before CANCELLED
    ("slurmstepd: *** JOB 1479012 CANCELLED AT 2015-02-04T06:33:25 *** on sh-2-3", "slurm-job-cancelled",
     {"step": "1479012", "stepd_host": "sh-2-3"}),
    ("slurmstepd: *** JOB 830329 CANCELLED AT 2018-08-06T17:21:44 DUE TO TIME LIMIT on n447 ***", "slurm-time-limit",
     {"step": "830329", "stepd_host": "n447", "at": "2018-08-06T17:21:44"}),
    ("slurmstepd: error: *** STEP 77.0 CANCELLED AT 2018-08-06T17:21:44 DUE TO PREEMPTION on n12 ***",
     "slurm-preempted", {"step": "77.0", "stepd_host": "n12"}),
    ("slurmstepd: error: *** JOB 77 CANCELLED AT 2018-08-06T17:21:44 DUE TO NODE n12 FAILURE ***",
     "slurm-node-failure-step", {"step": "77", "stepd_host": "n12"}),
    ("slurmstepd: error: *** STEP 77.1 CANCELLED AT 2018-08-06T17:21:44 *** on n12", "slurm-step-cancelled",
     {"step": "77.1", "stepd_host": "n12"}),
    # Ray's GCS marking a node dead (1.x 'ip:', 2.x 'address: ... node name:'): the node it names is the one lost
    ("2022-02-15 16:53:52,096\tWARNING worker.py:1462 -- The node with node id: 8f205b12643d25d8c1ce57c4 and ip: "
     "10.128.0.103 has been marked dead because the detector has missed too many heartbeats from it.",
     "ray-node-marked-dead", {"node_id": "8f205b12643d25d8c1ce57c4", "host": "10.128.0.103"}),
    ("WARNING worker.py:1866 -- The node with node id: 9426f445 and address: 10.130.0.113 and node name: tpu-w-3 has "
     "been marked dead because the detector has missed too many heartbeats from it. This can happen when a (1) raylet "
     "crashes unexpectedly (OOM, preempted node, etc.)", "ray-node-marked-dead",
     {"host": "10.130.0.113", "node_name": "tpu-w-3"}),
    # Kubernetes: the kubelet's memory-pressure eviction, a container OOMKilled in its cgroup
    ("Message:        The node was low on resource: memory.", "kubernetes-memory-eviction", {}),
    ("pytorchjob-worker-3     0/1     OOMKilled   0          5m", "kubernetes-memory-eviction", {}),
    # torch's watchdog finding its own CUDA context broken: the kernel fault is the rank's own, not a timeout
    ("192.168.13.81: [rank19]:[E808 10:31:07.406255799 ProcessGroupNCCL.cpp:1895] [PG ID 1 PG GUID 1 Rank 19] Process "
     "group watchdog thread terminated with exception: CUDA error: unspecified launch failure", "cuda-illegal-access",
     {"cuda_error": "unspecified launch failure"}),
    # a launcher that could not reach a node over ssh (DeepSpeed's runner, its check, pdsh, OpenSSH itself)
    ("RuntimeError: Using hostfile at /etc/hostfile but host=gpu-n3 was not reachable via ssh. If you are running with "
     "a single node please remove /etc/hostfile or setup passwordless ssh.", "launcher-ssh-unreachable",
     {"host": "gpu-n3"}),
    ("subprocess.CalledProcessError: Command 'ssh -o PasswordAuthentication=no gadi-gpu-v100-0011 hostname' returned "
     "non-zero exit status 255.", "launcher-ssh-unreachable", {"host": "gadi-gpu-v100-0011"}),
    ("subprocess.CalledProcessError: Command '['ssh 10.0.0.7 hostname -I']' returned non-zero exit status 255.",
     "launcher-ssh-unreachable", {"host": "10.0.0.7"}),
    ("pdsh@node01: node03: ssh exited with exit code 255", "launcher-ssh-unreachable", {"host": "node03"}),
    ("ssh: connect to host 175.24.121.148 port 22: No route to host", "launcher-ssh-unreachable",
     {"host": "175.24.121.148", "reason": "No route to host"}),
    ("ssh: Could not resolve hostname gpu-n3: Name or service not known", "launcher-ssh-unreachable",
     {"host": "gpu-n3"}),
    # Ray's memory monitor: the raylet's summary and what a ray.get caller receives (host memory, not the GPU's)
    ("(raylet) [2025-04-02 15:02:00,117 E 135782 135782] (raylet) node_manager.cc:3069: 1 Workers (tasks / actors) "
     "killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: 351e406b196f, IP: "
     "10.95.143.76) over the last time period.", "ray-memory-monitor-kill", {"host": "10.95.143.76"}),
    ("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
     "ray-memory-monitor-kill", {}),
    # Lightning's device parser refusing devices the process cannot see (the message's second line)
    ("                But your machine only has: [0]", "lightning-devices-unavailable", {"available": "0"}),
    (" But your machine only has: []", "lightning-devices-unavailable", {}),
    # wordings alone on a line that their signature's prefilter once missed
    ("dial tcp: lookup master-0: No route to host", "client-connect-failed", {}),
    ("terminate called after throwing an instance of 'std::bad_alloc'", "python-memory-error", {}),
    ("192.168.1.51: Failed to CUDA calloc async 1920 bytes", "nccl-cuda-oom", {}),
    # device OOM in Intel's Level Zero / Unified Runtime codes (oneCCL, XPU) and HIP's error enum
    ("2024:05:29-19:16:18:(202165) |CCL_ERROR| worker.cpp:338 ccl_worker_func: worker 0 caught internal exception: "
     "oneCCL: ze_call.cpp:28 do_call: EXCEPTION: ze error at zeCommandQueueExecuteCommandLists, code: "
     "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY", "cuda-oom", {}),
    ("RuntimeError: HIP error: hipErrorOutOfMemory", "cuda-oom", {}),
    # gloo's pair failing to reach the address its peer advertised; its enforce's reason on a line of its own
    ("  what():  [/work/third_party/gloo/gloo/transport/tcp/pair.cc:724] connect [127.0.1.1]:3210: Connection refused",
     "gloo-pair-connect-failed", {"peer_ip": "127.0.1.1", "peer_port": "3210"}),
    ("  timed out connecting: SO_ERROR: Connection refused, remote=[fe80::1%eth0]:29512", "gloo-pair-connect-failed",
     {"peer_ip": "fe80::1%eth0", "peer_port": "29512"}),
    ("  ifa != nullptr. Unable to find address for: ^lo", "gloo-unable-to-find-address", {"ifname": "^lo"}),
    # Module.load_state_dict refusing a checkpoint, with or without its RuntimeError head
    ("Error(s) in loading state_dict for Linear:", "state-dict-load-error", {"module": "Linear"}),
    ("RuntimeError: Error(s) in loading state_dict for GPT2LMHeadModel:", "state-dict-load-error",
     {"module": "GPT2LMHeadModel"}),
    # TORCH_NCCL_DESYNC_DEBUG's verdict (c10d TraceUtils.h): the lagging ranks, at the lowest collective or in none
    ("\t     [7] finished collective #182, but didn't join collective #183 (count from 1)", "desync-verdict",
     {"ranks": "7", "seq": "182"}),
    ("\t   - [0, 1, 2, 3] joined but didn't finish collective #730 (count from 1)", "desync-verdict",
     {"ranks": "0, 1, 2, 3", "seq": "730"}),
    ("\t - To our best knowledge, ranks [3, 12] are the lagging ranks that caused this timeout. They never joined any "
     "collectives", "desync-verdict", {"ranks": "3, 12"}),
    # a wrapper's own prefix before srun's task line (dagster-slurm): still srun's task line, not a process Killed
    ("[SLURM STDERR fallback] srun: error: lrdn1786: task 0: Killed", "srun-task-killed", {"host": "lrdn1786"}),
    ("slurmstepd: error: Detected 1 oom_kill event in StepId=3321.0. Some of the step tasks have been OOM Killed.",
     "slurm-oom-kill", {"step": "3321.0"}),
    ("slurmstepd-phoenix-07: error: Detected 2 oom-kill event(s) in StepId=1683797.batch. Some of your processes may "
     "have been killed by the cgroup out-of-memory handler.", "slurm-oom-kill",
     {"host": "phoenix-07", "count": "2", "step": "1683797.batch"}),
    ("NET/IBP:Got completion from peer 7.6.13.83<36315> with status=12 opcode=32698 len=32696 vendor err 129 (Send)",
     "nccl-ib-completion-error", {"peer_ip": "7.6.13.83", "status": "12"}),
    ("WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 485370 closing signal SIGTERM",
     "elastic-sigterm", {"pid": "485370"}),
    ("W0616 00:37:22.830000 4015698 torch/distributed/elastic/agent/server/api.py:719] Received Signals.SIGTERM death "
     "signal, shutting down workers", "elastic-child-failed", {"signal": "SIGTERM"}),
    ("torch.distributed.DistBackendError: [3] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via "
     "c10d key-value store by key '0', but store->get('0') got error: failed to recv, got 0 bytes",
     "nccl-unique-id-wait", {"reporter_rank": "3", "root_rank": "0", "reason": "failed to recv, got 0 bytes"}),
    ("DistBackendError: [8] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value "
     "store by key '0', but store->get('0') got error: wait timeout after 600000ms. This may indicate a possible "
     "application crash on rank 0 or a network set up issue.", "nccl-unique-id-wait",
     {"reporter_rank": "8", "root_rank": "0", "reason": "wait timeout after 600000ms"}),
    ("RuntimeError: DDP expects same model across all ranks, but Rank 1 has 338 params, while rank 0 has inconsistent "
     "0 params.", "ddp-model-mismatch", {"reporter": "1", "named_rank": "0", "peer_params": "0"}),
    ("W0227 17:39:41.936000 293814 site-packages/torch/distributed/elastic/multiprocessing/api.py:766] Closing process "
     "293866 via signal SIGTERM", "elastic-sigterm", {"pid": "293866", "signal": "SIGTERM"}),
    # NCCL's socket wordings: 2.20-2.23, 2.27+ (lowercase 'connect to', the OS layer's poll), sends as well as recvs
    ("node1:1234:1250 [0] misc/socket.cc:592 NCCL WARN socketStartConnect: connect to 10.0.0.2<45763> failed : Network "
     "is unreachable", "nccl-connect-refused", {"peer_ip": "10.0.0.2", "peer_port": "45763",
                                                "reason": "Network is unreachable"}),
    ("h3:2387398:2387398 [3] os/linux.cc:200 NCCL WARN ncclOsSocketPollConnect: connect to 10.82.101.249<37857> "
     "returned Connection refused, exceeded error retry count after 35 attempts", "nccl-connect-refused",
     {"peer_ip": "10.82.101.249", "reason": "Connection refused"}),
    ("node1:1234:1250 [0] misc/socket.cc:633 NCCL WARN socketPollConnect: Connect to 10.0.0.2<45763> returned "
     "111(Connection refused) errno 115(Operation now in progress)", "nccl-connect-refused",
     {"peer_ip": "10.0.0.2", "reason": "Connection refused"}),
    ("node1:1234:1250 [0] misc/socket.cc:618 NCCL WARN socketPollConnect to 10.0.0.2<45763> failed with error "
     "Interrupted system call", "nccl-connect-refused", {"peer_ip": "10.0.0.2", "reason": "Interrupted system call"}),
    ("gpu-server320 [5] misc/socket.cc:46 NCCL WARN socketProgressOpt: Call to send to 10.44.137.149<52905> failed : "
     "Connection reset by peer", "nccl-socket-peer-lost", {"peer_ip": "10.44.137.149", "peer_port": "52905"}),
    ("n1:1:2 [0] misc/socket.cc:592 NCCL WARN socketStartConnect: connect to 10.0.0.2<35573> failed : Software caused "
     "connection abort", "nccl-socket-peer-lost", {"peer_ip": "10.0.0.2"}),
    # NCCL's IB async event thread: this node's port went down, a queue pair hit a fatal error
    ("lrdn3031:166577:167079 [0] transport/net_ib.cc:101 NCCL WARN NET/IB : mlx5_2:1 Got async event : port error",
     "nccl-ib-failure", {}),
    ("nvl72026-T11:393849:395082 [0] transport/net_ib.cc:253 NCCL WARN NET/IB : mlx5_3:1 Got non-fatal async event: "
     "port error(10)", "nccl-ib-failure", {}),
    ("node201:2954:3012 [0] NCCL WARN NET/IB : mlx5_0:1 Got async event : local access violation work queue "
     "error", "nccl-ib-failure", {}),
    ("gn07:811:902 [3] transport/net_ib.cc:101 NCCL WARN NET/IB : mlx5_1:1 Got async event : CQ error",
     "nccl-ib-failure", {}),
    ("node-0:5911:5971 [0] transport/net_ib.cc:154 NCCL WARN NET/IB : mlx5_3:1 async fatal event on QP "
     "(0x732d78661238): invalid request local work queue error", "nccl-ib-failure", {}),
    ("E0612 14:11:47.214000 211828 torch/distributed/elastic/multiprocessing/api.py:862] failed (exitcode: -6) "
     "local_rank: 1 (pid: 211841) of binary: /usr/bin/python3", "elastic-worker-failed",
     {"exitcode": "-6", "local_rank": "1", "pid": "211841"}),
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", "gpu-fell-off-bus", {}),
    ("RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.", "dataloader-worker-killed",
     {"signal": "Killed"}),
    ("KeyError: 'label'", "python-exception", {"exc_type": "KeyError"}),
])
def test_shipped_signature_matches(shipped, line: str, sig_id: str, fields: dict[str, str]) -> None:
    hit = shipped.match(line)
    assert hit is not None, line
    sig, m = hit
    assert sig.id == sig_id
    groups = {k: v for k, v in m.groupdict().items() if v is not None}
    for key, value in fields.items():
        assert groups.get(key) == value, (key, groups)


@pytest.mark.parametrize("line", [
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.",
    "node1:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] via P2P/IPC",
    "step 100 loss 3.14",
    "Message:        The node was low on resource: ephemeral-storage.",  # disk pressure, not memory
])
def test_advice_and_noise_are_not_evidence(shipped, line: str) -> None:
    assert shipped.match(line) is None


def test_every_shipped_pattern_compiles(shipped) -> None:
    # shipped files are compiled lazily at run time, so this test is their validation
    for sig in shipped.signatures:
        assert sig.pattern.pattern == sig.pattern_text, sig.id


@pytest.mark.parametrize("line", [
    "ncclSocketInit: connecting to address  with family 59408 is neither AF_INET(2) nor AF_INET6(10)",  # garbage
    "OOM when allocating tensor with shape[4096,4096] and type float on /job:localhost/replica:0/task:0/device:CPU:0 "
    "by allocator cpu",  # TensorFlow's host allocator: not the GPU
])
def test_lookalikes_of_the_new_families_are_not_them(shipped, line: str) -> None:
    hit = shipped.match(line)
    assert hit is None or hit[0].id not in ("nccl-socket-no-address", "cuda-oom"), hit


def test_index_of_is_the_position_of_that_very_signature(shipped) -> None:
    """`index_of` answers from an id -> position map; a set built with one id twice still answers by identity."""
    from dataclasses import replace as copy_of

    assert all(shipped.index_of(s) == i for i, s in enumerate(shipped.signatures))
    first = shipped.signatures[0]
    twin = copy_of(first)
    doubled = SignatureSet([first, twin])
    assert (doubled.index_of(first), doubled.index_of(twin)) == (0, 1)
