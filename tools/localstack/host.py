"""What every launcher needs from this host: free loopback ports and the end of a log."""

from __future__ import annotations

import random
import socket
from contextlib import ExitStack
from pathlib import Path

LOOPBACK = "127.0.0.1"
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10000


def port_range() -> tuple[int, int]:
    """Where `free_ports` chooses: from LOWEST_PORT up to the first port the kernel gives
    outgoing connections their source ports from (ip_local_port_range, 32768 by default).
    Binding port 0 would choose from that ephemeral range itself, where any connection
    made in the meantime (a busy parallel test run makes thousands) can take the port
    before the server it was chosen for binds it: a CI run's gateway failed to start
    with 'Address already in use' that way."""
    try:
        first_ephemeral = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first_ephemeral = 32768
    return LOWEST_PORT, max(first_ephemeral, LOWEST_PORT + 1024)


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports free right now, outside the kernel's ephemeral range
    (`port_range`); every socket is held until all are chosen, so none repeats. Another
    process may still bind one before its server does, but no outgoing connection takes it."""
    low, high = port_range()
    with ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < count:
            port = random.randrange(low, high)
            if port in ports:
                continue
            probe = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                probe.bind((LOOPBACK, port))
            except OSError:
                continue  # bound by something else: try another
            ports.append(port)
        return ports


def tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a log file, or "(no log)" when it was never written."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])
