"""What `ddpslurm doctor` runs on every node (one task per node): gather facts, test links, write a record.

`python -m ddpslurm.doctor.probe --folder ROOT [--port P] [--interface IF] [--window S]`. Every node listens
on the job's MASTER_PORT (on the rank-0 host this is also the "port free" check), connects to the peers the
sparse plan gives it (`graph.probe_plan`: ring successor, rank-0 host, k random peers; all-to-all for small
jobs) from the interface ddpslurm picks, and keeps listening until every peer the plan sends to it has
connected or the window is over. The listen backlog and the connecting threads are sized to the plan. Every
step is bounded by seconds, so a node cut off by a firewall is named when the window ends, not after an init
timeout. Failures are data in the record; the probe itself exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from ddpslurm.doctor.graph import RANDOM_PEERS, all_to_all, inbound, lookups, probe_plan
from ddpslurm.env import master_port_for
from ddpslurm.jobfolder import doctor_record_path, job_folder, write_json
from ddpslurm.netif import choose_interface, interface_addresses
from ddpslurm.scheduler.hostlist import expand_hostlist

T = TypeVar("T")
CONNECT_TIMEOUT_S = 2.0  #: one connection attempt; a dropped SYN costs this much, then the next try
RETRY_S = 0.2  #: pause after a refused connection (the peer's listener may not be up yet)
LOOKUP_TIMEOUT_S = 2.0  #: one name lookup
DEFAULT_WINDOW_S = 10.0  #: how long a node keeps trying to reach its peers
SELF_TIMEOUT_S = 2.5  #: this node's connection to its own listener on its interface address
SOFTWARE_TIMEOUT_S = 60  #: importing torch (a cold shared file system can be slow)
RECORD_PREFIX = "ddpslurm-doctor "  #: the line each probe prints for the CLI (one JSON object follows)
MIN_BACKLOG = 64  #: the listen backlog is the planned inbound count plus this (room for retried connections)
HANDLER_THREADS = 16  #: connections answered at once (a peer that connects and stalls holds one, not the accept loop)
SOMAXCONN = Path("/proc/sys/net/core/somaxconn")  #: the kernel caps every listen backlog at this


def bounded(call: Callable[[], T], timeout: float, default: T) -> T:
    """`call()` in a daemon thread; `default` when it takes longer than `timeout` seconds or raises."""
    box: list[T] = []

    def target() -> None:
        with contextlib.suppress(Exception):
            box.append(call())

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    return box[0] if box else default


def resolve(host: str) -> str:
    """The IPv4 address `host` resolves to here, or `error: ...`."""
    def lookup() -> str:
        try:
            return socket.gethostbyname(host)
        except OSError as error:
            return f"error: {error.strerror or error}"
    return bounded(lookup, LOOKUP_TIMEOUT_S, f"error: no answer in {LOOKUP_TIMEOUT_S:g} s")


def backlog_for(expected: int) -> int:
    """The listen backlog for `expected` planned inbound connections (they may all arrive at once)."""
    return expected + MIN_BACKLOG


def kernel_backlog_cap() -> int | None:
    """net.core.somaxconn (the most any listen backlog gets here), or None when it cannot be read."""
    with contextlib.suppress(OSError, ValueError):
        return int(SOMAXCONN.read_text().strip())
    return None


class Listener:
    """A TCP listener on the master port that answers each peer with this node's name and clock."""

    def __init__(self, node: str, port: int, backlog: int = MIN_BACKLOG) -> None:
        self.node, self.port, self.backlog, self.heard = node, port, backlog, set[str]()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as c10d's TCPStore does
        self.error: str | None = None
        self.pool = ThreadPoolExecutor(HANDLER_THREADS, thread_name_prefix="ddpslurm-doctor-answer")
        try:
            self.sock.bind(("0.0.0.0", port))
            self.sock.listen(backlog)
            self.sock.settimeout(0.2)
            threading.Thread(target=self._serve, daemon=True).start()
        except OSError as error:
            self.error = f"{error.strerror or error} (errno {error.errno})"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                self.pool.submit(self._answer, conn)
            except RuntimeError:  # closed meanwhile
                conn.close()
                return

    def _answer(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError, ValueError):
            conn.settimeout(CONNECT_TIMEOUT_S)
            peer = conn.recv(512).decode("ascii", "replace").strip()
            conn.sendall(json.dumps({"node": self.node, "time": time.time()}).encode() + b"\n")
            self.heard.add(peer)

    def close(self) -> None:
        self.sock.close()
        self.pool.shutdown(wait=False, cancel_futures=True)


