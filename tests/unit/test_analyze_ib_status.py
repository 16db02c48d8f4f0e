"""What an InfiniBand completion status says about a resubmission (analyzer/ib_status.toml): status 4 (a local
protection error, GPUDirect RDMA set-up) stops and excludes no node; 12 and 13 (retries ran out: link, fabric)
requeue without the node. Each wording NCCL printed since 2.7, behind renamed hosts, other pids and noise lines."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.rules.loading import load_signatures
from ddpslurm.errors import AnalyzeInputError
from ddpslurm.triage import summary

#: NCCL's completion-error line per generation (src/transport/net_ib.cc, later net_ib/p2p.cc and gin.cc), status S
WORDINGS = {
    "2.7": "transport/net_ib.cc:818 NCCL WARN NET/IB : Got completion with error {s}, opcode 21394, len 0, "
           "vendor err 81",
    "2.12": "transport/net_ib.cc:1198 NCCL WARN NET/IB : Got completion from peer {peer}<59422> with error {s}, "
            "opcode 0, len 0, vendor err 81",
    "2.21": "transport/net_ib.cc:1909 NCCL WARN NET/IB : Got completion from peer {peer}<33057> with status={s} "
            "opcode=0 len=0 vendor err 138 (Send) localGid ::ffff:10.206.1.23 remoteGids::ffff:10.206.1.11",
    "2.23": "transport/net_ib.cc:2121 NCCL WARN NET/IB: Got completion from peer {peer}<38081> with status={s} "
            "opcode=0 len=0 vendor err 83 (Send) hca mlx5_ib0",
    "2.27": "transport/net_ib/p2p.cc:688 NCCL WARN NET/IB: Got completion from peer {peer}<38081> with "
            "status={name}({s}) opcode=IBV_WC_SEND(0) vendor_err=81  hca mlx5_0",
    "gin": "transport/net_ib/gin.cc:749 NCCL WARN NET/IB/GIN: Got completion from peer {peer}<4011> with "
           "status={s} opcode=0 len=0 vendor err 81 (Send) hca mlx5_1",
}
NAMES = {4: "IBV_WC_LOC_PROT_ERR", 12: "IBV_WC_RETRY_EXC_ERR", 13: "IBV_WC_RNR_RETRY_EXC_ERR"}
#: lines a healthy NCCL job prints around it
NOISE = ("NCCL INFO Bootstrap : Using ib0:{ip}<0>", "NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:{ip}<0>",
         "NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
         "NCCL INFO transport/net.cc:1137 -> 6", "NCCL INFO proxy.cc:698 -> 6 [Progress Thread]")


@pytest.fixture(scope="module")
def sigs():
    return load_signatures(use_env=False)


def job_log(tmp_path: Path, status: int, wording: str, seed: int) -> tuple[Path, str]:
    """One host's NCCL log with the completion error among noise; host, pids and peer chosen by `seed`."""
    rng = random.Random(seed)
    host = rng.choice(("gpu-a07", "h100-28", "node0412", "dgx-b3-11"))
    pid, tid = rng.randrange(1000, 99999), rng.randrange(1000, 99999)
    ip, peer = f"10.{rng.randrange(256)}.1.{rng.randrange(2, 250)}", f"10.{rng.randrange(256)}.2.{rng.randrange(250)}"
    head = f"{host}:{pid}:{tid} [{rng.randrange(8)}] "
    lines = [head + line.format(ip=ip) for line in rng.sample(NOISE, 3)]
    error = WORDINGS[wording].format(s=status, peer=peer, name=NAMES.get(status, "IBV_WC_GENERAL_ERR"))
    lines.insert(rng.randrange(1, len(lines) + 1), head + error)
    path = tmp_path / f"{host}-{seed}.log"
    path.write_text("\n".join(lines) + "\n")
    return path, host


@pytest.mark.parametrize("wording", sorted(WORDINGS))
@pytest.mark.parametrize("seed", [1, 2])
def test_status_4_stops_and_excludes_no_node(tmp_path: Path, sigs, wording: str, seed: int) -> None:
    path, host = job_log(tmp_path, 4, wording, seed)
    d = analyze_paths([path], signatures=sigs)
    assert (d.cause, d.retry, d.exclude_nodes) == ("infiniband_error", "stop", [])
    assert d.first_failing_host == host  # where it happened is still said
    assert "local protection error" in d.summary and "cable" not in d.summary
    said = " ".join(d.advice)
    assert "NCCL_NET_GDR_LEVEL=0" in said and "ACS" in said and "nvidia_peermem" in said
    assert "Exclude the node" not in said and "--exclude" not in said


