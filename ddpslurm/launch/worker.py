"""What runs on every task before the user's script (submitit calls a pickled `Worker`).

Per rank: first of all replace submitit's signal handlers by ddpslurm's (`signals`, `rank_state`: they
only take note; a thread writes the signal record and decides), then derive and export the
torch.distributed variables, set post-mortem / fail-fast defaults (each overridable by the person's
environment; the flight recorder too), choose the network interface, start the node's agent if no rank of the
node has (`node_live`: liveness and records per node), capture fds 1 and 2 into `attempt_<N>/<host>/rank_<R>.log`
(the one copy of the rank's output), tell start and exit records to the node's agent (`rank_state`: they end up
in the node's one file), run the script as `__main__`, and after the
preemption signal record `preempted` for the batch step, which requeues. The folders are the batch step's, made
before srun; a rank makes one only when it is missing (`--local`). With `--launcher torchrun` the task
is a per-node agent that runs torchrun in-process; each torchrun child re-enters here through
`python -m ddpslurm.launch.child`.

Process-group timeout: scripts call `init_process_group()` themselves; when they pass no timeout
the worker passes `DDPSLURM_PG_TIMEOUT` seconds (default 600) instead of torch's 10-30 minutes.
TORCH_NCCL_BLOCKING_WAIT is left alone (asynchronous error handling aborts failed collectives
without making every wait blocking); TORCH_DISTRIBUTED_DEBUG is never set (DETAIL segfaults DDP on
some torch versions).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import runpy
import signal
import socket
import sys
import time
import traceback
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from ddpslurm import jobfolder, preemption
from ddpslurm._version import __version__
from ddpslurm.launch import node_live, records, signals
from ddpslurm.launch.plan import (
    NCCL_TIMESTAMP_ENVS,
    NCCL_TIMESTAMP_MIN_VERSION,
    OLD_TORCH_ASYNC_ERROR_ENV,
    OLD_TORCH_BEFORE,
    WorkerConfig,
)
from ddpslurm.launch.rank_state import GraceExpired, RankState, on_alarm

__all__ = ["GraceExpired", "RankState", "Worker", "run_rank"]

CONFIG_ENV = "DDPSLURM_WORKER_CONFIG"
#: set by the batch step to the attempt folder it made (with the host folders and `checkpoints/`) before srun
FOLDERS_MADE_ENV = "DDPSLURM_FOLDERS_MADE"
ATTEMPT_START_ENV = "DDPSLURM_ATTEMPT_START"


@dataclass(frozen=True)
class Outcome:
    """How the script ended."""

    status: str  # records.STATUSES
    exit_code: int
    signal: str | None = None
    exception: dict[str, str] | None = None


class Worker:
    """The callable submitit runs on every Slurm task (or local process)."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config

    def __call__(self) -> int:
        if self.config.launcher == "torchrun":
            code = run_torchrun_agent(self.config)
        else:
            code = run_rank(self.config, self.config.launcher)
        if code:
            sys.exit(code)  # SystemExit passes through submitit: the task's exit status is the script's
        return 0


# --- environment -------------------------------------------------------------------------------------


def local_dist_env(environ: Mapping[str, str]) -> Any:
    """DistEnv of a process started by submitit's LocalExecutor (one host, MASTER_ADDR 127.0.0.1)."""
    from ddpslurm.env import DistEnv, master_port_for

    job_id = environ["SUBMITIT_LOCAL_JOB_ID"]
    world = int(environ.get("SUBMITIT_LOCAL_NTASKS", "1"))
    port = environ.get("MASTER_PORT", "").strip()
    return DistEnv(
        rank=int(environ["SUBMITIT_LOCAL_GLOBALID"]), local_rank=int(environ["SUBMITIT_LOCAL_LOCALID"]),
        world_size=world, local_world_size=world, node_rank=0, master_addr="127.0.0.1",
        master_port=int(port) if port.isdigit() else master_port_for(job_id),
        hostnames=(socket.gethostname(),), job_id=job_id, tasks_per_node=(world,),
    )