def reach(node: str, peer: str, port: int, source: str | None, deadline: float) -> dict[str, Any]:
    """Connect to `peer`:`port` (from `source`) until `deadline`; ok, error, seconds and the peer's clock offset."""
    started, error = time.time(), "not tried"
    address = resolve(peer)
    if address.startswith("error"):
        return {"ok": False, "error": f"cannot resolve {peer}: {address[7:]}", "seconds": 0.0}
    while time.time() < deadline:
        try:
            with socket.create_connection((address, port), timeout=min(CONNECT_TIMEOUT_S, deadline - time.time()),
                                          source_address=(source, 0) if source else None) as conn:
                sent = time.time()
                conn.sendall(node.encode("ascii", "replace") + b"\n")
                reply = json.loads(conn.makefile("rb").readline(4096))
                got = time.time()
            return {"ok": True, "error": None, "seconds": round(got - started, 3), "address": address,
                    "offset_s": round(float(reply["time"]) - (sent + got) / 2, 4), "answered_by": str(reply["node"])}
        except (OSError, ValueError, KeyError, TypeError) as failed:
            error = _why(failed, address, port)
            if isinstance(failed, TimeoutError | socket.timeout):
                continue
            time.sleep(RETRY_S)
    return {"ok": False, "error": error, "seconds": round(time.time() - started, 3), "address": address}


def _why(failed: Exception, address: str, port: int) -> str:
    if isinstance(failed, TimeoutError | socket.timeout):
        return f"no answer from {address}:{port} (packets dropped?)"
    if isinstance(failed, OSError):
        return f"{address}:{port}: {failed.strerror or failed}"
    return f"{address}:{port} answered something else than a ddpslurm doctor (another process on the port?)"


def reach_all(node: str, peers: Sequence[str], port: int, source: str | None, deadline: float) -> dict[str, Any]:
    """`reach` every planned peer at once (a thread each: the plan keeps them few): a slow peer costs the window
    once, not once per peer."""
    results: dict[str, Any] = {}

    def one(peer: str) -> None:
        results[peer] = reach(node, peer, port, source, deadline)

    threads = [threading.Thread(target=one, args=(peer,), daemon=True) for peer in peers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.time()) + CONNECT_TIMEOUT_S + LOOKUP_TIMEOUT_S)
    return {peer: results.get(peer, {"ok": False, "error": "no result", "seconds": None}) for peer in peers}


def software() -> tuple[dict[str, str | None], int | None]:
    """torch, CUDA and NCCL versions and the visible GPU count (None where torch or CUDA is absent)."""
    try:
        import torch
    except Exception as error:  # a broken install is a finding, not a crash
        return {"torch": f"not importable: {type(error).__name__}", "cuda": None, "nccl": None}, None
    nccl = None
    with contextlib.suppress(Exception):
        raw = torch.cuda.nccl.version()
        nccl = ".".join(map(str, raw)) if isinstance(raw, tuple) else str(raw)
    gpus = None
    with contextlib.suppress(Exception):
        gpus = int(torch.cuda.device_count())
    return {"torch": str(torch.__version__), "cuda": torch.version.cuda, "nccl": nccl}, gpus


def space(path: Path) -> int | None:
    """Free bytes where `path` is, or None."""
    with contextlib.suppress(OSError):
        return shutil.disk_usage(path).free
    return None


def shm_size() -> int | None:
    """The size of /dev/shm in bytes, or None."""
    with contextlib.suppress(OSError):
        return shutil.disk_usage("/dev/shm").total
    return None


def allocation(environ: Mapping[str, str]) -> tuple[str, list[str], int, str]:
    """(job id, nodes in node-rank order, this node's rank, this node's name) from a task's Slurm variables."""
    job_id = environ.get("SLURM_JOB_ID", "")
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or ""
    if not job_id or not nodelist or not environ.get("SLURM_NODEID", "").isdigit():
        raise SystemExit("ddpslurm doctor probe: SLURM_JOB_ID, SLURM_JOB_NODELIST or SLURM_NODEID is missing: "
                         "run it through `ddpslurm doctor` (srun, one task per node)")
    nodes = expand_hostlist(nodelist)
    rank = int(environ["SLURM_NODEID"])
    return job_id, nodes, rank, environ.get("SLURMD_NODENAME") or nodes[rank]


