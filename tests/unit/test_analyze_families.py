"""Message families mined from the libraries' sources (analyzer/signatures/README.md has the table): each line in
each upstream wording, behind the prefixes logs put in front, becomes the expected event; benign lines none."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.model import SourceFile
from ddpslurm.analyze.parse.attribution import body_rank, interface_list, interface_scope, strip_prefixes
from ddpslurm.analyze.parse.scan import scan_file


def scan_text(tmp_path: Path, sigs, text: str, name: str = "job.log"):
    path = tmp_path / name
    path.write_text(text)
    return scan_file(SourceFile(path=str(path), display=name, size=path.stat().st_size), sigs)[0]


#: what logs put in front of a library's line (none, torch >= 2.2, CI timestamp, srun --label, Ray, an unknown tag)
PREFIXES = ("", "[rank3]:", "2024-05-08T08:47:31.1234567Z ", "  3: ", "(RayTrainWorker pid=77, ip=10.0.0.7) ",
            "[job-7f2] INFO [rank3]: ")
H = "gpu-a07:31337:31400 [2] "  # NCCL's host:pid:tid [dev] head

# (line, signature, kind, cause, role, accuses, fields that must be there)
FAMILIES = [
    # DDP's reducer: the index list (default) and the names (DETAIL) of a rank's parameters without a gradient
    ("Parameter indices which did not receive grad for rank 2: 362 363 364", "unused-parameters", "exception",
     "unused_parameters", "culprit", "self", {"reporter_rank": "2"}),
    ("Parameters which did not receive grad for rank 0: head.weight, head.bias", "unused-parameters", "exception",
     "unused_parameters", "culprit", "self", {"reporter_rank": "0"}),
    # argparse's ArgumentParser.error (exit status 2, no traceback): a script, a console script with subcommands
    ("train.py: error: unrecognized arguments: --json", "argparse-usage-error", "exception", "user_code_exception",
     "culprit", "self", {"prog": "train.py", "message": "unrecognized arguments: --json"}),
    ("finetune.py: error: argument --lr: invalid float value: '1e-4x'", "argparse-usage-error", "exception",
     "user_code_exception", "culprit", "self", {"prog": "finetune.py"}),
    ("accelerate <command> [<args>] launch: error: the following arguments are required: training_script",
     "argparse-usage-error", "exception", "user_code_exception", "culprit", "self",
     {"message": "the following arguments are required: training_script"}),
    # allocation failures that abort the process: Rust's handler (tokenizers), NCCL 2.4's mismatch check
    ("memory allocation of 2097152 bytes failed", "allocation-failed-abort", "exception", "host_oom", "culprit",
     "self", {"bytes": "2097152"}),
    (H + "init.cc:1247 NCCL WARN Mismatched collective detected, please check your collective calls at and around "
     "rank 12. You can use NCCL_DEBUG=INFO", "nccl-mismatched-collective", "mismatch_detected", "collective_mismatch",
     "culprit", "none", {"around_rank": "12"}),
    # ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL): each rank that sees a fingerprint differ names itself and it
    ("RuntimeError: Detected mismatch between collectives on ranks. Rank 2 is running collective: CollectiveFinger"
     "Print(SequenceNumber=32, OpType=ALLREDUCE, TensorShape=[], TensorDtypes=Float), but Rank 3 is running "
     "collective: CollectiveFingerPrint(SequenceNumber=0OpType=GATHER).", "collective-mismatch-wrapper",
     "mismatch_report", "collective_mismatch", "victim", "none", {"reporter": "2", "named_rank": "3"}),
    ("Duplicate GPU detected : rank 5 and rank 1 both on CUDA device 1a000", "nccl-duplicate-gpu", "nccl_warn",
     "duplicate_gpu", "culprit", "host", {"rank": "5", "other_rank": "1", "busid": "1a000"}),
    # c10d's client connect timeout: torch 1.x/2.0 '(host, port)', later 'host:port' and '[v6]:port'; the agent's error
    ("[E socket.cpp:860] [c10d] The client socket has timed out after 60s while trying to connect to (gpu-b3, 29400).",
     "client-connect-timeout", "socket", "network_unreachable", "either", "self",
     {"peer_host": "gpu-b3", "port": "29400", "timeout": "60s"}),
    ("[E socket.cpp:860] [c10d] The client socket has timed out after 900s while trying to connect to 10.8.0.4:29511",
     "client-connect-timeout", "socket", "network_unreachable", "either", "self",
     {"peer_host": "10.8.0.4", "port": "29511"}),
    ("[c10d] The client socket has timed out after 30s while trying to connect to [fd00::12]:1234",
     "client-connect-timeout", "socket", "network_unreachable", "either", "self", {"peer_host": "[fd00::12]"}),
    # ... to the store on its own node (loopback): refused, never dropped, until the deadline: no store yet
    ("[E socket.cpp:957] [c10d] The client socket has timed out after 1800s while trying to connect to (127.0.0.1, "
     "53580).", "client-connect-timeout-loopback", "socket", "rendezvous_timeout", "either", "self",
     {"store_host": "127.0.0.1", "port": "53580"}),
    ("[c10d] The client socket has timed out after 600s while trying to connect to localhost:29500",
     "client-connect-timeout-loopback", "socket", "rendezvous_timeout", "either", "self", {"store_host": "localhost"}),
    ("torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has "
     "failed. See inner exception for details.", "rendezvous-connection-error", "exception", "network_unreachable",
     "either", "self", {}),
    # NCCL IB completion: 2.7 (no peer), 2.12-2.2x (peer, 'error N'), 2.27 (status=NAME(N)), IPv6 peer with a zone id
    (H + "transport/net_ib.cc:818 NCCL WARN NET/IB : Got completion with error 12, opcode 1, len 0, vendor err 129",
     "nccl-ib-completion-error", "nccl_warn", "infiniband_error", "culprit", "self",
     {"status": "12", "vendor_err": "129"}),
    (H + "transport/net_ib.cc:1198 NCCL WARN NET/IB : Got completion from peer 10.3.1.2<59422> with error 12, "
     "opcode 0, len 0, vendor err 129", "nccl-ib-completion-error", "nccl_warn", "infiniband_error", "culprit", "self",
     {"peer_ip": "10.3.1.2", "peer_port": "59422", "status": "12"}),
    (H + "transport/net_ib/p2p.cc:688 NCCL WARN NET/IB: Got completion from peer fe80::1e34:da03:5c:7a80%ib0<40231> "
     "with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RDMA_WRITE(0) vendor_err=129  hca mlx5_0",
     "nccl-ib-completion-error", "nccl_warn", "infiniband_error", "culprit", "self",
     {"peer_ip": "fe80::1e34:da03:5c:7a80%ib0", "status": "12", "vendor_err": "129"}),
    (H + "NCCL WARN NET/IB : Got completion from peer fe80::2%ib1<4431> with error 5, opcode 0, len 0, vendor err 249",
     "nccl-ib-flush", "nccl_warn", "infiniband_error", "victim", "none", {"peer_ip": "fe80::2%ib1", "status": "5"}),
    # NCCL shared memory: 2.4-2.11 SYSCHECK lines, 2.12+ shmutils lines
    (H + "include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on device", "nccl-shm-segment",
     "nccl_warn", "shm_error", "culprit", "self", {"syscall": "posix_fallocate", "reason": "No space left on device"}),
    (H + "include/shm.h:25 NCCL WARN Call to shm_open failed : Permission denied", "nccl-shm-segment", "nccl_warn",
     "shm_error", "culprit", "self", {"syscall": "shm_open"}),
    (H + "misc/shmutils.cc:38 NCCL WARN Error: failed to extend /dev/shm/nccl-Fj2kq1 to 9637892 bytes",
     "nccl-shm-segment", "nccl_warn", "shm_error", "culprit", "self",
     {"shm_path": "/dev/shm/nccl-Fj2kq1", "bytes": "9637892"}),
    (H + "misc/shmutils.cc:83 NCCL WARN Could not map /dev/shm/nccl-Fj2kq1 size 9637892, error: Cannot allocate memory",
     "nccl-shm-segment", "nccl_warn", "shm_error", "culprit", "self", {"shm_path": "/dev/shm/nccl-Fj2kq1"}),
    # NCCL sockets: connect errnos (2.4-2.11 'Net : ', 2.12+ 'socketStartConnect: ', retries), recv failures
    (H + "misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.3.1.2<43521> failed : No route to host",
     "nccl-connect-refused", "nccl_warn", "network_unreachable", "either", "self",
     {"peer_ip": "10.3.1.2", "reason": "No route to host"}),
    (H + "include/socket.h:403 NCCL WARN Net : Connect to 10.3.1.2<43521> failed : Cannot assign requested address",
     "nccl-connect-refused", "nccl_warn", "network_unreachable", "either", "self",
     {"reason": "Cannot assign requested address"}),
    (H + "misc/socket.cc:467 NCCL WARN socketStartConnect: exceeded retries (20)", "nccl-connect-refused", "nccl_warn",
     "network_unreachable", "either", "self", {"exceeded": "retries", "tries": "20"}),
    (H + "misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.3.1.2<43521> failed : Software caused "
     "connection abort", "nccl-socket-peer-lost", "peer_lost", "unknown", "victim", "peer",
     {"peer_ip": "10.3.1.2", "reason": "Software caused connection abort"}),
    (H + "misc/socket.cc:30 NCCL WARN socketProgressOpt: Call to recv from fe80::9%eth0<5001> failed : Connection "
     "reset by peer", "nccl-socket-peer-lost", "peer_lost", "unknown", "victim", "peer",
     {"peer_ip": "fe80::9%eth0", "reason": "Connection reset by peer"}),
    (H + "include/socket.h:429 NCCL WARN Net : Call to recv from 10.3.1.2<5001> failed : Connection timed out",
     "nccl-socket-peer-lost", "peer_lost", "unknown", "victim", "peer", {"peer_ip": "10.3.1.2"}),
    # c10d store barrier progress (torch 1.8: worker_count; 2.x: num_workers_joined, error=; a concatenated variant)
    ("INFO:torch.distributed.distributed_c10d:Waiting in store based barrier to initialize process group for rank: 0, "
     "key: store_based_barrier_key:1 (world_size=16, worker_count=12, timeout=0:30:00)", "store-barrier-waiting",
     "store_barrier", "rendezvous_timeout", "victim", "none", {"world_size": "16", "worker_count": "12", "rank": "0"}),
    ("Waiting in store based barrier to initialize process group for rank: 5, key: store_based_barrier_key:2 "
     "(world_size=8, num_workers_joined=7, timeout=0:10:00 error=Wait timeout)", "store-barrier-waiting",
     "store_barrier", "rendezvous_timeout", "victim", "none", {"world_size": "8", "worker_count": "7", "rank": "5"}),
    ("Waiting in store based barrier to initialize process group for 20.03 secondsrank: 2, key: "
     "store_based_barrier_key:1 (world_size=4, num_workers_joined=3, timeout=0:30:00 error=x)",
     "store-barrier-waiting", "store_barrier", "rendezvous_timeout", "victim", "none",
     {"waited_s": "20.03", "worker_count": "3"}),
    # torchelastic agent wording variants
    ("WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 4242 closing signal SIGTERM",
     "elastic-sigterm", "agent_sigterm", "unknown", "victim", "none", {"pid": "4242", "signal": "SIGTERM"}),
    ("[2025-01-02 10:00:00,123] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending the closing signal "
     "SIGTERM to process 4243", "elastic-sigterm", "agent_sigterm", "unknown", "victim", "none", {"pid": "4243"}),
    ("E0102 10:00:00.123000 140 torch/distributed/elastic/multiprocessing/api.py:826] failed (exitcode: 1) "
     "local_rank: 2 (pid: 4244) of binary: /usr/bin/python3", "elastic-worker-failed", "agent_failed",
     "user_code_exception", "culprit", "self", {"local_rank": "2", "pid": "4244", "exitcode": "1"}),
    ("failed (exitcode: -11) local_rank: 0 (pid: 4245) of fn: main (start_method: spawn)", "elastic-worker-failed",
     "agent_failed", "user_code_exception", "culprit", "self", {"exitcode": "-11", "pid": "4245"}),
    ("failed (exitcode: 1) for binary located at /usr/bin/python3 with local_rank: 3 (process ID: 4246)",
     "elastic-worker-failed", "agent_failed", "user_code_exception", "culprit", "self",
     {"local_rank": "3", "pid": "4246"}),
    # launchers' wrappers: torch.distributed.launch's CalledProcessError is the launcher's report, not user code
    ("subprocess.CalledProcessError: Command '['/usr/bin/python', '-u', 'train.py', '--local_rank=1']' returned "
     "non-zero exit status 1.", "launcher-child-failed", "agent_failed", "user_code_exception", "culprit", "self",
     {"local_rank": "1", "exitcode": "1"}),
    # Python words a CalledProcessError for a child a signal ended 'died with <Signals.X: N>' (or an unknown one)
    ("subprocess.CalledProcessError: Command '['/usr/bin/python3', '-u', 'train.py', '--local_rank=7', '--lr', "
     "'0.4']' died with <Signals.SIGSEGV: 11>.", "launcher-child-signal", "agent_failed", "segfault", "culprit",
     "self", {"local_rank": "7", "signal": "SIGSEGV", "signum": "11"}),
    ("CalledProcessError: Command '['python', 'train.py', '--local-rank=2']' died with unknown signal 40.",
     "launcher-child-signal", "agent_failed", "segfault", "culprit", "self", {"local_rank": "2", "signum": "40"}),
    # the watchdog's timeout line whose start another process's output broke: its work description ends it
    ("[E616 13:41:10.909476913 ProcessGroupNCCL.cpp:565] [Rank 1] Watchdog caught collective operatMERS_CACHE` is "
     "deprecated and will be removed in v5 of Transformion timeout: WorkNCCL(SeqNum=2109, OpType=_ALLGATHER_BASE, "
     "NumelIn=262711296, NumelOut=525422592, Timeout(ms)=1800000) ran for 1800007 milliseconds before timing out.",
     "watchdog-timeout-tail", "watchdog_timeout", "collective_timeout", "victim", "none",
     {"rank": "1", "seq": "2109", "op": "_ALLGATHER_BASE", "numel_in": "262711296", "timeout_ms": "1800000"}),
    ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=BROADCAST, NumelIn=40960, "
     "NumelOut=40960, Timeout(ms)=600000) ran for 600083 milliseconds before timing out.", "watchdog-timeout-v1",
     "watchdog_timeout", "collective_timeout", "victim", "none", {"seq": "7", "op": "BROADCAST", "numel_in": "40960"}),
    ("torch.distributed.DistBackendError: [3] is setting up something new", "distributed-library-exception",
     "exception", "unknown", "victim", "none", {}),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] odd state", "distributed-library-"
     "exception", "exception", "unknown", "victim", "none", {}),
    # Ray's dead-worker report: its list of possible causes names SIGKILL and SIGSEGV without either happening here
    ("ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task. Worker exit type: "
     "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. There "
     "are some potential root causes. (1) The process is killed by SIGKILL by OOM killer due to high memory usage. "
     "(2) ray stop --force is called. (3) The worker is crashed unexpectedly due to SIGSEGV or other unexpected "
     "errors.",
     "ray-worker-died", "peer_lost", "unknown", "victim", "peer", {"code": "2", "reason": "End of file"}),
]


def _accuses(sigs, signature: str | None) -> str | None:
    sig = sigs.by_id(signature or "")
    return sig.accuses if sig else None


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize(("line", "sig_id", "kind", "cause", "role", "accuses", "fields"), FAMILIES,
                         ids=[f[1] + f"-{i}" for i, f in enumerate(FAMILIES)])
def test_family_line_is_the_expected_event(tmp_path: Path, sigs, prefix: str, line: str, sig_id: str, kind: str,
                                           cause: str, role: str, accuses: str, fields: dict) -> None:
    # (progress after it would say a process went on after an exception: analyzer/went_on.toml)
    events = scan_text(tmp_path, sigs, "step 1 | loss 2.3\n" + prefix + line + "\nwaiting for the other ranks\n")
    assert len(events) == 1, [(e.signature, e.text) for e in events]
    e = events[0]
    assert (e.signature, e.kind, e.cause, e.role, _accuses(sigs, e.signature)) == (sig_id, kind, cause, role, accuses)
    assert e.line == 2
    for key, value in fields.items():
        assert e.get(key) == value, (key, dict(e.fields))


# (line, signature, kind, fields): facts, never failures (no role, no cause)
FACTS = [
    # c10d retrying a refused connect (nothing listening yet): a start-up fact, never a failure of its own
    ("[W socket.cpp:663] [c10d] The client socket has failed to connect to [lab-n01]:29500 (errno: 111 - Connection "
     "refused).", "client-connect-retry-refused", "connect_retry", {"store_host": "[lab-n01]", "port": "29500"}),
    # a connect attempt that got no answer in time, retried: a start-up fact too (the connect's deadline decides)
    ("[W1031 20:51:17.466244000 socket.cpp:755] [c10d] The server socket on [::ffff:10.4.6.125]:63617 has timed out, "
     "will retry.", "client-connect-retry-timeout", "connect_retry", {"store_host": "[::ffff:10.4.6.125]",
                                                                     "port": "63617"}),
    # c10d trying the store's name per address family: localhost's ::1 refused (no IPv6 loopback), no AAAA record
    ("[W socket.cpp:558] [c10d] The client socket has failed to connect to [localhost]:29500 (errno: 99 - Cannot "
     "assign requested address).", "client-connect-loopback-address-family", "connect_retry", {"port": "29500"}),
    ("[W508 08:47:31.204189023 socket.cpp:697] [c10d] The IPv6 network addresses of (gpu-a00, 29500) cannot be "
     "retrieved (gai error: -2 - Name or service not known).", "client-ipv6-lookup-failed", "connect_retry",
     {"store_host": "gpu-a00", "port": "29500"}),
    # launchers that number ranks themselves announce each process's (Lightning/Fabric >= 1.6, PL < 1.6)
    ("Initializing distributed: GLOBAL_RANK: 3, MEMBER: 4/8", "launcher-rank-announce", "rank_announce",
     {"global_rank": "3", "member": "4", "world_size": "8"}),
    ("initializing ddp: GLOBAL_RANK: 0, MEMBER: 1/16", "launcher-rank-announce", "rank_announce",
     {"global_rank": "0", "world_size": "16"}),
    (H + "NCCL INFO Bootstrap : Using lo:127.0.0.1<0>", "nccl-interface-pick", "interface",
     {"via": "Bootstrap", "ifname": "lo", "ip": "127.0.0.1", "scope": "loopback"}),
    (H + "NCCL INFO Bootstrap: Using eth0:1:10.3.1.7<0>", "nccl-interface-pick", "interface",
     {"ifname": "eth0:1", "ip": "10.3.1.7", "scope": "global"}),
    (H + "NCCL INFO NET : Using interface docker0:172.17.0.1<0>", "nccl-interface-pick", "interface",
     {"via": "NET", "ifname": "docker0", "scope": "bridge"}),
    (H + "NCCL INFO NET/Socket : Using [0]ib0:fe80::1e34:da03:5c:7a80%ib0<0> [1]eth0:10.3.1.7<0>",
     "nccl-interface-pick", "interface",
     {"via": "NET/Socket", "ifname": "ib0", "scope": "link_local", "ifnames": "ib0,eth0",
      "scopes": "link_local,global"}),
    (H + "NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB ib0:10.40.0.1<0>", "nccl-interface-pick",
     "interface", {"via": "NET/IB", "ifname": "ib0", "ip": "10.40.0.1"}),
    (H + "NCCL INFO NET/Socket : 3 interfaces found", "nccl-interface-count", "interface", {"ifcount": "3"}),
    (H + "NCCL INFO NCCL_SOCKET_IFNAME set by environment to ^docker,lo", "nccl-interface-requested", "interface",
     {"requested": "^docker,lo"}),
    (H + "NCCL INFO comm 0x5581c0 rank 5 nranks 16 cudaDev 2 busId 41000 - Destroy COMPLETE", "nccl-rank-map-comm",
     "nccl_rank_map", {"nccl_rank": "5", "nranks": "16"}),
    (H + "NCCL INFO comm 0x5581c0 rank 5 nRanks 16 nNodes 2 localRanks 8 localRank 5 MNNVL 0", "nccl-rank-map-comm",
     "nccl_rank_map", {"nccl_rank": "5", "nranks": "16"}),
    (H + "NCCL INFO Trees [0] 6/-1/-1->5->4 [1] 6/-1/-1->5->4", "nccl-rank-map-tree", "nccl_rank_map",
     {"nccl_rank": "5"}),
    (H + "NCCL INFO Channel 00/1 : 5[2] -> 13[2] [send] via NET/IB/2(1)/GDRDMA", "nccl-rank-map-channel",
     "nccl_rank_map", {"nccl_rank": "5", "channel_peer": "13"}),
    (H + "NCCL INFO Channel 00/0 : 13[2] -> 5[2] [receive] via NET/IB/2", "nccl-rank-map-channel", "nccl_rank_map",
     {"nccl_rank": "5", "channel_peer": "13"}),
    ("  Rank 9 has launched up to operation 1199 -- GPU 1 managed by process 5120 on node gpu-b03", "nccl-ras-rank",
     "ras_report", {"ras_rank": "9", "op_count": "1199", "pid": "5120", "node": "gpu-b03"}),
    ("  Rank 9 has not launched any operations -- GPU 1 managed by process 5120 on node gpu-b03", "nccl-ras-rank",
     "ras_report", {"no_ops": "not", "node": "gpu-b03"}),
    ("  Rank 10 -- GPU 2 managed by process 5121 on node gpu-b03", "nccl-ras-rank", "ras_report",
     {"ras_rank": "10", "pid": "5121"}),
    ("  15 ranks have launched up to operation 1200", "nccl-ras-group", "ras_report",
     {"count": "15", "op_count": "1200"}),
    ("#0-0 (9a1f2b3c4d5e6f70) ERROR", "nccl-ras-group", "ras_report", {"section": "ERROR"}),
    ("  Process 5120 on node gpu-b03 managing GPU 1", "nccl-ras-group", "ras_report",
     {"pid": "5120", "node": "gpu-b03"}),
]


@pytest.mark.parametrize(("line", "sig_id", "kind", "fields"), FACTS, ids=[f[1] + f"-{i}" for i, f in enumerate(FACTS)])
def test_fact_line_is_an_event_without_role(tmp_path: Path, sigs, line: str, sig_id: str, kind: str,
                                            fields: dict) -> None:
    events = scan_text(tmp_path, sigs, line + "\n")
    assert [(e.signature, e.kind, e.role, e.cause) for e in events] == [(sig_id, kind, None, None)]
    for key, value in fields.items():
        assert events[0].get(key) == value, (key, dict(events[0].fields))


def test_rank_map_lines_give_the_nccl_process_its_pid(tmp_path: Path, sigs) -> None:
    events = scan_text(tmp_path, sigs, "".join(H + f"NCCL INFO Channel {c:02d}/0 : 5[2] -> 6[3] [send] via NET/IB/0\n"
                                               for c in range(32)))
    assert [(e.host, e.pid, e.get("nccl_rank")) for e in events] == [("gpu-a07", 31337, "5")]  # once, not 32 times


BENIGN = [
    # IB async events that are news, not errors (libibverbs' names)
    H + "transport/net_ib.cc:101 NCCL WARN NET/IB : mlx5_0:1 Got async event : GID table change",
    H + "NCCL WARN NET/IB : mlx5_2:1 Got non-fatal async event: client reregistration",
    H + "NCCL WARN Failed to open libibverbs.so[.1]",
    H + "NCCL INFO Failed to open libibverbs.so[.1]",
    H + "misc/utils.cc:60 NCCL WARN Could not find real path of /sys/class/net/eth0/device",
    H + "NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory No "
    "plugin found (libnccl-net.so), using internal implementation",
    H + "NCCL INFO NET/Plugin : Plugin load returned 2 : libnccl-net.so: cannot open shared object file: No such file "
    "or directory.",
    H + "NCCL INFO NET/Plugin: Failed to find ncclNetPlugin_v7 symbol.",
    H + "transport/net_socket.cc:353 NCCL WARN NET/Socket : NCCL_SOCKET_NTHREADS is greater than the maximum allowed, "
    "setting to 16",
    H + "NCCL WARN Ignoring SHM locality, must be 1 (sender side) or 2 (receiver side, default)",
    H + "NCCL WARN NCCL_DEVICE_UNPACK plugin has incompatible version 1, this NCCL build is compatible with 2, not "
    "using it",
    H + "NCCL INFO HINT: In many cases this error occurs when the NCCL_IB_TIMEOUT is set too short.",
    H + "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
    H + "NCCL INFO Channel 00/02 :    0   1   2   3   4   5   6   7",
    H + "NCCL INFO Ring 03 : 4 -> 5 -> 6",  # NCCL_DEBUG_SUBSYS=GRAPH only: not worth an anchor
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:609 (most recent call "
    "first):",
    "ValueError: Default process group has not been initialized, please make sure to call init_process_group.",
]


@pytest.mark.parametrize("line", BENIGN)
def test_benign_line_is_never_a_failure(tmp_path: Path, sigs, line: str) -> None:
    events = scan_text(tmp_path, sigs, line + "\n")
    failures = [(e.signature, e.cause) for e in events if e.role is not None]
    if line.startswith("ValueError"):  # the user's own bug: still user code, never a distributed victim
        assert failures == [("python-exception", "user_code_exception")]
    else:
        assert failures == []


LAST_ERROR = """\
Traceback (most recent call last):
  File "train.py", line 20, in main
    dist.all_reduce(t)
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, \
unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3
ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. {tail}
Last error:
{reason}
"""


@pytest.mark.parametrize(("reason", "signature", "cause", "role"), [
    ("socketStartConnect: Connect to 10.3.1.2<43521> failed : Connection refused", "nccl-connect-refused",
     "network_unreachable", "either"),
    ("socketProgress: Connection closed by remote peer gpu-a08<38211>", "nccl-remote-closed", "unknown", "victim"),
    ("Error: failed to extend /dev/shm/nccl-Fj2kq1 to 9637892 bytes", "nccl-shm-segment", "shm_error", "culprit"),
    ("NET/IB : Got completion from peer 10.3.1.2<59422> with error 12, opcode 0, len 0, vendor err 129",
     "nccl-ib-completion-error", "infiniband_error", "culprit"),
])
@pytest.mark.parametrize("prefix", ["", "[rank2]:"])
def test_last_error_line_decides_what_the_nccl_error_was(tmp_path: Path, sigs, prefix: str, reason: str,
                                                         signature: str, cause: str, role: str) -> None:
    text = LAST_ERROR.format(reason=reason, tail="It can be also caused by unexpected exit of a remote peer.")
    events = scan_text(tmp_path, sigs, "".join(prefix + line + "\n" for line in text.splitlines()))
    assert events and all((e.signature, e.cause, e.role) == (signature, cause, role) for e in events), \
        [(e.line, e.signature, e.cause) for e in events]
    assert all(e.get("last_error") == reason for e in events)


def test_last_error_without_a_known_reason_keeps_the_generic_cause_and_the_reason(tmp_path: Path, sigs) -> None:
    events = scan_text(tmp_path, sigs, LAST_ERROR.format(reason="ncclFoo: something new", tail=""))
    assert {(e.cause, e.get("last_error")) for e in events} == {("nccl_internal_error", "ncclFoo: something new")}


def test_last_error_reason_of_one_rank_is_not_taken_from_another(tmp_path: Path, sigs) -> None:
    text = ("[rank2]:RuntimeError: NCCL error: unhandled system error, NCCL version 2.18.1\n[rank2]:Last error:\n"
            "[rank5]:socketProgress: Connection closed by remote peer gpu-a08<38211>\n"
            "[rank2]:Call to posix_fallocate failed : No space left on device\n")
    events = scan_text(tmp_path, sigs, text)
    by_rank = {e.rank: (e.cause, e.get("last_error")) for e in events}
    assert by_rank[2] == ("shm_error", "Call to posix_fallocate failed : No space left on device")
    assert by_rank[5][0] == "unknown"


ASYNC_REMOTE = ("{p}[E415 21:17:08.996319560 ProcessGroupNCCL.cpp:552] [Rank {r}] Collective WorkNCCL(SeqNum=335, "
                "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) raised the following async exception: "
                "NCCL error: remote process exited or there was a network error, NCCL version 2.21.5\n"
                "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
                "prematurely.\nLast error:\nsocketProgress: Connection closed by remote peer {host}<32926>\n"
                "Exception raised from checkForNCCLErrorsInternal at ProcessGroupNCCL.cpp:2363 (most recent call "
                "first):\n")


@pytest.mark.parametrize(("rank", "host"), [(1, "ip-172-31-45-209.ec2.internal"), (6, "gpu-b17")])
def test_the_unprefixed_lines_of_a_prefixed_nccl_error_message_are_its_ranks(tmp_path: Path, sigs, rank: int,
                                                                            host: str) -> None:
    """torch prefixes a message's first line only (`[rankR]:`): the `ncclRemoteError:` line, `Last error:` and
    NCCL's reason after it are the same rank's, and the peer it lost is named."""
    events = scan_text(tmp_path, sigs, "step 9\n" + ASYNC_REMOTE.format(p=f"[rank{rank}]:", r=rank, host=host))
    assert {e.rank for e in events} == {rank}
    assert [e.get("peer_host") for e in events if e.get("peer_host")] == [host]
    log = tmp_path / "console.log"
    log.write_text(ASYNC_REMOTE.format(p=f"[rank{rank}]:", r=rank, host=host))
    got = analyze_paths([log]).to_dict()
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == ("unknown", None, host)


def test_an_unprefixed_line_that_does_not_continue_the_message_is_not_the_ranks(tmp_path: Path, sigs) -> None:
    text = ("[rank3]:RuntimeError: NCCL error: remote process exited or there was a network error, NCCL version "
            "2.21.5\nstep 10 | loss 2.1\nncclRemoteError: A call failed possibly due to a network error.\n")
    events = scan_text(tmp_path, sigs, text)
    assert sorted((e.line, e.rank) for e in events) == [(1, 3), (3, None)]


WRAPPED = "[rank3]:[E1120 10:00:00.1 ProcessGroupNCCL.cpp:1] [PG 0 Rank 3] Exception (either an error or timeout) \
detected by watchdog at work: 15, last enqueued NCCL work: 15, last\ncompleted NCCL work: 14.\n"


def test_watchdog_head_wrapped_over_two_lines_is_read_whole(tmp_path: Path, sigs) -> None:
    events = scan_text(tmp_path, sigs, "noise\n" + WRAPPED + "more noise\n")
    assert [(e.line, e.kind, e.rank, e.get("seq"), e.get("last_completed")) for e in events] == \
        [(2, "watchdog_timeout", 3, "15", "14")]


def test_many_ranks_wrapped_heads_in_one_log_are_each_read_whole_beside_other_failures(tmp_path: Path,
                                                                                        sigs) -> None:
    """A merged log of many ranks whose watchdog heads a collector wrapped: each head joins its own next line, and
    the other failures around them (an OOM, a traceback of another rank) stay as they were."""
    blocks = []
    for r in range(40):
        blocks.append(WRAPPED.replace("rank3", f"rank{r}").replace("Rank 3", f"Rank {r}"))
        if r % 10 == 4:
            blocks.append(f"[rank{100 + r}]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
        if r % 10 == 7:
            blocks.append(f'[rank{200 + r}]:Traceback (most recent call last):\n[rank{200 + r}]:  File "t.py", line 1\n'
                          f"[rank{200 + r}]:ValueError: bad\n")
    events = scan_text(tmp_path, sigs, "".join(blocks))
    heads = [(e.rank, e.get("last_completed")) for e in events if e.kind == "watchdog_timeout"]
    assert heads == [(r, "14") for r in range(40)]
    assert sorted(e.rank for e in events if e.cause == "cuda_oom") == [104, 114, 124, 134]
    assert sorted(e.rank for e in events if e.kind == "exception" and e.cause != "cuda_oom") == [207, 217, 227, 237]


SPAWN = """\
Traceback (most recent call last):
  File "train.py", line 30, in <module>
    mp.spawn(main, nprocs=4)
  File "/opt/conda/lib/python3.10/site-packages/torch/multiprocessing/spawn.py", line 158, in join
    raise ProcessRaisedException(msg, error_index, failed_process.pid)