def torchrun_child_dist_env(environ: Mapping[str, str]) -> Any:
    """DistEnv of a torchrun child: ranks from torchrun's variables, job and hosts from Slurm's."""
    from ddpslurm.env import DistEnv
    from ddpslurm.scheduler.hostlist import expand_hostlist

    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or socket.gethostname()
    return DistEnv(
        rank=int(environ["RANK"]), local_rank=int(environ["LOCAL_RANK"]), world_size=int(environ["WORLD_SIZE"]),
        local_world_size=int(environ["LOCAL_WORLD_SIZE"]), node_rank=int(environ.get("GROUP_RANK", "0")),
        master_addr=environ["MASTER_ADDR"], master_port=int(environ["MASTER_PORT"]),
        hostnames=tuple(expand_hostlist(nodelist)), job_id=environ.get("SLURM_JOB_ID", "0"),
        step_id=environ.get("SLURM_STEP_ID"),
    )


def derive(launcher: str, environ: Mapping[str, str]) -> Any:
    """The DistEnv of this process for its launcher."""
    if launcher == "local":
        return local_dist_env(environ)
    if launcher == "torchrun":
        return torchrun_child_dist_env(environ)
    from ddpslurm.env import derive_dist_env

    return derive_dist_env(environ)


def apply_defaults(defaults: tuple[tuple[str, str], ...], environ: MutableMapping[str, str]) -> None:
    """Set each default unless the person's environment already has the variable."""
    for name, value in defaults:
        environ.setdefault(name, value)


def enable_faulthandler(environ: Mapping[str, str]) -> bool:
    """Honour PYTHONFAULTHANDLER set by `apply_defaults`: the interpreter reads it only at start-up.

    With it, a segfault or abort prints every thread's Python stack to fd 2, i.e. into the rank's log.
    """
    if not environ.get("PYTHONFAULTHANDLER"):
        return False
    import faulthandler

    faulthandler.enable(file=sys.stderr, all_threads=True)
    return True


def apply_interface(cfg: WorkerConfig, dist: Any, environ: MutableMapping[str, str]) -> None:
    """GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME only with --interface or --local): --interface wins, then
    the person's, then the interface that routes to the other nodes.

    NCCL is left to choose by itself: the routed interface is usually the management NIC, and forcing it
    would push NCCL's socket transport onto 1 GbE on Ethernet/RoCE clusters (NCCL prefers ib*, then the
    fastest non-loopback interface; NCCL_SOCKET_IFNAME does not steer the IB verbs transport anyway).
    """
    names = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
    if cfg.interface:
        environ.update(dict.fromkeys(names, cfg.interface))
        return
    if cfg.launcher == "local":
        for name in names:
            environ.setdefault(name, "lo")
        return
    if environ.get("GLOO_SOCKET_IFNAME"):
        return
    from ddpslurm.netif import choose_interface

    chosen = choose_interface(dist.hostnames, dist.node_rank, dist.master_addr)
    if chosen:
        environ.setdefault("GLOO_SOCKET_IFNAME", chosen)


