"""A port the job's own processes collide on (`[[port_in_use.shapes]]` in analyzer/causes.toml): several processes
of one job each failing to host the store on one port is a launch configuration error (retry stop, launcher
advice); one process failing on it is a port another job holds (the cause's requeue). Tasks renumbered, hosts
renamed, ports changed, noise lines added: the answer follows the shape, not the numbers."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.model import Event
from ddpslurm.analyze.rules.cause_shapes import CauseShape, reporters, shape_of
from ddpslurm.analyze.rules.loading import load_signatures
from ddpslurm.errors import AnalyzeInputError


@pytest.fixture(scope="module")
def sigs():
    return load_signatures(use_env=False)


def bind_failure(port: int, wording: str) -> list[str]:
    """c10d's store-bind failure (torch/csrc/distributed/c10d/socket.cpp) as torchrun's agent prints it."""
    if wording == "libuv":  # torch 2.4+: TCPStoreLibUvBackend
        return ["Traceback (most recent call last):",
                '  File "/usr/local/bin/torchrun", line 8, in <module>',
                "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
                f"address. port: {port}, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use"]
    return [f"[W socket.cpp:426] [c10d] The server socket has failed to bind to [::]:{port} (errno: 98 - Address "
            "already in use).",
            f"[W socket.cpp:426] [c10d] The server socket has failed to bind to 0.0.0.0:{port} (errno: 98 - Address "
            "already in use).",
            "[E socket.cpp:462] [c10d] The server socket has failed to listen on any local network address.",
            "Traceback (most recent call last):",
            '  File "/opt/conda/bin/torchrun", line 33, in <module>',
            "RuntimeError: The server socket has failed to listen on any local network address. The server socket "
            f"has failed to bind to [::]:{port} (errno: 98 - Address already in use)."]


NOISE = ("WARNING:torch.distributed.run:", "*****************************************",
         "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default")


def slurm_out(tmp_path: Path, failing: int, wording: str, seed: int, ports: list[int] | None = None) -> Path:
    """A `srun --label` slurm-JOB.out: `failing` tasks of one node fail to bind (one port, or `ports` per task),
    the others print only a launcher's notices; task ids, host, port and line order chosen by `seed`."""
    rng = random.Random(seed)
    host = rng.choice(("gpu-n01", "dgx-a100-07", "node0412"))
    tasks = rng.sample(range(16), failing + rng.randrange(1, 3))
    port = rng.randrange(20000, 40000)
    blocks = [[f"{t}: {line}" for line in rng.sample(NOISE, 2)] for t in tasks]
    for i, t in enumerate(tasks[:failing]):
        blocks[i] += [f"{t}: {line}" for line in bind_failure(ports[i] if ports else port, wording)]
    rng.shuffle(blocks)
    lines = [line for block in blocks for line in block]
    lines += [f"srun: error: {host}: task {t}: Exited with exit code 1" for t in tasks[:failing]]
    path = tmp_path / f"slurm-{rng.randrange(1000, 99999)}.out"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("wording", ["socket.cpp", "libuv"])
@pytest.mark.parametrize(("failing", "seed"), [(2, 1), (3, 2), (7, 3)])
def test_several_tasks_on_one_port_is_a_launch_error(tmp_path: Path, sigs, wording: str, failing: int,
                                                     seed: int) -> None:
    d = analyze_paths([slurm_out(tmp_path, failing, wording, seed)], signatures=sigs)
    assert (d.cause, d.retry, d.exclude_nodes, d.first_failing_rank) == ("port_in_use", "stop", [], None)
    assert d.summary.startswith(f"{failing} processes of the job each tried to host the rendezvous store on port")
    said = " ".join(d.advice)
    assert "--ntasks-per-node=1" in said and "SLURM_NODEID" in said
    assert "leftover processes" not in said  # the cause's advice, about another job's port, does not apply


@pytest.mark.parametrize("wording", ["socket.cpp", "libuv"])
def test_one_process_on_a_taken_port_is_another_jobs_port(tmp_path: Path, sigs, wording: str) -> None:
    d = analyze_paths([slurm_out(tmp_path, 1, wording, 4)], signatures=sigs)
    assert (d.cause, d.retry) == ("port_in_use", "requeue")
    assert any("leftover processes" in a for a in d.advice)


def test_tasks_on_different_ports_are_not_one_collision(tmp_path: Path, sigs) -> None:
    d = analyze_paths([slurm_out(tmp_path, 2, "socket.cpp", 5, ports=[29500, 29501])], signatures=sigs)
    assert (d.cause, d.retry) == ("port_in_use", "requeue")


def test_ranks_of_one_job_each_hosting_the_store(tmp_path: Path, sigs) -> None:
    """Every rank making a store server (RANK the same everywhere): torch >= 2.2's `[rankN]:` prefix."""
    lines = [f"[rank{r}]: torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
             "network address. port: 29511, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use"
             for r in (5, 2)]
    log = tmp_path / "train.log"
    log.write_text("\n".join(["[rank5]: step 0", *lines]) + "\n")
    d = analyze_paths([log], signatures=sigs)
    assert (d.cause, d.retry) == ("port_in_use", "stop") and "port 29511" in d.summary


def event(rank: int | None = None, pid: int | None = None, host: str | None = None, task: str | None = None,
          port: str | None = "29500", role: str = "culprit", cause: str = "port_in_use") -> Event:
    fields = tuple((k, v) for k, v in (("port", port), ("srun_task", task)) if v is not None)
    return Event(file="f", line=1, kind="socket", text="x", rank=rank, host=host, pid=pid, cause=cause, role=role,
                 fields=fields)


def test_one_process_named_two_ways_is_one_reporter() -> None:
    same = [event(rank=0), event(rank=0, pid=71, host="n1"), event(pid=71, host="n1"), event(task="0")]
    assert reporters(same, "port_in_use", "port") == {"29500": (1, ("n1",))}
    two = [*same, event(task="3"), event(cause="cuda_oom", task="4"), event(role="victim", task="5"),
           event(task="6", port=None)]
    assert reporters(two, "port_in_use", "port")["29500"][0] == 2
    shape = CauseShape(id="s", same_field="port", reporters_at_least=3)
    assert shape_of([shape], two, "port_in_use") is None
    assert shape_of([shape], [*two, event(task="9")], "port_in_use").reporters == 3


@pytest.mark.parametrize(("table", "said"), [
    ("id = 'x'\nsame_field = 'port'\nreporters_at_least = 1\n", "reporters_at_least"),
    ("id = 'x'\nsame_field = 'port'\nretry = 'soon'\n", "retry"),
    ("id = 'x'\nsame_field = 'port'\ncolour = 'red'\n", "unknown key"),
    ("id = 'x'\nsame_field = 'not a field'\n", "same_field"),
    ("same_field = 'port'\n", "id"),
])
def test_a_bad_shape_is_one_clear_error(tmp_path: Path, table: str, said: str) -> None:
    (tmp_path / "causes.toml").write_text(f"[[port_in_use.shapes]]\n{table}")
    with pytest.raises(AnalyzeInputError) as raised:
        load_signatures([tmp_path], use_env=False)
    assert said in str(raised.value) and "port_in_use.shapes" in str(raised.value)
