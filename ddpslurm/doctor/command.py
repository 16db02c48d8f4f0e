"""`ddpslurm doctor` as one library call: validate -> srun the probe on every node -> judge -> render.

The probe runs as one srun (one task per node) through `ddpslurm.scheduler.run`, the one place that runs
Slurm commands; its records land in `<folder>/job_<id>/doctor/`, where `ddpslurm analyze` finds them too.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpslurm.doctor.graph import RANDOM_PEERS, all_to_all
from ddpslurm.doctor.judge import Check, judge, verdict
from ddpslurm.doctor.probe import DEFAULT_WINDOW_S, RECORD_PREFIX
from ddpslurm.errors import DdpSlurmError, UsageError
from ddpslurm.jobfolder import check_folder, doctor_folder, doctor_record_path, job_folder
from ddpslurm.sanitize import terminal

DOCTOR_JOB_NAME = "ddpslurm-doctor"
DEFAULT_TIME = "5"
#: Exit status when a check failed (0: every check passed; 2: usage error; 1: ddpslurm could not run it).
EXIT_CHECK_FAILED = 1
MAX_RECORD_BYTES = 1 << 20
_IFNAME = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")
NODE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,255}")


class DoctorError(DdpSlurmError):
    """The checks could not run at all (srun failed before any node reported)."""


@dataclass(frozen=True)
class DoctorSpec:
    """A validated doctor request."""

    nodes: int
    folder: Path
    time_s: int
    sbatch_options: tuple[tuple[str, str], ...] = ()
    gpus_per_node: int | None = None
    interface: str | None = None
    master_port: int | None = None
    window_s: float = DEFAULT_WINDOW_S


def make_doctor_spec(*, nodes: int, folder: str, time: str = DEFAULT_TIME, partition: str | None = None,
                     account: str | None = None, qos: str | None = None, constraint: str | None = None,
                     exclude: str | None = None, nodelist: str | None = None, sbatch_args: Sequence[str] = (),
                     gpus_per_node: int | None = None,
                     interface: str | None = None, master_port: int | None = None,
                     window: float = DEFAULT_WINDOW_S) -> DoctorSpec:
    """Check the flags the way `submit` does; raise a one-line UsageError."""
    from ddpslurm.sbatch_values import check_sbatch_value, parse_sbatch_args, parse_time

    if nodes < 1:
        raise UsageError(f"--nodes {nodes} is invalid", "Give an integer >= 1")
    if gpus_per_node is not None and gpus_per_node < 0:
        raise UsageError(f"--gpus-per-node {gpus_per_node} is invalid", "Give an integer >= 0")
    if master_port is not None and not 1024 <= master_port <= 65535:
        raise UsageError(f"--master-port {master_port} is not a port between 1024 and 65535",
                         "Give the port the training job will use, or leave it out to derive one from the job id")
    if interface is not None and not _IFNAME.fullmatch(interface):
        raise UsageError(f"--interface {interface!r} is not a network interface name",
                         "Give a name such as `eth0` or `ib0` (see `ip -o link`)")
    if not 1 <= window <= 300:
        raise UsageError(f"--window {window:g} is out of range", "Give 1 to 300 seconds (default 10)")
    options = [(key, check_sbatch_value(key, value, UsageError)) for key, value in
               (("partition", partition), ("account", account), ("qos", qos), ("constraint", constraint),
                ("exclude", exclude), ("nodelist", nodelist)) if value is not None]
    folder_path = Path(folder).expanduser().absolute()
    return DoctorSpec(nodes=nodes, folder=folder_path, time_s=parse_time(time),
                      sbatch_options=tuple(options) + parse_sbatch_args(sbatch_args), gpus_per_node=gpus_per_node,
                      interface=interface, master_port=master_port, window_s=window)


def srun_argv(spec: DoctorSpec, python: str = sys.executable) -> list[str]:
    """The srun that runs the probe once on each of `spec.nodes` nodes (pure; no shell ever sees it)."""
    argv = ["srun", f"--nodes={spec.nodes}", "--ntasks-per-node=1", f"--job-name={DOCTOR_JOB_NAME}",
            f"--time={-(-spec.time_s // 60)}", "--kill-on-bad-exit=0"]
    if spec.gpus_per_node:
        argv.append(f"--gpus-per-node={spec.gpus_per_node}")
    argv += [f"--{key}={value}" if value else f"--{key}" for key, value in spec.sbatch_options]
    argv += [python, "-m", "ddpslurm.doctor.probe", "--folder", str(spec.folder), "--window", f"{spec.window_s:g}"]
    if spec.master_port:
        argv += ["--port", str(spec.master_port)]
    if spec.interface:
        argv += ["--interface", spec.interface]
    return argv


def parse_probe_lines(stdout: str) -> tuple[str | None, list[str]]:
    """(job id, nodes in node-rank order) from the lines the probes print; (None, []) when none did."""
    for line in stdout.splitlines():
        if not line.startswith(RECORD_PREFIX):
            continue
        try:
            seen = json.loads(line[len(RECORD_PREFIX):])
            job_id, nodes = str(seen["job_id"]), [str(node) for node in seen["nodes"]]
        except (ValueError, KeyError, TypeError):
            continue
        if job_id.isdigit() and nodes and all(NODE_NAME.fullmatch(node) for node in nodes):
            return job_id, nodes
    return None, []


def read_record(path: Path) -> dict[str, Any] | None:
    """One node's record (a regular file, at most 1 MiB, a JSON object of kind doctor), else None."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_RECORD_BYTES:
            return None
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("kind") == "doctor" else None


