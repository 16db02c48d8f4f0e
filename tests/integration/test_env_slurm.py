"""env.py and hostlist against the real thing: Slurm's own hostlist code, and real srun steps that
rendezvous with torch.distributed gloo using nothing but `derive_dist_env` + `export_dist_env`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ddpslurm.scheduler.hostlist import expand_hostlist

pytestmark = pytest.mark.slurm

EXPRESSIONS = ["rack[1-2]-n[01-02]", "a[1-2],b3,c[05-06]", "n[008-011]", "gpu[01-04,07]", "n[9-11]", "node[3,1]",
               "x1,x1", "a1 b2", "host-1.example.com", "n[098-101],m[1-3,5,7-8]"]


@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_expansion_matches_scontrol_show_hostnames(slurm_cluster, expression: str) -> None:
    slurm = slurm_cluster.run(["scontrol", "show", "hostnames", expression]).stdout.split()
    assert expand_hostlist(expression) == slurm


def test_slurm_compressed_lists_expand_back(slurm_cluster) -> None:
    hosts = ["n3", "n1", "n2", "n10", "gpu01", "gpu02", "gpu07", "h-x"]
    compressed = slurm_cluster.run(["scontrol", "show", "hostlist", ",".join(hosts)]).stdout.strip()
    assert sorted(expand_hostlist(compressed)) == sorted(hosts)


RANK_SCRIPT = """
import json, os, socket
from datetime import timedelta
from ddpslurm.env import derive_dist_env, export_dist_env
d = derive_dist_env(os.environ)
export_dist_env(d, os.environ)
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
t = torch.tensor([d.rank + 1])
dist.all_reduce(t)
print(json.dumps({"rank": d.rank, "world": dist.get_world_size(), "sum": int(t.item()), "host": socket.gethostname(),
                  "master": d.master_addr, "local_rank": d.local_rank, "local_world_size": d.local_world_size}))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_real_steps_rendezvous_with_derived_env(slurm_cluster, tmp_path: Path) -> None:
    """Step 0 runs on the last two of three job nodes (rank 0 is NOT on the job's first host,
    Lightning#17228); step 1 has uneven tasks per node. Both must all-reduce over gloo."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    py = sys.executable
    batch = (f"srun -N2 -n2 -r1 --output={tmp_path}/s0_%t.out {py} {script} && "
             f"srun -N3 -n4 --output={tmp_path}/s1_%t.out {py} {script}")
    done = slurm_cluster.run(["sbatch", "--wait", "--parsable", "-N3", "-n4", "--cpus-per-task=1",
                              f"--output={tmp_path}/batch.out", f"--wrap={batch}"], check=False, timeout=400)
    batch_log = (tmp_path / "batch.out").read_text() if (tmp_path / "batch.out").exists() else ""
    assert done.returncode == 0, batch_log + done.stderr
    job_nodes = expand_hostlist(slurm_cluster.run(["squeue", "--noheader", "--states=all", "--format=%N",
                                                   f"--jobs={done.stdout.strip()}"]).stdout.strip())
    for step, world in (("s0", 2), ("s1", 4)):
        ranks = []
        for path in sorted(tmp_path.glob(f"{step}_*.out")):
            ranks += [json.loads(ln) for ln in path.read_text().splitlines() if ln.startswith("{")]
        by_rank = {r["rank"]: r for r in ranks}
        assert sorted(by_rank) == list(range(world))
        assert {r["sum"] for r in ranks} == {world * (world + 1) // 2}
        assert {r["master"] for r in ranks} == {by_rank[0]["host"]}
        for r in ranks:
            assert r["local_world_size"] == sum(1 for o in ranks if o["host"] == r["host"])
        if step == "s0":
            assert by_rank[0]["host"] != job_nodes[0]  # the case a job-nodelist derivation gets wrong