torch.multiprocessing.spawn.ProcessRaisedException: {blank}

-- Process 2 terminated with the following error:
Traceback (most recent call last):
  File "/opt/conda/lib/python3.10/site-packages/torch/multiprocessing/spawn.py", line 69, in _wrap
    fn(i, *args)
  File "train.py", line 21, in main
    loss = model(batch)
{inner}
"""
SUBMITIT = """\
Traceback (most recent call last):
  File "launch.py", line 12, in <module>
    job.result()
  File "/opt/conda/lib/python3.10/site-packages/submitit/core/core.py", line 266, in result
    raise job_exception  # pylint: disable=raising-bad-type
submitit.core.utils.FailedJobError: Job (task=3) failed during processing with trace:
----------------------
Traceback (most recent call last):
  File "/opt/conda/lib/python3.10/site-packages/submitit/core/submission.py", line 55, in process_job
    result = delayed.result()
  File "train.py", line 21, in main
    loss = model(batch)
{inner}

----------------------
You can check full logs with 'job.stderr(3)' and 'job.stdout(3)'or at paths:
"""


@pytest.mark.parametrize(("template", "wrapper", "process"), [(SPAWN, "ProcessRaisedException", "2"),
                                                              (SUBMITIT, "FailedJobError", "3")])
@pytest.mark.parametrize(("inner", "cause"), [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "cuda_oom"),
    ("KeyError: 'label'", "user_code_exception"),
    ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, invalid usage, NCCL version "
     "2.14.3", "nccl_internal_error"),
])
def test_wrapper_exception_reports_the_nested_one(tmp_path: Path, sigs, template: str, wrapper: str, process: str,
                                                  inner: str, cause: str) -> None:
    events = scan_text(tmp_path, sigs, template.format(inner=inner, blank=""))
    assert [(e.text, e.cause, e.get("wrapped_by"), e.get("wrapped_process")) for e in events] == \
        [(inner, cause, wrapper, process)]


def test_wrapper_alone_is_not_user_code(tmp_path: Path, sigs) -> None:
    events = scan_text(tmp_path, sigs, "torch.multiprocessing.spawn.ProcessRaisedException: \n\nstep 10\n")
    assert [(e.signature, e.cause) for e in events] == [("launcher-wrapper-exception", "unknown")]


@pytest.mark.parametrize(("body", "rank"), [
    ("[E1120 10:00:00.1 ProcessGroupNCCL.cpp:1] [Rank 4] Some NCCL operations have failed or timed out.", 4),
    ("[PG 0 (default_pg) Rank 12] ProcessGroupNCCL's watchdog got stuck for 480 seconds", 12),
    ("[PG ID 0 PG GUID 0(default_pg) Rank 7] Process group watchdog thread terminated with exception: x", 7),
    ("no tag here [Rankings 3]", None),
])
def test_rank_tag_inside_a_glog_body(body: str, rank: int | None) -> None:
    assert body_rank(body) == rank


def test_glog_rank_tag_names_the_rank_of_an_unranked_line(tmp_path: Path, sigs) -> None:
    events = scan_text(tmp_path, sigs, "[E1120 10:00:00.1 ProcessGroupNCCL.cpp:1] [PG ID 0 PG GUID 0(default_pg) "
                                       "Rank 7] ProcessGroupNCCL's watchdog got stuck for 480 seconds\n")
    assert [(e.kind, e.rank) for e in events] == [("hang", 7)]


@pytest.mark.parametrize(("line", "rank", "host", "text"), [
    ("(RayTrainWorker pid=77, ip=10.0.0.7) [rank3]: boom", 3, "10.0.0.7", "boom"),
    ("(pid=77) boom", None, None, "boom"),
    ("[job-7f2] INFO [rank5]: boom", 5, "job-7f2", "boom"),
    ("2024-05-08 10:00:01 | trainer | [rank12]: boom", 12, None, "boom"),
    ("[rank" + "9" * 40 + "]: boom", None, None, "[rank" + "9" * 40 + "]: boom"),
])
def test_unknown_tags_before_a_rank_prefix(line: str, rank: int | None, host: str | None, text: str) -> None:
    p = strip_prefixes(line)
    assert (p.rank, p.host, p.text) == (rank, host, text)


@pytest.mark.parametrize(("ifname", "ip", "scope"), [
    ("lo", "127.0.0.1", "loopback"), ("eth0", "::1", "loopback"), ("ib0", "fe80::1%ib0", "link_local"),
    ("eth1", "169.254.3.1", "link_local"), ("docker0", "172.17.0.1", "bridge"), ("virbr0", "192.168.122.1", "bridge"),
    ("cni0", "10.244.0.1", "bridge"), ("eth0", "10.3.1.7", "global"), ("ib0", "2001:db8::7", "global"),
])
def test_interface_scope(ifname: str, ip: str, scope: str) -> None:
    assert interface_scope(ifname, ip) == scope


#: NCCL's listing as the interface pattern read it before names were taken only from the start of a word
_ANYWHERE = re.compile(r"(?:\[\d+\])?(?P<ifname>[\w.@-]+(?::\d+)?):(?P<ip>[0-9a-fA-F.:]+(?:%[\w.-]+)?)<\d+>")


#: one listing entry: an index, a name (maybe an alias), an address (maybe scoped), a port, each part maybe missing
_ENTRY = st.builds("{}{}{}:{}{}{}".format, st.sampled_from(["", "[0]", "[12]", "["]),
                   st.sampled_from(["eth0", "ib0", "x@y", "a.b-c", "e", ""]), st.sampled_from(["", ":1", ":"]),
                   st.sampled_from(["10.0.0.1", "fe80::1", "ab", "", "1"]), st.sampled_from(["", "%ib0", "%"]),
                   st.sampled_from(["<0>", "<>", ""]))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["", " ", ":", "x", "]", "; OOB ", "Using "]), _ENTRY), max_size=6))
def test_interface_names_start_where_a_word_does_and_nothing_is_lost(parts: list[tuple[str, str]]) -> None:
    """The listing NCCL prints after `; OOB` (NET/IB), else after `Using `: every entry there, none before."""
    body = "".join(sep + entry for sep, entry in parts)
    tail = body.split("; OOB", 1)[1] if "; OOB" in body else body[body.find("Using "):] if "Using " in body else body
    assert interface_list(body) == [(m["ifname"], m["ip"]) for m in _ANYWHERE.finditer(tail)]


def test_elastic_block_with_huge_numbers_does_not_raise(tmp_path: Path, sigs) -> None:
    big = "9" * 5000
    text = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n" + "=" * 40 + "\ntrain.py FAILED\n"
            + "-" * 40 + f"\nRoot Cause (first observed failure):\n[0]:\n  time      : 2024-01-01_10:00:00\n"
            f"  host      : node1\n  rank      : {big} (local_rank: {big})\n  exitcode  : 1 (pid: {big})\n"
            "  error_file: <N/A>\n  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n"
            + "=" * 40 + "\n")
    events = scan_text(tmp_path, sigs, text)
    root = [e for e in events if e.kind == "elastic_failure"]
    assert [(e.rank, e.local_rank, e.pid) for e in root] == [(None, None, None)]


ROOT_CAUSE_ENTRY = ["Root Cause (first observed failure):", "[0]:", "  time      : 2022-02-26_22:02:07",
                    "  host      : gpu-node-39", "  rank      : {rank} (local_rank: 0)",
                    "  exitcode  : 1 (pid: 181845)", "  error_file: /tmp/torchelastic_x/none_y/attempt_0/0/error.json",
                    "  traceback : Traceback (most recent call last):",
                    '    File "/env/lib/python3.8/site-packages/torch/distributed/elastic/multiprocessing/errors/'
                    '__init__.py", line 345, in wrapper', "      return f(*args, **kwargs)",
                    '    File "/work/pretrain_gpt.py", line 241, in main', "      die",
                    "  NameError: name 'die' is not defined", "  ", "=" * 60]


@pytest.mark.parametrize("rank", [0, 7, 304])
@pytest.mark.parametrize("head", [True, False])
def test_elastic_root_cause_with_its_childs_traceback_names_the_exception(tmp_path: Path, sigs, rank: int,
                                                                           head: bool) -> None:
    """torch writes the child's traceback (its error file) into `traceback :` with every newline followed by two
    spaces: the exception line is the one at two. A paste that starts at `Root Cause` (no ChildFailedError, no
    `Failures:` above it) is read as the block it is."""
    above = ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "=" * 60,
             "pretrain_gpt.py FAILED", "-" * 60, "Failures:", "  <NO_OTHER_FAILURES>", "-" * 60] if head else ["-" * 60]
    text = "\n".join([*above, *ROOT_CAUSE_ENTRY]).format(rank=rank) + "\n"
    roots = [e for e in scan_text(tmp_path, sigs, text) if e.kind == "elastic_failure"]
    assert [(e.rank, e.host, e.text) for e in roots] == [(rank, "gpu-node-39", "NameError: name 'die' is not defined")]
    (tmp_path / "console.log").write_text(text)
    d = analyze_paths([tmp_path / "console.log"])
    assert (d.cause, d.first_failing_rank, d.first_failing_host) == ("user_code_exception", rank, "gpu-node-39")


def test_root_cause_words_in_a_script_line_start_no_block(tmp_path: Path, sigs) -> None:
    """Only torchelastic's header starts a block: the words elsewhere in a line do not swallow what follows."""
    text = "print: Root Cause (first observed failure): see below\n" + "\n".join(
        ["Traceback (most recent call last):", '  File "t.py", line 1', "ValueError: mine"]) + "\n"
    events = scan_text(tmp_path, sigs, text)
    assert [(e.kind, e.text) for e in events] == [("exception", "ValueError: mine")]


