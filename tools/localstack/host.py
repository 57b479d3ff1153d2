"""What every launcher needs from this host: free loopback ports and the end of a log."""

from __future__ import annotations

import socket
from contextlib import ExitStack
from pathlib import Path

LOOPBACK = "127.0.0.1"


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports free right now (every socket is held until all are
    chosen, so none repeats; another process may still take one before it is bound)."""
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            probe = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            probe.bind((LOOPBACK, 0))
            ports.append(int(probe.getsockname()[1]))
        return ports


def tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a log file, or "(no log)" when it was never written."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])
