"""Shared fixtures. The `slurm_cluster` fixture gives integration tests a real Slurm cluster.

The cluster is `slurm/cluster --name $DDPSLURM_TEST_CLUSTER` (default `test`; under pytest-xdist each worker past
the first has its own, `<name><N>`: scripts/run-tests runs the Slurm tests in two streams). If it is already up,
it is used as is; otherwise the fixture brings it up (root needed) and down again at the end of the
session. Without root or without Slurm installed the integration tests skip, except in CI
(`CI=true`), where a missing cluster is a failure: CI must never skip them.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CLUSTER_SCRIPT = REPO / "slurm" / "cluster"


def _worker_cluster(base: str, worker: str | None) -> str:
    """The cluster of one pytest-xdist worker (`gw0`, `gw1`, ...): the first keeps `base`, the others `<base><N>`, so
    that side-by-side streams of Slurm tests never share a cluster's nodes. Pure."""
    number = worker[2:] if worker and worker.startswith("gw") else ""
    return f"{base}{number}" if number.isdigit() and number != "0" else base


TEST_CLUSTER = _worker_cluster(os.environ.get("DDPSLURM_TEST_CLUSTER", "test"), os.environ.get("PYTEST_XDIST_WORKER"))
TEST_NODES = int(os.environ.get("DDPSLURM_TEST_NODES", "3"))


@dataclass
class SlurmCluster:
    """A running local cluster: its name and the environment that makes Slurm clients talk to it."""

    name: str
    env: dict[str, str] = field(default_factory=dict)

    def cluster(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run `slurm/cluster --name NAME ARGS...`."""
        return subprocess.run(
            [str(CLUSTER_SCRIPT), "--name", self.name, *args],
            env=self.env, capture_output=True, text=True, check=check, timeout=timeout,
        )

    def run(self, argv: list[str], check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        """Run a command (sbatch, srun, ddpslurm, ...) with the cluster's environment."""
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, check=check,
                              timeout=timeout, **kw)


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"the Slurm cluster is required in CI: {reason}")
    pytest.skip(reason)


def _cluster_env(name: str) -> dict[str, str]:
    out = subprocess.run([str(CLUSTER_SCRIPT), "--name", name, "env"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    env = dict(os.environ)
    for line in out.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, _, value = words[1].partition("=")
            env[key] = value
    return env


@pytest.fixture(scope="session")
def slurm_cluster_named() -> Callable[[str], SlurmCluster]:
    """`name -> SlurmCluster` for a cluster a test brings up and down itself (e.g. `downtest`)."""
    return lambda name: SlurmCluster(name, _cluster_env(name))


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A real multi-node Slurm cluster (see slurm/), up for the whole test session."""
    if os.geteuid() != 0:
        _unavailable("the local Slurm cluster needs root")
    if shutil.which("slurmctld", path="/usr/sbin:/usr/bin:" + os.environ.get("PATH", "")) is None:
        _unavailable("Slurm is not installed: run `slurm/cluster install`")
    already_up = subprocess.run([str(CLUSTER_SCRIPT), "--name", TEST_CLUSTER, "status"],
                                capture_output=True, text=True, timeout=60).returncode == 0
    if not already_up:
        up = subprocess.run([str(CLUSTER_SCRIPT), "--name", TEST_CLUSTER, "up", "--nodes", str(TEST_NODES)],
                            capture_output=True, text=True, timeout=300)
        if up.returncode != 0:
            pytest.fail(f"slurm/cluster up failed:\n{up.stdout}\n{up.stderr}")
    cluster = SlurmCluster(TEST_CLUSTER, _cluster_env(TEST_CLUSTER))
    try:
        yield cluster
    finally:
        if not already_up:
            subprocess.run([str(CLUSTER_SCRIPT), "--name", TEST_CLUSTER, "down"], capture_output=True,
                           timeout=300)