def version_tuple(version: Any) -> tuple[int, ...]:
    """NCCL's version as torch gives it (a tuple; an int in old torch) as a tuple of ints, () when it is neither."""
    if isinstance(version, tuple):
        return tuple(int(v) for v in version)
    if isinstance(version, int):  # old torch: 2708 -> (2, 7, 8)
        return (version // 1000, version % 1000 // 100, version % 100)
    return ()


def versions_and_nccl_defaults(environ: MutableMapping[str, str]) -> dict[str, str | None]:
    """Python/torch/NCCL/ddpslurm versions; NCCL timestamps where NCCL supports them (CUDA builds only);
    the async error handling switch for torch < 2.2.

    CUDA is never initialized here (no `torch.cuda.is_available()`, which reads CUDA_VISIBLE_DEVICES once
    and for all): a script that sets CUDA_VISIBLE_DEVICES at its top must still be obeyed. The NCCL
    version comes from the library, not from a device. PYTORCH_NVML_BASED_CUDA_CHECK=1 makes the script's
    own early `is_available()` calls take the same care.
    """
    found: dict[str, str | None] = {"python": sys.version.split()[0], "torch": None, "nccl": None,
                                    "ddpslurm": __version__}
    environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    try:
        import torch
    except ImportError:
        return found
    found["torch"] = torch.__version__
    if tuple(int(p) for p in re.findall(r"\d+", torch.__version__)[:2]) < OLD_TORCH_BEFORE:
        environ.setdefault(*OLD_TORCH_ASYNC_ERROR_ENV)
    if torch.version.cuda:
        try:
            nccl = version_tuple(torch.cuda.nccl.version())
        except Exception:  # no NCCL in this build
            nccl = ()
        if nccl:
            found["nccl"] = ".".join(str(v) for v in nccl)
        if nccl >= NCCL_TIMESTAMP_MIN_VERSION:
            for name, value in NCCL_TIMESTAMP_ENVS:
                environ.setdefault(name, value)
    return found


#: The flight recorder (the recent collectives of every process group): on, and dumped on a collective timeout
#: into the attempt folder (torch's default is node-local /tmp). torch >= 2.6 reads the TORCH_FR_* names first.
FR_NEW_NAMES_FROM = (2, 6)
FR_BUFFER_ENTRIES = "2000"
FR_DUMP_PREFIX = "nccl_trace_rank_"


def flight_recorder_defaults(environ: MutableMapping[str, str], attempt_dir: Path, torch_version: str | None) -> None:
    """TORCH_NCCL_DUMP_ON_TIMEOUT=1, a 2000-entry buffer and dumps to `<attempt_dir>/nccl_trace_rank_<R>` (the rank's
    host folder; pickles:
    never unpickle untrusted ones), each unless the person's environment sets it under either of torch's names."""
    if torch_version is None:
        return
    new = tuple(int(p) for p in re.findall(r"\d+", torch_version)[:2]) >= FR_NEW_NAMES_FROM
    for new_name, old_name, value in (
            ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", FR_BUFFER_ENTRIES),
            ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(attempt_dir / FR_DUMP_PREFIX))):
        if new_name not in environ and old_name not in environ:
            environ[new_name if new else old_name] = value
    environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")


def patch_pg_timeout(environ: Mapping[str, str]) -> None:
    """Give init_process_group() a finite default timeout (DDPSLURM_PG_TIMEOUT seconds) when torch exists."""
    text = environ.get("DDPSLURM_PG_TIMEOUT", "").strip()
    if not text.isdigit() or int(text) <= 0:
        return
    try:
        import torch.distributed as tdist
        import torch.distributed.distributed_c10d as c10d
    except ImportError:
        return
    original = c10d.init_process_group
    if getattr(original, "_ddpslurm", False):
        return
    from datetime import timedelta

    default = timedelta(seconds=int(text))

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if len(args) < 3 and kwargs.get("timeout") is None:
            kwargs["timeout"] = default
        return original(*args, **kwargs)

    init_process_group._ddpslurm = True  # type: ignore[attr-defined]
    c10d.init_process_group = init_process_group
    tdist.init_process_group = init_process_group


# --- running the script ------------------------------------------------------------------------------


def _exception_info(error: BaseException) -> dict[str, str]:
    kind = type(error)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return {"type": name, "message": str(error),
            "traceback": "".join(traceback.format_exception(kind, error, error.__traceback__))}


def run_script(script: str, args: tuple[str, ...]) -> Outcome:
    """Run `script` as `__main__` with `args`, as `python script args...` would; never raises."""
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).parent))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as done:
        code = done.code
        if code is None or code == 0:
            return Outcome("ok", 0)
        if isinstance(code, int):
            return Outcome("exit", code)
        print(code, file=sys.stderr)
        return Outcome("exit", 1)
    except GraceExpired as error:
        print("ddpslurm: the script ignored the preemption flag for the grace period; stopping it",
              file=sys.stderr)
        return Outcome("exception", 1, exception=_exception_info(error))
    except KeyboardInterrupt:
        return Outcome("signal", 130, signal="SIGINT")
    except BaseException as error:
        traceback.print_exc()
        return Outcome("exception", 1, exception=_exception_info(error))
    return Outcome("ok", 0)


def ignore_late_preemption_signal() -> None:
    """The script has ended: a preemption signal from now on has nothing left to stop, so ignore it.

    Slurm's signal comes at a jittered time (up to 60 s early), often just as a job's last attempt
    finishes. Left to the Python handler it would requeue a finished job, and during interpreter
    shutdown, where Python puts SIG_DFL back for the signals it handled, it would kill the rank
    (status 140) and turn a completed job into a FAILED one. SIG_IGN survives shutdown.
    """
    signal.signal(preemption.PREEMPTION_SIGNAL, signal.SIG_IGN)