def pick_interface(requested: str | None, nodes: Sequence[str], rank: int) -> dict[str, Any]:
    """The interface this node would give gloo/NCCL (the requested one, else the routed one) and its address."""
    addresses = bounded(interface_addresses, LOOKUP_TIMEOUT_S, {})
    name = requested or bounded(lambda: choose_interface(nodes, rank, nodes[0]), LOOKUP_TIMEOUT_S, None)
    return {"name": name, "address": addresses.get(name) if name else None, "requested": bool(requested),
            "addresses": addresses}


def resolve_all(hosts: Sequence[str]) -> dict[str, str]:
    """`resolve` each host at once (threads): the slowest lookup costs LOOKUP_TIMEOUT_S once."""
    found: dict[str, str] = {}
    threads = [threading.Thread(target=lambda h=host: found.__setitem__(h, resolve(h)), daemon=True) for host in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(LOOKUP_TIMEOUT_S + 1)
    return {host: found.get(host, f"error: no answer in {LOOKUP_TIMEOUT_S:g} s") for host in hosts}


def plan_record(nodes: Sequence[str], out: Sequence[str], into: Sequence[str], backlog: int) -> dict[str, Any]:
    """What the record says about the plan: this node's planned links and how its listener was sized."""
    return {"k": RANDOM_PEERS, "all_to_all": all_to_all(len(nodes)),
            "out": list(out), "in": list(into), "backlog": backlog, "somaxconn": kernel_backlog_cap()}


def probe(folder: Path, port: int | None, requested: str | None, window: float,
          environ: Mapping[str, str]) -> tuple[Path, dict[str, Any]]:
    """Run every check of this node; write and return its record."""
    started = time.time()
    job_id, nodes, rank, node = allocation(environ)
    port = port or master_port_for(job_id)
    plan = probe_plan(nodes, job_id)
    peers, into = list(plan.get(node, ())), inbound(plan).get(node, ())
    expected = set(into)
    listener = Listener(node, port, backlog_for(len(expected)))
    found: list[tuple[dict[str, str | None], int | None]] = []
    importing = threading.Thread(target=lambda: found.append(software()), daemon=True)
    importing.start()  # importing torch takes seconds: do it while the links are tested
    iface = pick_interface(requested, nodes, rank)
    own = iface["address"]  # a local firewall drops even this node's connection to itself (tells 2 nodes apart)
    itself = reach(node, own, port, own, time.time() + SELF_TIMEOUT_S) if own and listener.error is None else None
    links = reach_all(node, peers, port, own, started + window)
    importing.join(SOFTWARE_TIMEOUT_S)
    versions, gpus = found[0] if found else ({"torch": f"import took over {SOFTWARE_TIMEOUT_S} s", "cuda": None,
                                              "nccl": None}, None)
    job_dir = job_folder(folder, job_id)
    while not expected <= listener.heard and time.time() < started + window + CONNECT_TIMEOUT_S:
        time.sleep(0.05)  # stay reachable until every peer the plan sends here has tested us
    listener.close()
    record = {
        "schema": 1, "kind": "doctor", "job_id": job_id, "node": node, "host": socket.gethostname(),
        "node_rank": rank, "nodes": nodes, "port": port, "interface": iface,
        "resolution": resolve_all(lookups(plan, nodes, node)),
        "port_bind": {"ok": listener.error is None, "error": listener.error}, "peers": links, "self": itself,
        "plan": plan_record(nodes, peers, into, listener.backlog),
        "heard_from": sorted(listener.heard & expected), "versions": versions, "gpus": gpus,
        "shm_bytes": shm_size(), "free_bytes": space(folder), "started": started, "finished": time.time(),
    }
    path = doctor_record_path(job_dir, node)
    write_json(path, record)
    return path, record


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddpslurm.doctor.probe")
    parser.add_argument("--folder", required=True, type=Path)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--interface", default=None)
    parser.add_argument("--window", type=float, default=DEFAULT_WINDOW_S)
    args = parser.parse_args(argv)
    path, record = probe(args.folder, args.port, args.interface, args.window, os.environ)
    print(RECORD_PREFIX + json.dumps({"job_id": record["job_id"], "node": record["node"], "record": str(path),
                                      "nodes": record["nodes"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
