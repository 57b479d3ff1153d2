"""POSIX shared-memory regions that a Triton on the same host reads inputs from (the
processor's frames, `services.processor.inference`; an evaluation's images,
`workshop.kit.evaluation`), and whether a Triton target is on this host (`is_loopback`).

Written here rather than with `tritonclient.utils.shared_memory`: that module rides on
`multiprocessing.shared_memory`, which on Python 3.11 starts a resource-tracker helper
process and tracks every region it opens, even ones it does not own. A region here is a
file in /dev/shm (where glibc's `shm_open(key)` looks), mapped once into this process.

`Region.create` makes the file, `release_name` removes it once Triton has mapped it (the
mapping lives on; nothing is left behind if this process dies), `close` unmaps it.
"""

from __future__ import annotations

import ipaddress
import mmap
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

SHM_DIR = Path("/dev/shm")
# Triton answers a request before it lets go of the request's region ("currently in use"
# for a few milliseconds more): unregistering tries again, this many times this far apart.
UNREGISTER_ATTEMPTS = 100
UNREGISTER_PAUSE_S = 0.02


def still_in_use(refusal: str | None) -> bool:
    """Whether Triton refused to unregister a region only because a request it has
    answered still holds it (try again in UNREGISTER_PAUSE_S)."""
    return "in use" in (refusal or "")


@dataclass
class Region:
    """One region: `name` is how Triton refers to it, `key` how Triton opens it."""

    name: str
    key: str
    byte_size: int
    _map: mmap.mmap

    @classmethod
    def create(cls, prefix: str, byte_size: int) -> Region:
        name = f"{prefix}-{secrets.token_hex(6)}"
        path = SHM_DIR / name
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(descriptor, byte_size)
            mapped = mmap.mmap(descriptor, byte_size)
        except OSError:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(descriptor)
        return cls(name=name, key=f"/{name}", byte_size=byte_size, _map=mapped)

    def write(self, array: npt.NDArray[np.uint8]) -> int:
        """Copies `array` to the start of the region; returns its size in bytes."""
        if array.nbytes > self.byte_size:
            raise ValueError(f"{array.nbytes} bytes do not fit a region of {self.byte_size}")
        view: npt.NDArray[np.uint8] = np.ndarray(array.shape, dtype=array.dtype, buffer=self._map)
        view[...] = array
        return array.nbytes

    def release_name(self) -> None:
        (SHM_DIR / self.name).unlink(missing_ok=True)

    def close(self) -> None:
        self.release_name()
        self._map.close()


def is_loopback(target: str) -> bool:
    """Whether a gRPC target ("host:port", "[::1]:port", "dns:///host:port", "unix:...")
    names this host."""
    if target.startswith("unix:"):
        return True
    address = target.removeprefix("dns:///").removeprefix("ipv4:").removeprefix("ipv6:")
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 or "]" in address else address
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