DS_HEAD = "[2024-02-06 06:23:39,510] [ERROR] [launch.py:321:sigkill_handler] ['/env/bin/python', '-u', 'train.py', "


@pytest.mark.parametrize("local", [0, 5, 13])
@pytest.mark.parametrize("code", ["-9", "1", "-6"])
def test_deepspeed_launcher_report_hard_wrapped_before_its_exit_code(tmp_path: Path, sigs, local: int,
                                                                     code: str) -> None:
    """A terminal or a paste wraps the launcher's long command line: the exit code on the next line is its own."""
    text = f"noise\n{DS_HEAD}'--local_rank={local}', '--lr',\n '2e-3'] exits with return code = {code}\nafter\n"
    events = [e for e in scan_text(tmp_path, sigs, text) if e.kind == "agent_failed"]
    named = (0, None) if local == 0 else (None, str(local))  # the last worker spawned's, not the failed one's
    assert [(e.line, (e.local_rank, e.get("last_local_rank")), e.get("exitcode")) for e in events] == \
        [(2, named, code)]


@pytest.mark.parametrize(("local", "named"), [(0, True), (3, False), (12, False)])
def test_deepspeed_launcher_report_names_the_worker_only_when_it_was_the_only_one(tmp_path: Path, sigs,
                                                                                  local: int, named: bool) -> None:
    """DeepSpeed's sigkill_handler prints the spawn loop's last command: '--local_rank=N' is the node's highest local
    rank, whichever worker failed; 0 means one worker, the failed one. Cut before its code, it names no cause. One
    worker on the node is not one node: no world size is stated, so the local rank names no global rank."""
    (tmp_path / "train.log").write_text(f"{DS_HEAD}'--local_rank={local}', '--deepspeed', 'ds.json', '--bf16\n")
    d = analyze_paths([tmp_path])
    assert (d.cause, d.first_failing_rank) == ("unknown", None)
    assert any("local rank 0 " in note for note in d.notes) is named, d.notes