def _attempt_start(environ: MutableMapping[str, str]) -> float:
    return float(environ.setdefault(ATTEMPT_START_ENV, repr(time.time())))


def _job_dirs(cfg: WorkerConfig, job_id: str, attempt: int,
              environ: MutableMapping[str, str]) -> tuple[Path, Path]:
    """The job and attempt folders; made here only where the batch step did not make them (no metadata request
    per rank for folders that exist)."""
    job_dir = jobfolder.job_folder(cfg.folder, job_id)
    attempt_dir = jobfolder.attempt_folder(job_dir, attempt)
    if environ.get(FOLDERS_MADE_ENV) != str(attempt_dir):
        attempt_dir.mkdir(parents=True, exist_ok=True)
        jobfolder.checkpoints_folder(job_dir).mkdir(exist_ok=True)
    environ["DDPSLURM_JOB_FOLDER"] = str(job_dir)
    environ["DDPSLURM_ATTEMPT"] = str(attempt)
    return job_dir, attempt_dir


def _after_preemption(state: RankState, attempt_start: float, outcome: Outcome) -> None:
    """The script stopped after the signal: record `preempted` and whether the job should be requeued.

    The batch step (`ddpslurm.launch.batch`) requeues, once every rank has left this record.
    """
    from ddpslurm.launch.requeue import decide

    cfg = state.cfg
    signalled = state.signal_unix or time.time()
    decision = decide(elapsed_s=signalled - attempt_start, limit_s=cfg.time_limit_s,
                      signal_delay_s=cfg.signal_delay_s, attempt=state.attempt, max_requeues=cfg.max_requeues,
                      can_requeue=cfg.launcher != "local")
    forced = bool(outcome.exception and outcome.exception.get("type", "").endswith("GraceExpired"))
    if not decision.requeue:
        print(f"ddpslurm: {decision.reason.replace('_', ' ')} after attempt {state.attempt}: not requeued "
              f"(--max-requeues {cfg.max_requeues})", file=sys.stderr, flush=True)
    state.exit_record("preempted", decision.exit_code, reason=decision.reason, requeue=decision.requeue,
                      max_requeues=cfg.max_requeues, exception=outcome.exception, forced_stop=forced,
                      signal_unix=state.signal_unix, later_signals=list(state.later))


def install_signal_handling() -> signals.Inbox:
    """The first thing a rank does: ddpslurm's handlers in place of submitit's, before any I/O. SIGCONT (sent
    with every preemption SIGTERM) goes back to its default: submitit's handler logs from inside the handler."""
    inbox = signals.Inbox()
    signals.install(inbox)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGCONT, signal.SIG_DFL)
    return inbox


def start_node_link(environ: Mapping[str, str], dist: Any, attempt: int, attempt_dir: Path,
                    host: str) -> node_live.RankLink:
    """The rank's link to its node's agent, the agent forked first if no rank of the node has (before any thread
    and before the log tee: see `node_live.start_agent`)."""
    key = node_live.local_key(dist.job_id, environ.get("SLURM_STEP_ID"), attempt, host)
    fallback = jobfolder.host_folder(attempt_dir, host) / f".live.{jobfolder.folder_host(key)}"
    local = node_live.local_folder(environ, key, fallback)
    hang = jobfolder.hang_path(attempt_dir) if environ.get("DDPSLURM_HEARTBEAT_S") else None
    interval = node_live.node_interval_s(len(set(dist.hostnames)) or 1, environ)
    link = node_live.RankLink(local, dist.rank, dist.local_rank)
    link.publish(progress=None)  # the rank is here: the agent waits for it
    node_live.start_agent(local, jobfolder.node_file_path(attempt_dir, host), host, dist.local_world_size,
                          interval, hang)
    return link


