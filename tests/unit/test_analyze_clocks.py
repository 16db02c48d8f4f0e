"""Per-host clock offsets from an event every host sees (NCCL's init of the job's communicator completing), used
only to order ranks on different hosts, and said in the notes."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.diagnose.clocks import host_offsets
from ddpslurm.analyze.model import Event

T0 = 1714558235.0


def _init(host: str, pid: int, rank: int, at: float, nranks: int = 4) -> Event:
    return Event(file=f"{host}.out", line=rank + 1, kind="nccl_init", text="Init COMPLETE", rank=rank, host=host,
                 pid=pid, time=at, time_family="iso", fields=(("init", "complete"), ("nranks", str(nranks))))


def _job_inits(skew: dict[str, float], nranks: int = 4) -> list[Event]:
    hosts = sorted(skew)
    per = 4 // len(hosts)
    return [_init(h, 1000 + 10 * i + lo, i * per + lo, T0 + 0.01 * lo + skew[h], nranks)
            for i, h in enumerate(hosts) for lo in range(per)]


def test_a_host_whose_inits_complete_later_runs_ahead() -> None:
    got = host_offsets(_job_inits({"node01": 0.0, "node02": 30.0}), world=4, tolerance=1.0)
    assert {h: round(o.seconds, 3) for h, o in got.items()} == {"node01": -15.0, "node02": 15.0}
    many = host_offsets(_job_inits({"a1": 0.0, "a2": 0.0, "a3": 0.0, "a4": 12.0}), world=4, tolerance=1.0)
    assert set(many) == {"a4"} and round(many["a4"].seconds, 3) == 12.0


@pytest.mark.parametrize(("skew", "world", "nranks"), [
    ({"node01": 0.0, "node02": 0.6}, 4, 4),  # within the clocks' tolerance: no offset
    ({"node01": 0.0, "node02": 30.0}, 8, 4),  # a communicator smaller than the world: another event
    ({"node01": 0.0, "node02": 30.0}, 1, 4),  # one rank: nothing to order
    ({"node01": 30.0}, 4, 4),  # one host: nothing to compare
])
def test_no_offset_where_nothing_shows_one(skew: dict[str, float], world: int, nranks: int) -> None:
    assert host_offsets(_job_inits(skew, nranks), world=world, tolerance=1.0) == {}


OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
       "79.10 GiB of which 1.02 GiB is free.")


def _stamp(seconds: float) -> str:
    minutes, rest = divmod(seconds + 600, 60)
    return f"[2024-05-01 10:{int(minutes):02d}:{rest:06.3f}]"


def _node(host: str, index: int, skew: float, fail_at: float, fail_local: int) -> str:
    """One node's srun --label log of two ranks, its clock `skew` s off: NCCL's init (at true time 5 s), progress,
    and one rank's CUDA OOM at true time `fail_at`."""
    lines = []
    for lo in range(2):
        r, pid = index * 2 + lo, 1000 + 10 * index + lo
        lines.append(f"{r}: {_stamp(5.0 + skew + 0.01 * lo)} {host}:{pid}:{pid} [{lo}] NCCL INFO comm 0x55d{r}e0 "
                     f"rank {r} nranks 4 cudaDev {lo} busId {lo}000 - Init COMPLETE")
    lines += [f"{index * 2 + lo}: {_stamp(60 + skew)} step 10 loss 2.31" for lo in range(2)]
    lines.append(f"{index * 2 + fail_local}: {_stamp(fail_at + skew)} {OOM}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("skew1", "skew2"), [(0.0, 30.0), (-30.0, 0.0), (0.0, 0.0), (4.0, 19.0)])
@pytest.mark.parametrize("hosts", [("node01", "node02"), ("gpu-z7", "gpu-c2")])
@pytest.mark.parametrize("swap", [False, True])
def test_ranks_on_hosts_with_skewed_clocks_are_ordered_on_one_clock(tmp_path: Path, skew1: float, skew2: float,
                                                                   hosts: tuple[str, str], swap: bool) -> None:
    """Rank 2 (second host) fails 10 s before rank 1 (first host) in true time; the second host's clock reads up to
    30 s more. Without the offset rank 1's OOM reads first."""
    files = [(f"{hosts[0]}.out", _node(hosts[0], 0, skew1, 200.0, 1)), (f"{hosts[1]}.out", _node(hosts[1], 1, skew2,
                                                                                               190.0, 0))]
    paths = []
    for name, text in files[::-1] if swap else files:
        (tmp_path / name).write_text(text)
        paths.append(tmp_path / name)
    got = analyze_paths(paths, workers=1).to_dict()
    assert (got["cause"], got["first_failing_rank"], got["first_failing_host"]) == ("cuda_oom", 2, hosts[1]), got
    clock_notes = [n for n in got["notes"] if n.startswith("clocks:")]
    assert bool(clock_notes) == (abs(skew2 - skew1) / 2 > 1.0), got["notes"]
    if clock_notes:
        assert hosts[1] in clock_notes[0] and f"+{abs(skew2 - skew1) / 2:.1f} s" in clock_notes[0], clock_notes