@pytest.mark.parametrize("failed", [0, 1, 2])
def test_deepspeed_launcher_report_leaves_the_rank_to_the_workers_own_traceback(tmp_path: Path, failed: int) -> None:
    """Three workers, the launcher printing the last one's command (local rank 2) with the failed one's code: the
    rank comes from the worker's own traceback; without it, the exit code tells the cause and no rank is named."""
    spawned = "".join(f"[2024-02-06 06:23:30,1{i}0] [INFO] [launch.py:256:main] process {40 + i} spawned with "
                      f"command: ['/env/bin/python', '-u', 'train.py', '--local_rank={i}']\n" for i in range(3))
    trace = (f"[rank{failed}]: Traceback (most recent call last):\n[rank{failed}]:   File \"train.py\", line 12\n"
             f"[rank{failed}]: ValueError: bad batch\n")
    report = (f"[2024-02-06 06:23:39,500] [INFO] [launch.py:315:sigkill_handler] Killing subprocess 40\n"
              f"{DS_HEAD}'--local_rank=2'] exits with return code = {{code}}\n")
    (tmp_path / "train.log").write_text(spawned + trace + report.format(code=1))
    d = analyze_paths([tmp_path])
    assert (d.cause, d.first_failing_rank) == ("user_code_exception", failed)
    (tmp_path / "train.log").write_text(spawned + report.format(code=-11))
    d = analyze_paths([tmp_path])
    assert (d.cause, d.first_failing_rank) == ("segfault", None)


