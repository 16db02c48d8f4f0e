"""The failure lab: run the scenarios of scenarios.toml on a local cluster and keep each job as a case.

Each scenario submits slurm/lab/ddp_fault.py through `ddpslurm submit`, injects its fault (inside the
script through its arguments, or from outside through a hook: a listener on the master port, an
nftables rule in a node's namespace, scancel, a crashed node, a link taken down, a preempting job),
waits for the job to end, and copies the job folder (minus submitit's pickles and checkpoints) to
`<out>/lab-<cause>-<n>/` with a `label.json` whose culprit comes from the injection, never from analyze.

Used by `slurm/failure-lab` and tests/integration/test_failure_lab.py.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

LAB = Path(__file__).resolve().parent
REPO = LAB.parent.parent
CLUSTER = REPO / "slurm" / "cluster"
FAULT_SCRIPT = LAB / "ddp_fault.py"
SCENARIOS = LAB / "scenarios.toml"
DEFAULT_OUT = REPO / "analyzer" / "cases"
SKIP_IN_COPY = ("*.pkl", "checkpoints")
NFT_TABLE = "ddpslurm_lab_fault"
#: DESIGN.md's cause vocabulary: a scenario's cause must be one of these.
CAUSES = ("network_unreachable", "port_in_use", "rendezvous_timeout", "rank_config_mismatch", "stale_rendezvous_state",
          "wrong_interface", "infiniband_error", "nccl_version_mismatch", "duplicate_gpu", "cuda_oom", "host_oom",
          "gpu_hardware", "collective_timeout", "collective_mismatch", "user_code_exception", "unused_parameters",
          "slurm_time_limit", "slurm_cancelled", "preempted", "node_failure", "shm_error", "dataloader_worker_killed",
          "nccl_internal_error", "segfault", "unknown")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE"}


class LabError(Exception):
    """A scenario could not be run (bad table, cluster trouble, a job that never ended)."""


# --- scenarios: data -> frozen objects (pure) ---------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One row of scenarios.toml, defaults applied."""

    name: str
    cause: str
    description: str
    culprit_rank: int | None
    nodes: int = 3
    tasks_per_node: int = 2
    time: str = "5"
    submit_args: tuple[str, ...] = ()
    script_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    hook: str | None = None
    hook_args: tuple[tuple[str, Any], ...] = ()
    trigger: str | None = None
    culprit_node: int | None = None
    max_wait_s: float = 240
    live: bool = False
    node_logs: bool = False
    kernel_log: bool = False

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    def hook_arg(self, key: str) -> Any:
        return dict(self.hook_args)[key]


KNOWN_KEYS = {f for f in Scenario.__dataclass_fields__}


def parse_scenarios(data: Mapping[str, Any]) -> list[Scenario]:
    """scenarios.toml's content -> scenarios, validated (unique names, known keys, culprit in range)."""
    defaults = dict(data.get("defaults", {}))
    out: list[Scenario] = []
    for raw in data.get("scenario", []):
        row = {**defaults, **raw}
        unknown = set(row) - KNOWN_KEYS
        if unknown:
            raise LabError(f"scenario {row.get('name', '?')!r}: unknown keys {sorted(unknown)}")
        culprit = row.get("culprit_rank")
        row["culprit_rank"] = None if culprit in (None, "none") else int(culprit)
        for key in ("submit_args", "script_args"):
            row[key] = tuple(str(a) for a in row.get(key, ()))
        for key in ("env", "hook_args"):
            row[key] = tuple(sorted(dict(row.get(key, {})).items()))
        scenario = Scenario(**row)
        if scenario.cause not in CAUSES:
            raise LabError(f"scenario {scenario.name!r}: cause {scenario.cause!r} is not in DESIGN.md's vocabulary")
        if scenario.culprit_rank is not None and not 0 <= scenario.culprit_rank < scenario.world_size:
            raise LabError(f"scenario {scenario.name!r}: culprit_rank {scenario.culprit_rank} is not one of "
                           f"its {scenario.world_size} ranks")
        if scenario.hook is not None and scenario.hook not in HOOKS:
            raise LabError(f"scenario {scenario.name!r}: unknown hook {scenario.hook!r}; known: {sorted(HOOKS)}")
        out.append(scenario)
    names = [s.name for s in out]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise LabError(f"duplicate scenario names: {duplicates}")
    return out