@pytest.mark.parametrize("wording", sorted(WORDINGS))
@pytest.mark.parametrize("status", [12, 13])
def test_retries_ran_out_requeue_without_the_node(tmp_path: Path, sigs, wording: str, status: int) -> None:
    path, host = job_log(tmp_path, status, wording, status)
    d = analyze_paths([path], signatures=sigs)
    assert (d.cause, d.retry, d.exclude_nodes) == ("infiniband_error", "requeue", [host])
    assert f"completion status {status}" in d.summary and "link" in d.summary
    assert any("Exclude the node" in a for a in d.advice)


def test_a_status_without_semantics_keeps_the_defaults_and_is_named(tmp_path: Path, sigs) -> None:
    path, host = job_log(tmp_path, 21, "2.23", 3)  # IBV_WC_GENERAL_ERR: nothing declared beyond its name
    d = analyze_paths([path], signatures=sigs)
    assert (d.cause, d.retry, d.exclude_nodes) == ("infiniband_error", "requeue", [host])
    assert "(completion status 21, general error)" in d.summary


def test_the_shipped_table_is_libibverbs_list(sigs) -> None:
    table = sigs.ib_statuses
    assert sorted(table.by_code) == list(range(1, 24))  # IBV_WC_SUCCESS (0) is never an error
    assert all(s.name.startswith("IBV_WC_") for s in table.by_code.values())
    for said in ("4", "IBV_WC_LOC_PROT_ERR", "local protection error", "Local Protection Error"):
        assert table.lookup(said).code == 4
    assert table.lookup("99") is None and table.lookup("exit") is None and table.lookup(None) is None


def write_site(tmp_path: Path, text: str) -> Path:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "ib_status.toml").write_text(text)
    return site


def test_a_site_entry_replaces_the_shipped_one(tmp_path: Path) -> None:
    site = write_site(tmp_path, "[[status]]\ncode = 12\nname = 'IBV_WC_RETRY_EXC_ERR'\n"
                                "text = 'transport retry counter exceeded'\nretry = 'stop'\nexclude_node = false\n")
    sigs = load_signatures([site], use_env=False)
    path, _host = job_log(tmp_path, 12, "2.12", 5)
    d = analyze_paths([path], signatures=sigs)
    assert (d.retry, d.exclude_nodes) == ("stop", [])
    assert sigs.ib_statuses.lookup("4").retry == "stop"  # the shipped entries it does not name stand


@pytest.mark.parametrize(("text", "said"), [
    ("[[status]]\ncode = 4\nname = 'A'\ntext = 'a'\nretry = 'maybe'\n", "retry"),
    ("[[status]]\ncode = 4\nname = 'A'\ntext = 'a'\n[[status]]\ncode = 4\nname = 'B'\ntext = 'b'\n", "twice"),
    ("[[status]]\ncode = 4\nname = 'A'\ntext = 'a'\ncolour = 'red'\n", "unknown key"),
    ("[[status]]\ncode = 'four'\nname = 'A'\ntext = 'a'\n", "code"),
    ("[[status]]\ncode = 4\nname = 'A'\ntext = 'a'\nexclude_node = 'no'\n", "exclude_node"),
    ("[reads]\nsignatures = ['no-such-signature']\n", "unknown signature"),
    ("[reads]\nsignatures = ['nccl-oom-cuda']\n", "unknown signature"),
    ("[reads]\nsignatures = ['nccl-remote-closed']\n", "captures no"),
    ("[[stat]]\ncode = 4\n", "unknown table"),
])
def test_a_bad_table_is_one_clear_error(tmp_path: Path, text: str, said: str) -> None:
    site = write_site(tmp_path, text)
    with pytest.raises(AnalyzeInputError) as raised:
        load_signatures([site], use_env=False)
    assert said in str(raised.value) and "ib_status.toml" in str(raised.value)


def test_triage_drains_no_node_for_a_set_up_fault() -> None:
    def row(job: str, host: str, retry: str, exclude: list[str]) -> dict:
        return {"job": job, "path": job, "cause": "infiniband_error", "first_failing_host": host, "nodes": [host],
                "exclude_nodes": exclude, "retry": retry, "reason": ""}

    result = summary([row("j1", "n1", "stop", []), row("j2", "n2", "requeue", ["n2"]),
                      row("j3", "n3", "requeue", [])])
    assert result["drain"] == ["n2", "n3"]