def test_traceback_header_mid_line_leaves_the_text_before_it_a_line(tmp_path: Path, sigs) -> None:
    """A paste that lost its newlines: the agent's report before a `Traceback` header is still read."""
    line = ("WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 11 closing signal SIGTERM "
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 2 (pid: 12) of "
            "binary: /env/bin/python Traceback (most recent call last): File \"/env/bin/torchrun\", line 8\n")
    events = [e for e in scan_text(tmp_path, sigs, line) if e.kind == "agent_failed"]
    assert [(e.local_rank, e.pid, e.get("exitcode")) for e in events] == [(2, 12, "-9")]
    header_first = scan_text(
        tmp_path, sigs, 'Traceback (most recent call last):\n  File "t.py", line 1\nValueError: a\n')
    assert [(e.kind, e.line) for e in header_first] == [("exception", 3)]


@pytest.mark.parametrize("prefix", ["", "[rank6]: "])
def test_chained_traceback_cut_before_its_final_line_reports_the_exception_before_the_cut(tmp_path: Path, sigs,
                                                                                          prefix: str) -> None:
    """A paste or a dead process's log ends inside the chain's next traceback: its earlier exception stands."""
    chain = ["Traceback (most recent call last):", '  File "loader.py", line 9, in get',
             "RuntimeError: DataLoader worker (pid 91) is killed by signal: Killed. ", "",
             "The above exception was the direct cause of the following exception:", "",
             "Traceback (most recent call last):", '  File "train.py", line 141, in <module>']
    events = scan_text(tmp_path, sigs, "".join(f"{prefix}{line}\n" for line in chain))
    assert [(e.signature, e.line, e.get("exc_type") or e.cause) for e in events] == \
        [("dataloader-worker-killed", 3, "dataloader_worker_killed")]
    finished = [*chain[:-1], '  File "train.py", line 141, in <module>', "ValueError: the final one"]
    events = scan_text(tmp_path, sigs, "".join(f"{prefix}{line}\n" for line in finished))
    assert [e.line for e in events] == [9]  # a complete chain reports its final exception, as before