def run_rank(cfg: WorkerConfig, launcher: str) -> int:
    """Run the user's script as one rank; returns the exit status."""
    inbox = install_signal_handling()
    from ddpslurm.launch.tee import FdTee

    environ = os.environ
    attempt_start = _attempt_start(environ)
    dist = derive(launcher, environ)
    from ddpslurm.env import export_dist_env

    export_dist_env(dist, environ)
    apply_defaults(cfg.env_defaults, environ)
    apply_interface(cfg, dist, environ)
    attempt = int(environ.get("SLURM_RESTART_COUNT", "0") or 0)
    _, attempt_dir = _job_dirs(cfg, dist.job_id, attempt, environ)
    host = node_live.node_name(environ)
    paths = jobfolder.rank_paths(attempt_dir, dist.rank, host)
    link = start_node_link(environ, dist, attempt, attempt_dir, host)
    tee = FdTee(paths["log"], passthrough=False)
    tee.start()
    enable_faulthandler(environ)
    from ddpslurm.env import binding_warnings

    for text in binding_warnings(environ, dist.local_world_size):
        print(f"ddpslurm: warning: rank {dist.rank}: {text}", file=sys.stderr, flush=True)
    state = RankState(cfg, dist, attempt, paths, tee, link)
    signals.Dispatcher(inbox, state.on_signal, state.on_wake).start()  # with the signals noted until now
    try:
        versions = versions_and_nccl_defaults(environ)
        flight_recorder_defaults(environ, paths["log"].parent, versions.get("torch"))
        patch_pg_timeout(environ)
        now = time.time()
        state.start_record(records.start_record(  # to the node's agent: into node_<host>.json
            rank=dist.rank, local_rank=dist.local_rank, node_rank=dist.node_rank, world_size=dist.world_size,
            local_world_size=dist.local_world_size, host=socket.gethostname(), pid=os.getpid(),
            job_id=dist.job_id, step_id=environ.get("SLURM_STEP_ID"), attempt=attempt, launcher=launcher,
            master_addr=dist.master_addr, master_port=dist.master_port, unix=now, versions=versions,
            env=records.selected_env(environ)))
        from ddpslurm.launch import heartbeat

        heartbeat.start(environ, state)  # only with --hang-timeout (DDPSLURM_HEARTBEAT_S)
        outcome = run_script(cfg.script, cfg.script_args)
        signalled_while_running = state.end_script(inbox.arrivals)  # no signal ends the rank from here on
        signal.alarm(0)
        ignore_late_preemption_signal()
        if signalled_while_running and outcome.status != "signal":
            # Once Slurm announced the end, peers leave at slightly different steps and a rank may die in
            # a collective: the job is still requeued; the record keeps the exception for post-mortems.
            _after_preemption(state, attempt_start, outcome)
        else:
            if outcome.status != "ok":
                print(f"ddpslurm: rank {dist.rank} on {socket.gethostname()} ended: {outcome.status} "
                      f"(exit code {outcome.exit_code})", file=sys.stderr, flush=True)
            state.exit_record(outcome.status, outcome.exit_code, signal=outcome.signal,
                              exception=outcome.exception)
        return state.final_code or 0
    finally:
        signal.alarm(0)
        state.flush()
        tee.stop()


# --- torchrun ----------------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1] == str(pid):
            out.append(int(entry))
    return out


