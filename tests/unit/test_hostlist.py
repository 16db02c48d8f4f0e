"""Slurm hostlist and tasks-per-node expansion (table-driven)."""

from __future__ import annotations

import pytest

from ddpslurm.errors import EnvDerivationError
from ddpslurm.scheduler.hostlist import compress_hostlist, expand_hostlist, expand_tasks_per_node


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("node1", ["node1"]),
        ("  node1 \n", ["node1"]),
        ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
        ("n[008-011]", ["n008", "n009", "n010", "n011"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("n[5]", ["n5"]),
        ("a[1-2],b3,c[05-06]", ["a1", "a2", "b3", "c05", "c06"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("a[1-2]b[3-4]c", ["a1b3c", "a1b4c", "a2b3c", "a2b4c"]),
        ("host-1.example.com,host-2.example.com", ["host-1.example.com", "host-2.example.com"]),
        ("cn[1-2].cluster.local", ["cn1.cluster.local", "cn2.cluster.local"]),
        ("node[3,1]", ["node3", "node1"]),
        ("x1,x1", ["x1", "x1"]),
        ("a1 b2", ["a1", "b2"]),
        ("a1, b[2-3]", ["a1", "b2", "b3"]),
        ("node-[0-1]-gpu", ["node-0-gpu", "node-1-gpu"]),
        ("[1-2]", ["1", "2"]),
    ],
)
def test_expand_hostlist(text: str, expected: list[str]) -> None:
    assert expand_hostlist(text) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("node[1-2", "'[' without ']'"),
        ("node1-2]", "']' without '['"),
        ("node[5-3]", "reversed range"),
        ("node[]", "empty brackets"),
        ("a,,b", "empty host name"),
        ("a,", "empty host name"),
        ("n[a-b]", "bad range"),
        ("n[1-2-3]", "bad range"),
        ("n[[1-2]]", "nested"),
        ("n[1-99999999]", "too large"),
    ],
)
def test_expand_hostlist_rejects_malformed_input(text: str, why: str) -> None:
    with pytest.raises(EnvDerivationError) as info:
        expand_hostlist(text)
    assert why in str(info.value)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        (["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"], "gpu[01-04,07]"),
        (["n008", "n009", "n010", "n011"], "n[008-011]"),
        (["n9", "n10", "n11"], "n[9-11]"),
        (["a1", "a2", "b3", "c05", "c06"], "a[1-2],b3,c[05-06]"),
        (["login"], "login"),
        (["login", "n1"], "login,n1"),
        (["n3", "n1", "n2"], "n[3,1-2]"),
        (["n09", "n10", "n1"], "n[09-10,1]"),
        ([], ""),
    ],
)
def test_compress_hostlist(hosts: list[str], expected: str) -> None:
    assert compress_hostlist(hosts) == expected


@pytest.mark.parametrize(
    "text", ["gpu[01-04,07]", "rack[1-2]-n[01-02]", "a[1-2],b3,c[05-06]", "n[098-101]", "x,y[1-3],z07", "n[3,1]"]
)
def test_compress_roundtrips_expand(text: str) -> None:
    hosts = expand_hostlist(text)
    assert expand_hostlist(compress_hostlist(hosts)) == hosts


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2", [2]),
        ("1(x3)", [1, 1, 1]),
        ("4(x2),3", [4, 4, 3]),
        ("2,1(x2),8", [2, 1, 1, 8]),
        (" 3 ", [3]),
    ],
)
def test_expand_tasks_per_node(text: str, expected: list[int]) -> None:
    assert expand_tasks_per_node(text) == expected


@pytest.mark.parametrize("text", ["", "x", "4(x)", "4(2)", "4(x0)", "-1", "4,,2"])
def test_expand_tasks_per_node_rejects_malformed(text: str) -> None:
    with pytest.raises(EnvDerivationError, match="tasks-per-node"):
        expand_tasks_per_node(text)