@pytest.mark.parametrize("line", [
    "srun: error: gpu-a07: task 3: Exited with exit code 2",
    "slurmstepd: error: *** STEP 12.0 ON gpu-a07 CANCELLED AT 2024-05-08T08:47:31 ***",
    "train.py: error: loss is nan at step 12",  # the script's own wording, not argparse's
    "ERROR: argument --lr: invalid float value",  # no program name before it
])
def test_error_lines_that_are_not_argparse_are_not_read_as_a_usage_error(tmp_path: Path, sigs, line: str) -> None:
    assert "argparse-usage-error" not in {e.signature for e in scan_text(tmp_path, sigs, line + "\n")}


def test_every_rank_refusing_its_arguments_is_the_scripts_fault_and_no_single_rank(tmp_path: Path) -> None:
    usage = "usage: train.py [-h] [--lr LR]\ntrain.py: error: unrecognized arguments: --json\n"
    for rank in (0, 1):
        (tmp_path / f"77_{rank}_log.err").write_text(usage)
    diagnosis = analyze_paths([tmp_path])
    assert (diagnosis.cause, diagnosis.first_failing_rank, diagnosis.retry) == ("user_code_exception", None, "stop")


def test_repeated_channel_lines_are_skipped_but_every_rank_map_is_kept(tmp_path: Path, sigs) -> None:
    """NCCL prints a channel line per channel and peer; repeats of (head, NCCL rank) are skipped before decoding,
    and a second communicator where the same process has another rank still gives its own rank-map fact."""
    head = "gpu-a07:31337:31400 [2] NCCL INFO "
    lines = [head + f"Channel {c:02d}/0 : 5[2] -> {peer}[0] [send] via NET/IB/0/GDRDMA" for c in range(8)
             for peer in (6, 7)]
    lines += [head + f"Channel {c:02d}/0 : {peer}[0] -> 5[2] [receive] via NET/IB/0/GDRDMA" for c in range(8)
              for peer in (3, 4)]
    lines += [head + f"Channel {c:02d}/0 : 2[2] -> 3[0] [send] via NET/IB/0/GDRDMA" for c in range(4)]  # comm 2
    events = scan_text(tmp_path, sigs, "\n".join(lines) + "\n")
    maps = sorted((e.pid, e.get("nccl_rank")) for e in events if e.kind == "nccl_rank_map")
    assert maps == [(31337, "2"), (31337, "5")]


