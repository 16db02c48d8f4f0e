"""Host names come only from places that carry host names: a script's own head (`GPU3: `, `Epoch1: `, `worker0: `,
`[rank7] `) has the shape of pdsh's `node02: ` and is a host only where the job names that host elsewhere (NCCL's
`host:pid:tid` head, srun's lines). Heads renamed, hosts renamed, noise lines added: never a host from a tag alone,
and never one lost where the job names it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.model import Event
from ddpslurm.analyze.parse.attribution import strip_prefixes
from ddpslurm.analyze.parse.tag_hosts import HOST_TAG, settle_hosts
from ddpslurm.analyze.rules.loading import load_signatures

#: heads scripts put in front of their own lines
SCRIPT_HEADS = ("GPU3: ", "Epoch1: ", "worker0: ", "[rank7] ", "Step10: ", "gpu1: ", "[trainer-2] ")
#: a node-level failure (a GPU's ECC fault: the node goes to exclude_nodes when it is known)
ECC = ["Traceback (most recent call last):", '  File "train.py", line 88, in <module>', "    loss.backward()",
       "RuntimeError: CUDA error: uncorrectable ECC error encountered"]
NOISE = ("loss 0.5213 lr 3e-4", "Saving checkpoint to ckpt/step_200.pt", "100%|##########| 50/50 [00:04<00:00]")


@pytest.fixture(scope="module")
def sigs():
    return load_signatures(use_env=False)


def script_log(tmp_path: Path, head: str, seed: int, every_line: bool) -> Path:
    rng = random.Random(seed)
    lines = [head + rng.choice(NOISE) for _ in range(rng.randrange(1, 5))]
    lines += [(head if every_line else "") + line for line in ECC]
    if not every_line:
        lines.append(head + ECC[-1])  # the script logs the error it caught, under its head
    path = tmp_path / f"train-{seed}.log"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("head", SCRIPT_HEADS)
@pytest.mark.parametrize("every_line", [True, False])
def test_a_script_head_is_never_a_host(tmp_path: Path, sigs, head: str, every_line: bool) -> None:
    d = analyze_paths([script_log(tmp_path, head, len(head), every_line)], signatures=sigs)
    assert d.cause == "gpu_hardware"
    assert (d.first_failing_host, d.exclude_nodes) == (None, [])
    assert head.strip(" :[]") not in d.summary


@pytest.mark.parametrize("host", ["node07", "gpu-b12", "dgx3"])
def test_a_pdsh_head_the_job_names_elsewhere_stays_a_host(tmp_path: Path, sigs, host: str) -> None:
    """DeepSpeed's pdsh launch: `node07: ` in front of every line, and NCCL's head names the same node."""
    lines = [f"{host}: {host}:4711:4790 [0] NCCL INFO comm 0x55d1c0a8 rank 0 nranks 8 cudaDev 0 busId 1000 - Init "
             "COMPLETE",
             *(f"{host}: {line}" for line in ECC)]
    log = tmp_path / "ds.log"
    log.write_text("\n".join(lines) + "\n")
    d = analyze_paths([log], signatures=sigs)
    assert (d.cause, d.first_failing_host, d.exclude_nodes) == ("gpu_hardware", host, [host])


def test_an_address_in_a_tags_place_is_a_host() -> None:
    assert strip_prefixes("10.0.0.2: RuntimeError: x").host_tag is False
    assert strip_prefixes("node02: RuntimeError: x").host_tag is True
    assert strip_prefixes("[rank7] loss 0.1").host_tag is True
    assert strip_prefixes("(RayTrainWorker pid=77, ip=10.0.0.7) x").host_tag is False


def event(host: str | None, tag: bool = False, **fields: str) -> Event:
    pairs = (*fields.items(), *(((HOST_TAG, "1"),) if tag else ()))
    return Event(file="f", line=1, kind="exception", text="x", host=host, fields=tuple(pairs))


def test_settle_hosts_keeps_a_tag_only_where_the_job_names_it() -> None:
    events = [event("GPU3", tag=True), event("node07", tag=True), event("node07"),
              event("n9", tag=True), event(None, peer_host="n9.cluster"), event("x1.a", tag=True),
              event("x1", tag=False)]
    settled = settle_hosts(events)
    assert [e.host for e in settled] == [None, "node07", "node07", "n9", None, "x1.a", "x1"]
    assert settled[0].get("tag") == "GPU3" and all(e.get(HOST_TAG) is None for e in settled)
    assert settle_hosts([event("n1")])[0].host == "n1"  # nothing tagged: nothing changes
    listed = settle_hosts([event("node03", tag=True), event("node09", tag=True),
                           event("node01", hostlist="{'node01': [0, 1], 'node03': [0, 1]}")])
    assert [e.host for e in listed] == ["node03", None, "node01"]