def load_records(job_dir: Path, nodes: Sequence[str]) -> dict[str, dict[str, Any]]:
    """node -> record for every node of the allocation that left one."""
    records = {node: read_record(doctor_record_path(job_dir, node)) for node in nodes}
    return {node: record for node, record in records.items() if record is not None}


def render_table(checks: Sequence[Check]) -> str:
    """The terminal table: node, check, ok, detail; advice once per failed check kind."""
    rows = [(c.node, c.name, "ok" if c.ok else "FAIL", c.detail) for c in checks]
    widths = [max(len(terminal(row[i])) for row in [("node", "check", "ok", ""), *rows]) for i in range(3)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(("node", "check", "ok"), widths, strict=True)) + "  detail"]
    lines += ["  ".join(terminal(v).ljust(w) for v, w in zip(row[:3], widths, strict=True)) + "  " + terminal(row[3])
              for row in rows]
    advice = dict.fromkeys(f"{c.name}: {c.advice}" for c in checks if not c.ok)
    return "\n".join(lines + [f"advice: {terminal(text)}" for text in advice])


def plan_text(count: int) -> str:
    """Which links the probes test, in words (graph.probe_plan)."""
    return "all-to-all" if all_to_all(count) else f"ring + rank-0 host + {RANDOM_PEERS} random peers"


def run_doctor(options: dict[str, Any], *, as_json: bool, echo: Callable[..., None]) -> int:
    """Run the checks; print the table or the JSON verdict; 0 when every check passed, else 1."""
    from ddpslurm.scheduler.run import run

    spec = make_doctor_spec(**options)
    check_folder(spec.folder)
    started = time.monotonic()
    done = run(srun_argv(spec), timeout=spec.time_s + 120, check=False)
    job_id, nodes = parse_probe_lines(done.stdout)
    if job_id is None:
        first = next((ln.strip() for ln in (done.stderr or "").splitlines() if ln.strip()), "no output")
        raise DoctorError(f"the doctor's srun ran no check (exit {done.returncode}): {first}",
                          "Check the partition and node count with `sinfo -s`")
    job_dir = job_folder(spec.folder, job_id)
    records = load_records(job_dir, nodes)
    checks = judge(nodes, records, spec.gpus_per_node)
    result = verdict(checks)
    result.update(job_id=job_id, folder=str(job_dir), seconds=round(time.monotonic() - started, 1),
                  plan=plan_text(len(nodes)), links=sum(len(rec.get("peers") or {}) for rec in records.values()))
    if as_json:
        from ddpslurm.sanitize import json_dumps

        echo(json_dumps(result, indent=None))
    else:
        echo(render_table(checks))
        state = "all checks passed" if result["ok"] else f"failing: {', '.join(result['failing_nodes'])}"
        echo(terminal(f"doctor job {job_id} on {len(nodes)} node(s) ({result['plan']}, {result['links']} links "
                      f"tested), {result['seconds']} s: {state}; records in {doctor_folder(job_dir)}/"))
    return 0 if result["ok"] else EXIT_CHECK_FAILED