def load_scenarios(path: Path = SCENARIOS) -> list[Scenario]:
    with path.open("rb") as handle:
        return parse_scenarios(tomllib.load(handle))


def select(scenarios: Sequence[Scenario], wanted: Sequence[str]) -> list[Scenario]:
    """Scenarios named in `wanted` (a scenario name, or a cause for all of its scenarios); all when empty."""
    if not wanted:
        return list(scenarios)
    chosen: list[Scenario] = []
    for word in wanted:
        hits = [s for s in scenarios if word in (s.name, s.cause)]
        if not hits:
            raise LabError(f"no scenario or cause named {word!r}; `slurm/failure-lab --list` shows them")
        chosen += [s for s in hits if s not in chosen]
    return chosen


def host_of_rank(nodes: Sequence[str], tasks_per_node: int, rank: int) -> str:
    """The node that runs global `rank` under srun's default block distribution."""
    index = rank // tasks_per_node
    if not 0 <= index < len(nodes):
        raise LabError(f"rank {rank} does not fit on {len(nodes)} nodes x {tasks_per_node} tasks")
    return nodes[index]


def next_case_dir(out: Path, cause: str) -> Path:
    """`out/lab-<cause>-<n>` with the first n not taken yet (n counts from 1)."""
    taken = {int(m.group(1)) for p in out.glob(f"lab-{cause}-*")
             if (m := re.fullmatch(rf"lab-{re.escape(cause)}-(\d+)", p.name))}
    n = 1
    while n in taken:
        n += 1
    return out / f"lab-{cause}-{n}"


def substitute(args: Iterable[str], nodes: Sequence[str]) -> tuple[str, ...]:
    """Replace `{nodeK}` (1-based) in script arguments with the cluster's K-th node name."""
    values = {f"node{i + 1}": name for i, name in enumerate(nodes)}
    return tuple(re.sub(r"\{(node\d+)\}", lambda m: values[m.group(1)], a) for a in args)


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")


# --- the cluster and its commands ---------------------------------------------------------------------


