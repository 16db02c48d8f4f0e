"""Which network interface NCCL and gloo should use (`NCCL_SOCKET_IFNAME`, `GLOO_SOCKET_IFNAME`).

The interface is the one the kernel routes through to reach another node of the job: rank-0's host
for every other node, and the second node for the rank-0 node (so a multi-node job never gets the
loopback interface, whose address peers cannot reach). Found without a subprocess: a UDP socket is
"connected" (no packet is sent) and its local address is matched against the interfaces' addresses.
"""

from __future__ import annotations

import fcntl
import socket
import struct
from collections.abc import Mapping, Sequence

_SIOCGIFADDR = 0x8915
LOOPBACK = "lo"


def route_peer(hostnames: Sequence[str], node_rank: int) -> str | None:
    """The host whose route decides the interface: node 0 for the others, node 1 for node 0; None if alone."""
    if len(hostnames) < 2:
        return None
    return hostnames[1] if node_rank == 0 else hostnames[0]


def pick_interface(local_ip: str, addresses: Mapping[str, str]) -> str | None:
    """The interface (name -> IPv4 address) that owns `local_ip`, or None."""
    return next((name for name, addr in sorted(addresses.items()) if addr == local_ip), None)


def interface_addresses() -> dict[str, str]:
    """IPv4 address of every interface that has one (ioctl SIOCGIFADDR)."""
    out: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            out[name] = socket.inet_ntoa(packed[20:24])
    return out


def local_address_towards(host: str) -> str:
    """The local IPv4 address the kernel would use to reach `host` (no packet is sent)."""
    address = socket.gethostbyname(host)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((address, 9))
        return sock.getsockname()[0]


def choose_interface(hostnames: Sequence[str], node_rank: int, master_addr: str) -> str | None:
    """The interface for this task's collectives, or None when it cannot be told (let NCCL/gloo choose)."""
    peer = route_peer(hostnames, node_rank) or master_addr
    try:
        name = pick_interface(local_address_towards(peer), interface_addresses())
    except OSError:
        return None
    if name == LOOPBACK and len(hostnames) > 1:
        return None
    return name
