"""torchrun's side of in-place restarts and node ranges: its argv (pure) and the agent's restart hooks.

`elastic_argv` turns the Slurm-derived rendezvous options into those of `--max-restarts N` and `--nodes MIN:MAX`:
`--nnodes MIN:<nodes of the step>` (Slurm never grows an allocation, so the step's node count is the most that can
ever join, and the first rendezvous closes as soon as they all have), no `--node-rank` (c10d numbers the nodes of
every round, which a lost node would leave with a gap), `--max-restarts N`. The c10d endpoint stays the first node
of the step, where the rendezvous store lives: Slurm's `--no-kill` keeps that one as long as the step. With a
node range also `--rdzv-conf=join_timeout=S` (`below_min.join_timeout_s`): below MIN nodes the agents give up
after S s, not torchrun's 600, and the batch step requeues the job (`ddpslurm.launch.below_min`).

`install_restart_hooks` changes three things in torch's LocalElasticAgent, in the per-node agent process only:
- a restart stops the old workers with SIGKILL, not SIGTERM: a ddpslurm rank takes its first SIGTERM for Slurm's
  preemption notice (checkpoint, exit, requeue the job), which would turn every restart into a requeue, and a
  worker stuck in a collective with a dead peer would hold the restart for torchrun's 30 s stop timeout;
- before the workers of restart K start, the node's rank files of restart K-1 go to `<host>/restart_<K-1>/` and
  `<host>/restarts.json` gets an entry (`ddpslurm.launch.restarts`);
- the workers get DDPSLURM_RESTART_COUNT (restarts so far, on every node the same: each restart re-runs the
  rendezvous of every node once) and DDPSLURM_MAX_RESTARTS;
- TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (unless set): with the default sharing, the workers of every round meet
  in the agent's one TCPStore (`DynamicRendezvousHandler` creates it once; `_create_c10d_store` adds no per-round
  prefix), so the restarted ranks can read the dead ranks' gloo/NCCL addresses of the round before and fail with
  "Connection refused"; unshared, each round's rank 0 hosts a store of its own on a fresh port.
- with a node range, an agent whose rendezvous ends in RendezvousTimeoutError (fewer than MIN nodes) or
  RendezvousClosedError writes `<host>/rendezvous_gave_up.json` for the batch step before torch's error goes on.
The final stop (no restart left, or the job's end) is torch's own.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from ddpslurm.launch import below_min, restarts

_ELASTIC_DROPPED = ("--nnodes=", "--node-rank=")
#: torch's switch for a rendezvous store per round (see the module's docstring)
UNSHARED_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def elastic_argv(base: Sequence[str], *, nodes_in_step: int, max_restarts: int, min_nodes: int,
                 join_timeout_s: int = below_min.DEFAULT_JOIN_TIMEOUT_S) -> list[str]:
    """torchrun's rendezvous options for in-place restarts (`max_restarts`) and a node range (`min_nodes` > 0, with
    the rendezvous' `join_timeout`), from the fixed-size ones `base` (`TorchrunArgs.argv()`), `--max-restarts`
    last (0: torchrun's failure ends the step, as without restarts). Pure."""
    out = list(base)
    if min_nodes:
        low = min(min_nodes, nodes_in_step)
        out = [f"--nnodes={low}:{nodes_in_step}", *(a for a in out if not a.startswith(_ELASTIC_DROPPED)),
               f"--rdzv-conf=join_timeout={join_timeout_s}"]
    return [*out, f"--max-restarts={max_restarts}"]


def join_timeout(environ: Mapping[str, str]) -> int:
    """`below_min.join_timeout_s`; a bad $DDPSLURM_RDZV_JOIN_TIMEOUT_S is said in one line and the default used."""
    try:
        return below_min.join_timeout_s(environ)
    except ValueError as error:
        print(f"ddpslurm: {error}; using {below_min.DEFAULT_JOIN_TIMEOUT_S}s", file=sys.stderr, flush=True)
        return below_min.DEFAULT_JOIN_TIMEOUT_S


def shown_argv(*, min_nodes: int, max_nodes: int, max_restarts: int) -> str:
    """The torchrun options `--dry-run` shows for a node range and restarts (the values the agent derives named)."""
    nnodes = (f"--nnodes={min_nodes}:<nodes Slurm gave, {min_nodes}..{max_nodes}>" if min_nodes
              else f"--nnodes={max_nodes} --node-rank=<SLURM_NODEID>")
    return (f"torchrun {nnodes} --nproc-per-node=<tasks per node> --rdzv-backend=c10d "
            f"--rdzv-endpoint=<first node of the step>:<MASTER_PORT> --rdzv-id=<job id> "
            + (f"--rdzv-conf=join_timeout=<${below_min.JOIN_TIMEOUT_ENV} or {below_min.DEFAULT_JOIN_TIMEOUT_S}> "
               if min_nodes else "")
            + f"--max-restarts={max_restarts}")


def _failed_ranks(result: Any) -> list[dict[str, Any]]:
    """The failed workers of torch's last RunResult as plain values (rank, exit code, signal)."""
    out = []
    for rank, failure in sorted((getattr(result, "failures", None) or {}).items()):
        code = getattr(failure, "exitcode", None)
        entry: dict[str, Any] = {"rank": rank, "exit_code": code}
        if isinstance(code, int) and code < 0:
            with contextlib.suppress(ValueError):
                entry["signal"] = signal.Signals(-code).name
        out.append(entry)
    return out


def _clear_node_local(local: Path | None) -> None:
    """The old workers' states in the node-local folder (the new workers may get other rank numbers)."""
    if local is None:
        return
    with contextlib.suppress(OSError):
        for name in os.listdir(local):
            if name.startswith("rank_") and name.endswith(".json"):
                with contextlib.suppress(OSError):
                    os.unlink(local / name)


def _record_restart(agent: Any, count: int, *, host_dir: Path, host: str, max_restarts: int,
                    node_file: Path | None, node_local: Path | None) -> None:
    """Before restart `count`'s workers start: the previous workers' files set aside, the restart recorded in
    `<host>/restarts.json` and said on the agent's stderr."""
    moved = restarts.set_aside(host_dir, count - 1, node_file)
    _clear_node_local(node_local)
    reason = getattr(agent, "_ddpslurm_reason", restarts.WORKER_FAILED)
    failed = _failed_ranks(getattr(agent, "_ddpslurm_result", None)) if reason == restarts.WORKER_FAILED else []
    try:
        restarts.append_record(host_dir, restarts.restart_entry(
            restart=count, max_restarts=max_restarts, host=host, reason=reason, failed=failed, moved=moved))
    except OSError as error:
        print(f"ddpslurm: cannot record restart {count} in {host_dir}: {error}", file=sys.stderr, flush=True)
    print(f"ddpslurm: torchrun on {host}: restart {count} of at most {max_restarts} "
          f"({reason.replace('_', ' ')}); the previous workers' files are in "
          f"{restarts.restart_folder(host_dir, count - 1)}", file=sys.stderr, flush=True)


def _record_gave_up(agent: Any, error: BaseException, *, host_dir: Path, host: str, min_nodes: int,
                    join_timeout_s: int) -> None:
    """The rendezvous gave up (too few nodes within the join timeout, or another node gave up): recorded for the
    batch step, which requeues the job, and said on the agent's stderr."""
    below_min.write_gave_up(host_dir, below_min.gave_up_entry(
        host=host, error_type=type(error).__name__, message=str(error), min_nodes=min_nodes,
        join_timeout=join_timeout_s, starts=getattr(agent, "_ddpslurm_starts", 0)))
    print(f"ddpslurm: torchrun on {host}: the rendezvous gave up ({type(error).__name__}): fewer than "
          f"--nodes MIN {min_nodes} nodes within {join_timeout_s}s, or another node gave up; the batch "
          "step requeues the job", file=sys.stderr, flush=True)


def _agent_class(names: Sequence[str]) -> Any:
    """torch's LocalElasticAgent when this torch has it with every method `names`; else None."""
    try:
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    except ImportError:
        return None
    return LocalElasticAgent if all(hasattr(LocalElasticAgent, name) for name in names) else None


def install_restart_hooks(*, host_dir: Path, host: str, max_restarts: int, node_file: Path | None = None,
                          node_local: Path | None = None, environ: MutableMapping[str, str] | None = None,
                          min_nodes: int = 0, join_timeout_s: int = below_min.DEFAULT_JOIN_TIMEOUT_S) -> bool:
    """Patch torch's LocalElasticAgent in this process (see the module's docstring); False where this torch lacks
    the methods (nothing patched). `min_nodes` > 0: a node range, whose rendezvous give-ups are recorded."""
    names = ("_start_workers", "_stop_workers", "_restart_workers", "_monitor_workers", "_shutdown", "_rendezvous")
    LocalElasticAgent = _agent_class(names)
    if LocalElasticAgent is None or getattr(LocalElasticAgent._start_workers, "_ddpslurm", False):
        return LocalElasticAgent is not None
    env = os.environ if environ is None else environ
    env.setdefault(UNSHARED_STORE_ENV, "1")
    original = {name: getattr(LocalElasticAgent, name) for name in names}

    def monitor(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original["_monitor_workers"](self, *args, **kwargs)
        self._ddpslurm_result = result
        return result

    def restart(self: Any, worker_group: Any, *args: Any, **kwargs: Any) -> Any:
        state = getattr(getattr(worker_group, "state", None), "name", "")
        self._ddpslurm_reason = restarts.MEMBERSHIP_CHANGED if state == "HEALTHY" else restarts.WORKER_FAILED
        self._ddpslurm_restarting = True
        try:
            return original["_restart_workers"](self, worker_group, *args, **kwargs)
        finally:
            self._ddpslurm_restarting = False

    def stop(self: Any, worker_group: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_ddpslurm_restarting", False):
            return self._shutdown(signal.SIGKILL)
        return original["_stop_workers"](self, worker_group, *args, **kwargs)

    def start(self: Any, worker_group: Any, *args: Any, **kwargs: Any) -> Any:
        count = getattr(self, "_ddpslurm_starts", 0)
        self._ddpslurm_starts = count + 1
        if count:
            _record_restart(self, count, host_dir=host_dir, host=host, max_restarts=max_restarts,
                            node_file=node_file, node_local=node_local)
        env[restarts.RESTART_ENV] = str(count)  # the workers inherit the agent's environment
        env[restarts.MAX_RESTARTS_ENV] = str(max_restarts)
        return original["_start_workers"](self, worker_group, *args, **kwargs)

    def rendezvous(self: Any, worker_group: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original["_rendezvous"](self, worker_group, *args, **kwargs)
        except Exception as error:
            if min_nodes and below_min.kind_of(type(error).__name__):
                _record_gave_up(self, error, host_dir=host_dir, host=host, min_nodes=min_nodes,
                                join_timeout_s=join_timeout_s)
            raise

    for name, new in (("_monitor_workers", monitor), ("_restart_workers", restart), ("_stop_workers", stop),
                      ("_start_workers", start), ("_rendezvous", rendezvous)):
        wrapped = functools.wraps(original[name])(new)
        wrapped._ddpslurm = True  # type: ignore[attr-defined]
        setattr(LocalElasticAgent, name, wrapped)
    return True