def sh(argv: Sequence[str], env: Mapping[str, str] | None = None, check: bool = True,
       timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a command and capture its output; the lab's one place that runs other programs to completion."""
    done = subprocess.run(list(argv), env=dict(env) if env is not None else None, capture_output=True, text=True,
                          timeout=timeout)
    if check and done.returncode != 0:
        raise LabError(f"`{shlex.join(argv)}` failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return done


@dataclass
class Cluster:
    """A local cluster of slurm/cluster, by name."""

    name: str
    env: dict[str, str] = field(default_factory=dict)

    def cluster(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return sh([str(CLUSTER), "--name", self.name, *args], timeout=timeout)

    def ensure_up(self, nodes: int) -> None:
        """Bring the cluster up if it is not (or restart crashed slurmds) and load its environment.

        A cluster that is up is used as it is (never re-created with another node count: the test fixture owns it).
        """
        if sh([str(CLUSTER), "--name", self.name, "status"], check=False).returncode != 0:
            self.cluster("up")  # its last node count (3 for a new cluster); restarts crashed slurmds
        self.env = dict(os.environ)
        for line in self.cluster("env").stdout.splitlines():
            words = shlex.split(line)
            if len(words) == 2 and words[0] == "export" and "=" in words[1]:
                key, _, value = words[1].partition("=")
                self.env[key] = value
        self.resume_down_nodes()
        if len(self.nodes()) < nodes:
            self.cluster("up", "--nodes", str(nodes))
            self.resume_down_nodes()

    def resume_down_nodes(self, wait_s: float = 60) -> None:
        """A node left down/drained by an earlier scenario (link down, crash) is resumed and waited for."""
        deadline = time.monotonic() + wait_s
        while True:
            states = dict(line.split() for line in self.run(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout.splitlines()
                          if line.strip())
            bad = [n for n, s in states.items() if s.rstrip("*~#") not in ("idle", "allocated", "mixed")]
            if not bad:
                return
            for node in bad:
                if states[node].startswith(("down", "drain")):
                    self.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
            if time.monotonic() > deadline:
                raise LabError(f"nodes not usable after {wait_s:.0f}s: {bad}")
            time.sleep(1)

    def run(self, argv: Sequence[str], check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        return sh(argv, env=self.env, check=check, timeout=timeout)

    def nodes(self) -> list[str]:
        return sorted(set(self.run(["sinfo", "-h", "-N", "-o", "%N"]).stdout.split()))  # a node is listed per partition

    def netns(self, node: str) -> str:
        return f"dds-{node}"

    def node_ip(self, node: str) -> str:
        out = self.run(["getent", "hosts", node]).stdout.split()
        if not out:
            raise LabError(f"cannot resolve node {node}")
        return out[0]

    def expand(self, hostlist: str) -> list[str]:
        return self.run(["scontrol", "show", "hostnames", hostlist]).stdout.split()


# --- hooks: faults injected from outside the script ---------------------------------------------------


@dataclass
class Context:
    """What a hook needs: the cluster, the scenario, the job once submitted, and what it did."""

    cluster: Cluster
    scenario: Scenario
    nodes: list[str]
    job_id: str | None = None
    job_dir: Path | None = None
    injected: dict[str, Any] = field(default_factory=dict)
    processes: list[subprocess.Popen] = field(default_factory=list)
    live_fired: bool = False
    was_running: bool = False

    def node(self, key: str = "node") -> str:
        return self.nodes[int(self.scenario.hook_arg(key)) - 1]

    def record(self, command: Sequence[str] | str, host: str | None) -> None:
        text = command if isinstance(command, str) else shlex.join(command)
        self.injected.setdefault("commands", []).append(text)
        self.injected.update({"where": host, "time": utc_now()})


class Hook:
    """A fault from outside the script: `before` the submission, `submitted`, `live` once the trigger is seen,
    `cleanup`."""

    def before(self, ctx: Context) -> None: ...

    def submitted(self, ctx: Context) -> None: ...

    def live(self, ctx: Context) -> None: ...

    def cleanup(self, ctx: Context) -> None: ...


LISTENER = ("import socket, sys, time\n"
            "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(); print('listening', flush=True); time.sleep(3600)\n")


class ListenPort(Hook):
    """Another process holds the master port on the master node (a listener in the node's namespace)."""

    def before(self, ctx: Context) -> None:
        node, port = ctx.node(), str(ctx.scenario.hook_arg("port"))
        argv = ["nsenter", f"--net=/run/netns/{ctx.cluster.netns(node)}", sys.executable, "-c", LISTENER, port]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ctx.processes.append(proc)
        if proc.stdout is None or proc.stdout.readline().strip() != "listening":
            raise LabError(f"the listener on {node}:{port} did not start: {proc.stderr.read() if proc.stderr else ''}")
        ctx.record(["nsenter", f"--net=/run/netns/{ctx.cluster.netns(node)}", "python3", "-c",
                    f"<listen on 0.0.0.0:{port}>"], node)

    def cleanup(self, ctx: Context) -> None:
        for proc in ctx.processes:
            proc.kill()
            proc.wait(timeout=10)


class FirewallPort(Hook):
    """nftables in the master node's namespace drops TCP from one node to the master port."""

    def _nft(self, ctx: Context, *words: str, check: bool = True) -> list[str]:
        argv = ["nsenter", f"--net=/run/netns/{ctx.cluster.netns(ctx.node())}", "nft", *words]
        sh(argv, check=check)
        return argv

    def before(self, ctx: Context) -> None:
        src = ctx.cluster.node_ip(ctx.node("from_node"))
        port = str(ctx.scenario.hook_arg("port"))
        self._nft(ctx, "add", "table", "inet", NFT_TABLE)
        self._nft(ctx, "add", "chain", "inet", NFT_TABLE, "input",
                  "{ type filter hook input priority 0 ; policy accept ; }")
        argv = self._nft(ctx, "add", "rule", "inet", NFT_TABLE, "input", "ip", "saddr", src, "tcp", "dport", port,
                         "drop")
        ctx.record(argv, ctx.node())
        ctx.injected["blocked_from"] = ctx.node("from_node")

    def cleanup(self, ctx: Context) -> None:
        self._nft(ctx, "delete", "table", "inet", NFT_TABLE, check=False)


class Scancel(Hook):
    def live(self, ctx: Context) -> None:
        argv = ["scancel", str(ctx.job_id)]
        ctx.cluster.run(argv)
        ctx.record(argv, None)


class CrashNode(Hook):
    def live(self, ctx: Context) -> None:
        argv = [str(CLUSTER), "--name", ctx.cluster.name, "crash-node", ctx.node()]
        sh(argv)
        ctx.record(["slurm/cluster", *argv[1:]], ctx.node())

    def cleanup(self, ctx: Context) -> None:
        ctx.cluster.ensure_up(len(ctx.nodes))


class LinkDown(Hook):
    def live(self, ctx: Context) -> None:
        argv = ["ip", "-n", ctx.cluster.netns(ctx.node()), "link", "set", "eth0", "down"]
        sh(argv)
        ctx.record(argv, ctx.node())

    def cleanup(self, ctx: Context) -> None:
        sh(["ip", "-n", ctx.cluster.netns(ctx.node()), "link", "set", "eth0", "up"], check=False)
        ctx.cluster.ensure_up(len(ctx.nodes))


class Preempt(Hook):
    """A higher-priority exclusive job takes every node; Slurm requeues the lab job (PreemptMode=REQUEUE)."""

    def live(self, ctx: Context) -> None:
        argv = ["sbatch", "--parsable", "-p", "urgent", "-N", str(len(ctx.nodes)), "--exclusive", "-t", "2",
                "-o", "/dev/null", "-J", "lab-preemptor", "--wrap", "sleep 60"]
        ctx.injected["preemptor_job"] = ctx.cluster.run(argv).stdout.strip().split(";")[0]
        ctx.record(argv, None)

    def cleanup(self, ctx: Context) -> None:
        if "preemptor_job" in ctx.injected:
            ctx.cluster.run(["scancel", ctx.injected["preemptor_job"]], check=False)


STORE = ("import sys, time\n"
         "import torch.distributed as dist\n"
         "store = dist.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=True, multi_tenant=True,\n"
         "                      wait_for_workers=False)\n"
         "print('listening', flush=True); time.sleep(3600)\n")


def predict_next_job_id(cluster: Cluster) -> str:
    """The id Slurm gives the next job: one more than the highest it has given (ids are sequential)."""
    out = cluster.run(["sacct", "-X", "-n", "-P", "-a", "-o", "JobIDRaw", "-S", "2000-01-01"]).stdout.split()
    ids = [int(x) for x in out if x.isdigit()]
    if not ids:
        raise LabError("cannot predict the next job id: sacct lists no job yet; run any scenario first")
    return str(max(ids) + 1)


class StaleRendezvous(Hook):
    """A c10d rendezvous store left from an earlier torchrun run with the same run id (the job id) still holds the
    rendezvous port on the master node, its state closed: the job's torchrun agents meet that old state."""

    def before(self, ctx: Context) -> None:
        node, port = ctx.node(), str(ctx.scenario.hook_arg("port"))
        netns = f"--net=/run/netns/{ctx.cluster.netns(node)}"
        ctx.injected["predicted_job_id"] = run_id = predict_next_job_id(ctx.cluster)
        proc = subprocess.Popen(["nsenter", netns, sys.executable, "-c", STORE, node, port],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ctx.processes.append(proc)
        if proc.stdout is None or proc.stdout.readline().strip() != "listening":
            raise LabError(f"the leftover store on {node}:{port} did not start")
        earlier = ["nsenter", netns, sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
                   "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{node}:{port}",
                   "--rdzv-id", run_id, "--no-python", "true"]
        sh(earlier, timeout=120)
        ctx.record(["nsenter", netns, "python3", "-c", f"<TCPStore server on {node}:{port}, kept running>"], node)
        ctx.record(earlier, node)

    def submitted(self, ctx: Context) -> None:
        if ctx.job_id != ctx.injected["predicted_job_id"]:
            raise LabError(f"job id {ctx.job_id} is not the predicted {ctx.injected['predicted_job_id']}: "
                           "the leftover rendezvous has another run id; no case written")

    def cleanup(self, ctx: Context) -> None:
        ListenPort().cleanup(ctx)


def rank_pid(job_dir: Path, rank: int) -> tuple[int, str]:
    """(pid, host) of global `rank` from its start record in the job's latest attempt (ddpslurm writes one per
    rank, from the process that runs the script)."""
    found = [*job_dir.glob(f"attempt_*/rank_{rank}.start.json"), *job_dir.glob(f"attempt_*/*/rank_{rank}.start.json")]
    records = sorted(found, key=lambda path: int(path.relative_to(job_dir).parts[0].rpartition("_")[2]))  # host folders
    if not records:
        raise LabError(f"no start record of rank {rank} under {job_dir}")
    record = json.loads(records[-1].read_text())
    return int(record["pid"]), str(record["host"])


def process_job_id(pid: int) -> str | None:
    """SLURM_JOB_ID in the environment of process `pid` (None when it is gone or has none)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    values = [item.partition(b"=")[2].decode() for item in environ if item.startswith(b"SLURM_JOB_ID=")]
    return values[0] if values else None


class ExternalKill(Hook):
    """SIGKILL from outside (an admin's `kill -9`, a node health check, the OOM killer of another cgroup): the
    faulty rank's process, found by the pid of its start record and checked to belong to the job, is killed."""

    def live(self, ctx: Context) -> None:
        rank = int(ctx.scenario.hook_arg("rank"))
        pid, host = rank_pid(ctx.job_dir or Path("/nonexistent"), rank)
        if process_job_id(pid) != ctx.job_id:
            raise LabError(f"pid {pid} of rank {rank} is not a live process of job {ctx.job_id}; nothing killed")
        argv = ["kill", "-KILL", str(pid)]
        sh(argv)
        ctx.record(argv, host)
        ctx.injected["killed"] = {"rank": rank, "pid": pid, "host": host}


HOOKS: dict[str, Callable[[], Hook]] = {
    "listen_port": ListenPort, "firewall_port": FirewallPort, "scancel": Scancel, "crash_node": CrashNode,
    "link_down": LinkDown, "preempt": Preempt, "stale_rendezvous": StaleRendezvous, "external_kill": ExternalKill,
}


# --- running one scenario -----------------------------------------------------------------------------


def submit_argv(scenario: Scenario, folder: Path, script_args: Sequence[str]) -> list[str]:
    """The `ddpslurm submit` command line of a scenario (pure)."""
    return [sys.executable, "-m", "ddpslurm.cli", "submit", str(FAULT_SCRIPT), "--nodes", str(scenario.nodes),
            "--tasks-per-node", str(scenario.tasks_per_node), "--time", scenario.time, "--folder", str(folder),
            "--job-name", f"lab-{scenario.name}", "--json", *scenario.submit_args, "--", *script_args]


def _logs_contain(job_dir: Path, text: str) -> bool:
    for path in job_dir.rglob("*.log"):
        try:
            if text in path.read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False


def _job_state(cluster: Cluster, job_id: str) -> str:
    out = cluster.run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False).stdout.strip()
    if out:
        return out
    acct = cluster.run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"], check=False).stdout.split()
    return acct[0].split()[0] if acct else "UNKNOWN"


def job_record(sacct_rows: str) -> dict[str, str]:
    """`sacct -X -D -P -o State,ExitCode,NodeList,Elapsed` rows (every run of the job, oldest first) -> the run
    that held nodes last (a requeued copy cancelled while pending holds none): its state, exit code, node list and
    elapsed time, plus `final_state` when the job's last row says something else (pure)."""
    rows = [line.split("|") for line in sacct_rows.strip().splitlines() if line.count("|") == 3]
    if not rows:
        raise LabError(f"sacct printed no job row: {sacct_rows.strip()[:200]!r}")
    ran = [row for row in rows if row[2] and row[2] != "None assigned"] or rows
    state, exit_code, nodelist, elapsed = ran[-1]
    record = {"state": state, "exit_code": exit_code, "nodelist": "" if nodelist == "None assigned" else nodelist,
              "elapsed": elapsed}
    if rows[-1] is not ran[-1]:
        record["final_state"] = rows[-1][0]
    return record


def _attempt_over(cluster: Cluster, ctx: Context) -> bool:
    """The job ended; or, once it ran (or a live hook fired), it is PENDING again: requeued, by Slurm or by the
    launcher; then the lab cancels the pending copy, so the case holds the one run the fault was injected into."""
    state = _job_state(cluster, str(ctx.job_id)).split()[0]
    if state in TERMINAL:
        return True
    ctx.was_running = ctx.was_running or state == "RUNNING"
    if state == "PENDING" and (ctx.live_fired or ctx.was_running) and "then" not in ctx.injected:
        cluster.run(["scancel", str(ctx.job_id)], check=False)
        ctx.injected["then"] = (f"the job was requeued; the lab cancelled the pending requeued copy at {utc_now()} "
                                "(scancel) so it would not run again")
    return False


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, poll: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise LabError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)


def job_lines(lines: Iterable[str], job_id: str) -> list[str]:
    """The lines of a Slurm daemon log that name `job_id` (as JobId=, StepId=, [id.step] or plain)."""
    pattern = re.compile(rf"(?<![0-9]){re.escape(job_id)}(?![0-9])")
    return [line for line in lines if pattern.search(line)]


def attach_node_logs(log_dir: Path, job_id: str, dest: Path) -> list[str]:
    """Copy what slurmctld and every slurmd logged about the job into `dest/slurm-daemon-logs/`.

    What an administrator attaches to a ticket: the daemons' own lines for that job, from every node.
    """
    written = []
    for log in sorted(log_dir.glob("slurm*.log")):
        lines = job_lines(log.read_text(errors="replace").splitlines(keepends=True), job_id)
        if lines:
            (dest / "slurm-daemon-logs").mkdir(exist_ok=True)
            (dest / "slurm-daemon-logs" / log.name).write_text("".join(lines))
            written.append(log.name)
    return written


def kernel_lines() -> list[str]:
    """The kernel's log (dmesg), one entry per line; empty when it cannot be read."""
    done = sh(["dmesg"], check=False)
    return done.stdout.splitlines(keepends=True) if done.returncode == 0 else []


OOM_LINE = re.compile(r"oom|out of memory|killed process", re.IGNORECASE)


def remove_lab_cgroups() -> None:
    """Remove the empty memory cgroups ddp_fault.py --fault oom-cgroup left behind (named ddpslurm-lab-<pid>)."""
    for root in (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")):
        for group in root.glob("**/ddpslurm-lab-*") if root.is_dir() else ():
            try:
                group.rmdir()
            except OSError:
                continue


def copy_job(job_dir: Path, dest: Path) -> int:
    """Copy the job folder as produced, minus pickles and checkpoints; returns its size in bytes."""
    shutil.copytree(job_dir, dest, ignore=shutil.ignore_patterns(*SKIP_IN_COPY))
    return sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())


def run_scenario(cluster: Cluster, scenario: Scenario, out: Path, keep: bool = False,
                 log: Callable[[str], None] = print) -> Path:
    """Run one scenario end to end; returns the case folder written under `out`."""
    remove_lab_cgroups()
    cluster.ensure_up(scenario.nodes)
    nodes = cluster.nodes()
    if len(nodes) < scenario.nodes:
        raise LabError(f"{scenario.name} needs {scenario.nodes} nodes; cluster {cluster.name} has {len(nodes)}")
    ctx = Context(cluster, scenario, nodes)
    hook = HOOKS[scenario.hook]() if scenario.hook else Hook()
    root = Path(tempfile.mkdtemp(prefix=f"lab-{scenario.name}-", dir="/tmp"))
    script_args = substitute(scenario.script_args, nodes)
    argv = submit_argv(scenario, root, script_args)
    env = {**cluster.env, **dict(scenario.env)}
    kernel_before = len(kernel_lines()) if scenario.kernel_log else 0
    try:
        hook.before(ctx)
        submitted_at = utc_now()
        done = sh(argv, env=env, timeout=120)
        reply = json.loads(done.stdout.strip().splitlines()[-1])
        ctx.job_id = str(reply["job_id"])
        ctx.job_dir = job_dir = Path(reply["folder"])
        log(f"{scenario.name}: job {ctx.job_id} submitted ({job_dir})")
        hook.submitted(ctx)
        if scenario.trigger:
            wait_for(lambda: _logs_contain(job_dir, scenario.trigger or ""), scenario.max_wait_s,
                     f"{scenario.trigger!r} in the logs of job {ctx.job_id}")
            hook.live(ctx)
            ctx.live_fired = True
            log(f"{scenario.name}: injected {ctx.injected.get('commands')}")
        wait_for(lambda: _attempt_over(cluster, ctx), scenario.max_wait_s, f"job {ctx.job_id} to end")
    except BaseException:
        if ctx.job_id:
            cluster.run(["scancel", ctx.job_id], check=False)
        raise
    finally:
        hook.cleanup(ctx)
        remove_lab_cgroups()
    if _job_state(cluster, str(ctx.job_id)).split()[0] == "COMPLETED":
        raise LabError(f"job {ctx.job_id} of {scenario.name} completed: the fault did not take; no case written")
    if not any(job_dir.glob("*_log.*")):
        raise LabError(f"job {ctx.job_id} of {scenario.name} never ran (no task log in {job_dir}); no case written")
    acct = cluster.run(["sacct", "-X", "-D", "-n", "-P", "-j", ctx.job_id, "-o", "State,ExitCode,NodeList,Elapsed"])
    job = job_record(acct.stdout)
    allocation = cluster.expand(job.pop("nodelist")) if job.get("nodelist") else nodes
    label = make_label(scenario, allocation, ctx, argv, script_args, submitted_at,
                       {"id": ctx.job_id, **job, "nodes": allocation})
    out.mkdir(parents=True, exist_ok=True)
    dest = next_case_dir(out, scenario.cause)
    size = copy_job(job_dir, dest)
    daemon_logs = Path(cluster.env.get("DDPSLURM_CLUSTER_LOGS", "/nonexistent"))
    if scenario.node_logs and attach_node_logs(daemon_logs, str(ctx.job_id), dest):
        label["attached"] = ("slurm-daemon-logs/: the lines slurmctld and each node's slurmd logged about this "
                             "job, copied by the lab after the job ended (what an administrator attaches); "
                             "everything else is the job folder as produced")
    if scenario.kernel_log:
        oom = [line for line in kernel_lines()[kernel_before:] if OOM_LINE.search(line)]
        if oom:
            (dest / "kernel-log").mkdir(exist_ok=True)
            (dest / "kernel-log" / "dmesg.txt").write_text("".join(oom))
            label["attached"] = ("kernel-log/dmesg.txt: the OOM lines the kernel logged during the job (all nodes "
                                 "of the local cluster share one kernel), copied by the lab after the job ended; "
                                 "everything else is the job folder as produced")
    (dest / "label.json").write_text(json.dumps(label, indent=2) + "\n")
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    log(f"{scenario.name}: job {ctx.job_id} {job['state']} -> {dest} ({size // 1024} KiB)")
    return dest


def make_label(scenario: Scenario, allocation: Sequence[str], ctx: Context, argv: Sequence[str],
               script_args: Sequence[str], submitted_at: str, job: Mapping[str, Any]) -> dict[str, Any]:
    """label.json: the ground truth from the injection (which rank, which node), never from analyze."""
    rank = scenario.culprit_rank
    if scenario.culprit_node is not None:
        host: str | None = allocation[scenario.culprit_node - 1]
    elif rank is not None:
        host = host_of_rank(allocation, scenario.tasks_per_node, rank)
    else:
        host = None
    launch = "ddpslurm submit " + shlex.join(argv[argv.index("submit") + 1:]).replace(str(REPO) + "/", "")
    how = f"{scenario.hook} hook" if scenario.hook else "fault injected by slurm/lab/ddp_fault.py " + " ".join(
        script_args[:2])
    injected: dict[str, Any] = {"rank": rank, "host": host, "time": submitted_at,
                                "time_is": "submission time (an in-script fault fires at its --fault-step)",
                                "script_args": list(script_args), "env": dict(scenario.env)}
    injected.update(ctx.injected)
    if ctx.injected.get("time"):
        injected["time_is"] = "when the hook ran"
    if not ctx.injected.get("commands"):
        injected["commands"] = [launch]
    return {
        "cause": scenario.cause,
        "first_failing_rank": rank,
        "first_failing_host": host,
        "source": f"lab: real failure on the local cluster, {how}, launched with `ddpslurm submit` "
                  f"(slurm/failure-lab scenario {scenario.name})",
        "description": scenario.description,
        "injected": injected,
        "launch": launch,
        "job": dict(job),
        "world_size": scenario.world_size,
        "recorded": utc_now(),
    }


# --- command line -------------------------------------------------------------------------------------


def analyze_check(case: Path) -> tuple[bool, dict[str, Any]]:
    """Run `ddpslurm analyze --json` on a case (everything but label.json) and compare with its label."""
    label = json.loads((case / "label.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) / case.name
        shutil.copytree(case, logs, ignore=shutil.ignore_patterns("label.json"))
        done = sh([sys.executable, "-m", "ddpslurm.cli", "analyze", "--json", str(logs)], check=False, timeout=300)
    try:
        got = json.loads(done.stdout)
    except json.JSONDecodeError:
        return False, {"error": (done.stderr or done.stdout).strip()[-500:]}
    ok = got.get("cause") == label["cause"] and got.get("first_failing_rank") == label["first_failing_rank"]
    if label.get("first_failing_host") is not None:
        ok = ok and got.get("first_failing_host") == label["first_failing_host"]
    return ok, got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="slurm/failure-lab", description=__doc__.split("\n\n")[0])
    p.add_argument("cases", nargs="*", metavar="CASE", help="scenario names or causes (default: all)")
    p.add_argument("--cluster", default=os.environ.get("DDPSLURM_LAB_CLUSTER", "lab"), help="cluster name")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the lab-<cause>-<n>/ cases go")
    p.add_argument("--check", action="store_true", help="run `ddpslurm analyze` on each new case and compare")
    p.add_argument("--keep", action="store_true", help="keep the temporary job folders")
    args = p.parse_args(argv)
    try:
        scenarios = select(load_scenarios(), args.cases)
    except LabError as error:
        print(f"failure-lab: error: {error}", file=sys.stderr)
        return 2
    if args.list:
        for s in scenarios:
            where = "none" if s.culprit_rank is None else f"rank {s.culprit_rank}"
            print(f"{s.name:24} {s.cause:26} {s.nodes}x{s.tasks_per_node}  culprit {where:8} "
                  f"{'hook ' + s.hook if s.hook else ' '.join(s.script_args[:2])}")
        return 0
    cluster = Cluster(args.cluster)
    failures = 0
    for scenario in scenarios:
        try:
            case = run_scenario(cluster, scenario, args.out, keep=args.keep)
        except (LabError, subprocess.TimeoutExpired) as error:
            print(f"failure-lab: {scenario.name}: {error}", file=sys.stderr)
            failures += 1
            continue
        if args.check:
            ok, got = analyze_check(case)
            verdict = "RIGHT" if ok else "WRONG"
            print(f"{scenario.name}: analyze {verdict}: cause={got.get('cause')} rank={got.get('first_failing_rank')} "
                  f"host={got.get('first_failing_host')} {got.get('error', '')}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