def test_a_channel_line_inside_a_traceback_is_read_as_part_of_it(tmp_path: Path, sigs) -> None:
    head = "gpu-a07:31337:31400 [2] NCCL INFO Channel 00/0 : 5[2] -> 6[0] [send] via NET/IB/0/GDRDMA"
    text = "\n".join([head, "Traceback (most recent call last):", '  File "train.py", line 3, in <module>', head,
                      "ValueError: bad batch"]) + "\n"
    events = scan_text(tmp_path, sigs, text)
    assert [e.signature for e in events if e.role is not None] == ["python-exception"]


LAST_ERROR_REASONS = [("Call to posix_fallocate failed : No space left on device", "shm_error"),
                      ("socketStartConnect: Connect to 10.0.0.7<41233> failed : Connection refused",
                       "network_unreachable")]


@settings(max_examples=25, deadline=None)
@given(count=st.sampled_from([2, 3, 17, 90]), seed=st.integers(0, 1000), label=st.sampled_from(["{r}: ",
                                                                                               "[rank{r}]:"]))
def test_each_rank_of_an_interleaved_log_gets_its_own_last_error_reason(tmp_path_factory, sigs, count: int,
                                                                        seed: int, label: str) -> None:
    """Ranks of a merged log print torch's generic NCCL error, `Last error:` and NCCL's reason at once, their lines
    interleaved in any order (each rank's own lines in order): every rank's error is explained by its own reason,
    never by a neighbour's."""
    import random

    rng = random.Random(seed)
    ranks = rng.sample(range(100_000), count)
    reason = {r: LAST_ERROR_REASONS[rng.randrange(2)] for r in ranks}
    queues = {r: [f"{label.format(r=r)}{line}\n" for line in (
        "RuntimeError: NCCL error: unhandled system error, NCCL version 2.18.1", "Last error:", reason[r][0])]
        for r in ranks}
    lines = []
    while queues:
        r = rng.choice(sorted(queues))
        lines.append(queues[r].pop(0))
        if not queues[r]:
            del queues[r]
    events = scan_text(tmp_path_factory.mktemp("log"), sigs, "".join(lines))
    got = {e.rank: (e.cause, e.get("last_error")) for e in events if e.kind != "interface"}
    assert got == {r: (reason[r][1], reason[r][0]) for r in ranks}


@pytest.mark.parametrize("faulty", [1, 6])
@pytest.mark.parametrize("error", ["unspecified launch failure", "an illegal memory access was encountered"])
def test_watchdog_terminated_by_a_cuda_error_is_that_ranks_own_failure(tmp_path: Path, faulty: int, error: str) -> None:
    """torch's NCCL watchdog that dies of a CUDA error found it in its own rank's context (a sticky kernel fault):
    that rank is the culprit; the others' watchdogs time out waiting for it."""
    timeout = ("[rank{r}]:[E808 10:41:07.406255799 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
               "operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
               "ran for 600021 milliseconds before timing out.\n")
    fault = (f"[rank{faulty}]:[E808 10:31:07.406255799 ProcessGroupNCCL.cpp:1895] [PG ID 1 PG GUID 1 Rank {faulty}] "
             f"Process group watchdog thread terminated with exception: CUDA error: {error}\n")
    lines = [fault if r == faulty else timeout.format(r=r) for r in range(8)]
    (tmp_path / "slurm-9.out").write_text("".join(lines))
    d = analyze_paths([tmp_path])
    assert (d.cause, d.first_failing_rank) == ("user_code_exception", faulty)


def _desync_job(tmp_path: Path, verdict: str, reporters: tuple[int, ...] = (0,)) -> Path:
    """A job whose watchdogs time out on `reporters`, each printing torch's desync report with `verdict` (the
    report's own lines carry no prefix: they continue the rank's error message), the other ranks silent."""
    lines = []
    for r in reporters:
        lines += [f"[rank{r}]:[E515 18:36:47.341808597 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught collective "
                  "operation timeout: WorkNCCL(SeqNum=241, OpType=ALLREDUCE, NumelIn=6, NumelOut=6, Timeout(ms)=600000)"
                  " ran for 600086 milliseconds before timing out.",
                  f"[rank{r}]:[E515 18:36:47.343377708 ProcessGroupNCCL.cpp:1937] Rank {r}",
                  f"\t - [{r}] Timeout at collective: ALLREDUCE, #315",
                  "\t - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:",
                  verdict]
    (tmp_path / "slurm-5.out").write_text("\n".join(lines) + "\n")
    return tmp_path


@pytest.mark.parametrize("lagging", [7, 3, 120])
@pytest.mark.parametrize("reporters", [(0,), (1, 2)])
def test_desync_report_names_the_ranks_torch_found_lagging(tmp_path: Path, lagging: int,
                                                           reporters: tuple[int, ...]) -> None:
    """TORCH_NCCL_DESYNC_DEBUG's verdict (c10d TraceUtils.h) names the rank that stopped issuing collectives; the
    reporters are victims. A rank of three digits is not a log viewer's line number."""
    verdict = (f"\t     [{lagging}] finished collective #182, but didn't join collective #183 (count from 1)")
    d = analyze_paths([_desync_job(tmp_path, verdict, reporters)])
    assert (d.cause, d.first_failing_rank) == ("collective_timeout", lagging)


@pytest.mark.parametrize("verdict", [
    "\t   - [0, 1, 2, 3, 4, 5, 6, 7] joined but didn't finish collective #730 (count from 1)",
    "\t - To our best knowledge, ranks [5, 6] are the lagging ranks that caused this timeout. They never joined any "
    "collectives",
])
def test_desync_report_of_the_whole_world_or_of_several_ranks_names_no_single_rank(tmp_path: Path,
                                                                                   verdict: str) -> None:
    """Every rank stuck in one collective (below torch), or two ranks that never joined: no single rank."""
    d = analyze_paths([_desync_job(tmp_path, verdict)])
    assert (d.cause, d.first_failing_rank) == ("collective_timeout", None)


def test_desync_report_of_ranks_that_never_joined_names_the_one(tmp_path: Path) -> None:
    verdict = ("\t - To our best knowledge, ranks [6] are the lagging ranks that caused this timeout. They never "
               "joined any collectives")
    d = analyze_paths([_desync_job(tmp_path, verdict, (0, 3))])
    assert (d.cause, d.first_failing_rank) == ("collective_timeout", 6)