def _forward(signum: int) -> None:
    """Forward the preemption signal to torchrun's children (the agent does not handle it)."""
    for child in _children(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(child, signum)


def config_to_env(cfg: WorkerConfig) -> str:
    return json.dumps(asdict(cfg))


def config_from_env(text: str) -> WorkerConfig:
    data = json.loads(text)
    data["script_args"] = tuple(data["script_args"])
    data["env_defaults"] = tuple(tuple(pair) for pair in data["env_defaults"])
    return WorkerConfig(**data)


def torchrun_argv(cfg: WorkerConfig, environ: Mapping[str, str]) -> list[str]:
    """torchrun's argv for this node: Slurm-derived c10d rendezvous, children through ddpslurm's child entry."""
    from ddpslurm.env import derive_torchrun_args
    from ddpslurm.launch.torchrun_agent import elastic_argv, join_timeout

    args = derive_torchrun_args(environ, cfg.tasks_per_node)
    rendezvous = elastic_argv(args.argv(), nodes_in_step=args.nnodes, max_restarts=cfg.max_restarts,
                              min_nodes=cfg.min_nodes, join_timeout_s=join_timeout(environ))
    return [*rendezvous, "--module", "ddpslurm.launch.child", cfg.script, *cfg.script_args]


def keep_agent_through_sigterm(inbox: signals.Inbox) -> None:
    """torchrun's agent turns SIGTERM into an exception that stops the ranks at once; Slurm SIGTERMs the agent
    and its ranks together (preemption, requeue, scancel). The agent only notes it: each rank decides for
    itself (the first SIGTERM is its preemption flag; a later one is obeyed only by a rank that has not read
    the flag), and the agent ends when its ranks have; Slurm's SIGKILL after KillWait stays the backstop.
    Other signals stop it as before. A torch without this private handler is left alone."""
    try:
        from torch.distributed.elastic.multiprocessing import api
    except ImportError:
        return
    original = getattr(api, "_terminate_process_handler", None)
    if original is None or getattr(original, "_ddpslurm", False):
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGTERM:
            inbox.handler(signum, frame)
            return
        original(signum, frame)

    handler._ddpslurm = True  # type: ignore[attr-defined]
    api._terminate_process_handler = handler


def agent_on_signal(signum: int, unix: float) -> None:
    """The agent's dispatcher: forward USR2 to the ranks (Slurm's --signal reaches the agent), say what a SIGTERM
    does (nothing to the agent)."""
    if signum == preemption.PREEMPTION_SIGNAL:
        _forward(signum)
    else:
        print(f"ddpslurm: torchrun agent got {signal.Signals(signum).name}: its ranks got it too and decide "
              "(the first one is their preemption flag); waiting for them", file=sys.stderr, flush=True)


def _install_restart_hooks(cfg: WorkerConfig, environ: Mapping[str, str], job_id: str, attempt: int,
                           attempt_dir: Path) -> None:
    """torchrun's in-place restarts, recorded per node (`ddpslurm.launch.torchrun_agent`); only with --max-restarts
    or --nodes MIN:MAX (a plain torchrun job never restarts: its first failure ends the step)."""
    if not cfg.max_restarts and not cfg.min_nodes:
        return
    from ddpslurm.launch.torchrun_agent import install_restart_hooks, join_timeout

    host = node_live.node_name(environ)
    key = node_live.local_key(job_id, environ.get("SLURM_STEP_ID"), attempt, host)
    fallback = jobfolder.host_folder(attempt_dir, host) / f".live.{jobfolder.folder_host(key)}"
    install_restart_hooks(host_dir=jobfolder.host_folder(attempt_dir, host), host=host,
                          max_restarts=cfg.max_restarts, node_file=jobfolder.node_file_path(attempt_dir, host),
                          node_local=node_live.local_folder(environ, key, fallback), min_nodes=cfg.min_nodes,
                          join_timeout_s=join_timeout(environ))


def run_torchrun_agent(cfg: WorkerConfig) -> int:
    """One task per node: run torchrun in this process; ranks write their own records and logs."""
    inbox = install_signal_handling()
    from ddpslurm.env import derive_dist_env

    environ = os.environ
    _attempt_start(environ)
    node = derive_dist_env(environ)
    apply_defaults(cfg.env_defaults, environ)
    apply_interface(cfg, node, environ)
    attempt = int(environ.get("SLURM_RESTART_COUNT", "0") or 0)
    _, attempt_dir = _job_dirs(cfg, node.job_id, attempt, environ)
    environ[CONFIG_ENV] = config_to_env(cfg)
    _install_restart_hooks(cfg, environ, node.job_id, attempt, attempt_dir)
    argv = torchrun_argv(cfg, environ)
    signals.Dispatcher(inbox, agent_on_signal).start()
    print(f"ddpslurm: node {node.node_rank} ({socket.gethostname()}): torchrun {' '.join(argv)}",
          file=sys.stderr, flush=True)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    keep_agent_through_sigterm(inbox)

    try:
        try:
            torchrun_main(argv)
        finally:
            ignore_late_preemption_signal()
    except ChildFailedError as failed:
        print(f"ddpslurm: torchrun on node {node.node_rank}: {failed}", file=sys.stderr, flush=True)
        return 1
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0
