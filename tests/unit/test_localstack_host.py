"""tools.localstack.host.free_ports: loopback ports outside the kernel's ephemeral range."""

from __future__ import annotations

import socket

from tools.localstack.host import LOOPBACK, free_ports, port_range


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low, high = port_range()
    with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as ephemeral:
        first_ephemeral = int(ephemeral.read().split()[0])
    assert high <= max(first_ephemeral, low + 1024)
    ports = free_ports(20)
    assert len(set(ports)) == 20
    for port in ports:
        assert low <= port < high
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind((LOOPBACK, port))  # free: nothing of free_ports holds it any more