@pytest.mark.parametrize("bad", [0, 2, 5])
@pytest.mark.parametrize("head", ["RuntimeError: ", ""])
def test_a_checkpoint_one_rank_cannot_load_is_that_ranks_failure(tmp_path: Path, bad: int, head: str) -> None:
    """load_state_dict's refusal on one rank (its message with or without the RuntimeError head) while the others
    wait in the next collective: that rank, the script's own error."""
    for r in range(6):
        if r == bad:
            text = (f"[rank{r}]: Traceback (most recent call last):\n"
                    f"[rank{r}]:   File \"train.py\", line 40, in <module>\n"
                    f"[rank{r}]: {head}Error(s) in loading state_dict for GPT:\n"
                    f"[rank{r}]: \tsize mismatch for wte.weight: copying a param with shape torch.Size([50304, 768]) "
                    "from checkpoint, the shape in current model is torch.Size([50257, 768]).\n")
        else:
            text = (f"[rank{r}]:[E109 22:46:25.933527530 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught "
                    "collective operation timeout: WorkNCCL(SeqNum=3, OpType=BROADCAST, NumelIn=1, NumelOut=1, "
                    "Timeout(ms)=600000) ran for 600044 milliseconds before timing out.\n")
        (tmp_path / f"rank_{r}.log").write_text(text)
    d = analyze_paths([tmp_path])
    assert (d.cause, d.first_failing_rank) == ("user_code_exception", bad)
    assert "checkpoint" in d.summary


GLOO_FULL_MESH = ("[rank{r}]: RuntimeError: Gloo connectFullMesh failed with [/pytorch/third_party/gloo/gloo/transport/"
                  "tcp/pair.cc:152] timed out connecting: SO_ERROR: Connection refused, remote=[{peer}]:{port}")
NCCL_ABORTED = ("{host}:4242:4260 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to {peer}<51577> "
                "failed : Software caused connection abort")


@pytest.mark.parametrize("peer", ["fe80::20d:3aff:fef7:74b3%enP7906s1", "169.254.12.7"])
@pytest.mark.parametrize("template", [GLOO_FULL_MESH, NCCL_ABORTED])
def test_a_peer_at_a_link_local_address_is_a_wrong_interface(tmp_path: Path, peer: str, template: str) -> None:
    """The peer advertised a link-local address (gloo's device, NCCL's bootstrap): no other host reaches it."""
    lines = [template.format(r=r, host=f"node-{r}", peer=peer, port=29510 + r) for r in (1, 3)]
    (tmp_path / "console.log").write_text("\n".join(lines) + "\n")
    d = analyze_paths([tmp_path])
    assert (d.cause, d.first_failing_rank) == ("wrong_interface", None)


@pytest.mark.parametrize("peer", ["127.0.0.1", "127.0.1.1"])
def test_a_peer_at_a_loopback_address_is_a_wrong_interface_only_across_hosts(tmp_path: Path, peer: str) -> None:
    """Loopback is where one host's ranks meet: a refused connect there is a peer gone, unless the job spans
    hosts (then the peer's hostname resolved to loopback: GLOO_SOCKET_IFNAME)."""
    one_host = [f"[rank{r}]: terminate called after throwing an instance of 'gloo::IoException'\n[rank{r}]:   what():  "
                f"[/work/third_party/gloo/gloo/transport/tcp/pair.cc:724] connect [{peer}]:3210: Connection refused"
                for r in (0, 1)]
    (tmp_path / "console.log").write_text("\n".join(one_host) + "\n")
    assert analyze_paths([tmp_path]).cause != "wrong_interface"
    for r, host in ((0, "gpu-a1"), (1, "gpu-b7")):
        (tmp_path / f"{host}.log").write_text(
            f"{host}:4{r}01:4{r}01 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.{r + 2}<0>\n"
            f"{host}:4{r}01:4{r}01 [0] NCCL INFO comm 0x5581 rank {r} nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n")
    d = analyze_paths([tmp_path])
    assert d.cause == "wrong_interface"


@pytest.mark.parametrize("head", ["(MegatronPolicyWorker pid=1391870) ", "", "[2026-07-10 06:19:36] "])
def test_a_duplicate_gpu_report_without_a_rank_prefix_names_no_rank_of_its_own(tmp_path: Path, head: str) -> None:
    """NCCL's duplicate-GPU report names the colliding pair (communicator ranks), never the reporter: a line with no
    rank prefix takes no rank from its text; the node is the one to look at."""
    line = (f"{head}pool0-00008:1391870:1393239 [7] init.cc:904 NCCL WARN Duplicate GPU detected : rank 15 and rank 7 "
            "both on CUDA device e4000\n")
    (tmp_path / "console.log").write_text(line)
    d = analyze_paths([tmp_path])
    assert (d.cause, d.first_failing_rank, d.first_failing_host) == ("duplicate_gpu", None, "pool0-00008")
    assert "15 and 7" in d.summary


@pytest.mark.parametrize("host", ["gpu-n3", "gadi-gpu-v100-0011"])
def test_a_launcher_that_cannot_ssh_to_a_node_names_it_not_the_script(tmp_path: Path, host: str) -> None:
    """DeepSpeed's runner raises from its own ssh check before any rank ran: the traceback is the launcher's, the
    cause an unreachable node, the node the one its message names."""
    (tmp_path / "launch.log").write_text(
        "Traceback (most recent call last):\n"
        '  File "/env/lib/python3.8/site-packages/deepspeed/launcher/runner.py", line 401, in main\n'
        "    subprocess.check_call(\n"
        f"subprocess.CalledProcessError: Command 'ssh -o PasswordAuthentication=no {host} hostname' returned "
        "non-zero exit status 255.\n\nDuring handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n"
        '  File "/env/lib/python3.8/site-packages/deepspeed/launcher/runner.py", line 407, in main\n'
        "    raise RuntimeError(\n"
        f"RuntimeError: Using hostfile at /home/u/hostfile but host={host} was not reachable via ssh. If you are "
        "running with a single node please remove /home/u/hostfile or setup passwordless ssh.\n")
    d = analyze_paths([tmp_path])
    assert (d.cause, d.first_failing_rank, d.first_failing_host) == ("network_unreachable", None, host)
    assert d.exclude_nodes == [] and host in d.summary


@pytest.mark.parametrize("asked", ["GPUs: [0, 1]", "gpu: [0, 1, 2, 3]"])
def test_lightning_refusing_devices_it_cannot_see_is_a_launch_configuration(tmp_path: Path, asked: str) -> None:
    """Lightning's MisconfigurationException says what was asked on the lines after its (empty) head: the job
    asked for more GPUs than each task was given, not a bug of the script."""
    (tmp_path / "slurm-6169.out").write_text(
        "pytorch_lightning.utilities.exceptions.MisconfigurationException: \n"
        f"                You requested {asked}\n                But your machine only has: [0]\n")
    d = analyze_paths([tmp_path])
    assert (d.cause, d.first_failing_rank) == ("rank_config_mismatch", None)


@pytest.mark.parametrize("reporter", [1, 5, 118])
def test_one_ranks_timeout_in_a_paste_accuses_no_rank_it_never_saw(tmp_path: Path, reporter: int) -> None:
    """A paste of one rank's watchdog lines, no world size said: the ranks below it left no line, which tells
    nothing (their logs were not given); with the others' logs present and silent, a silent one is still named."""
    line = (f"[rank{reporter}]:[E ProcessGroupNCCL.cpp:632] [Rank {reporter}] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600044 "
            "milliseconds before timing out.\n")
    (tmp_path / "console.log").write_text(line)
    d = analyze_paths([tmp_path / "console.log"])
    assert (d.cause, d.first_failing_rank) == ("collective_timeout", None)
    job = tmp_path / "job"
    job.mkdir()
    (job / "rank_0.log").write_text("step 10 loss 2.1\n")
    (job / "rank_1.log").write_text(line.replace(f"rank{reporter}", "rank1").replace(f"Rank {reporter}", "Rank 1"))
    d = analyze_paths([job])
    assert (d.cause, d.first_failing_rank) == ("collective_timeout", 0)
