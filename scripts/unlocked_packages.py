"""Prints the installed distributions that the lock file named in argv[1] does not pin.

scripts/setup-venv.sh uninstalls them, so a virtualenv that an earlier lock built
holds exactly the current one (pip itself and this project are never in a lock).
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

NEVER_LOCKED = {"pip", "workshop"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lock: Path) -> dict[str, str]:
    """Canonical name -> version of every pin in `lock`."""
    found = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", lock.read_text(), re.MULTILINE)
    return {canonical(name): version for name, version in found}


def installed() -> dict[str, str]:
    """Canonical name -> version of every distribution installed, but pip and this project."""
    found = {canonical(dist.metadata["Name"]): dist.version for dist in metadata.distributions()}
    return {name: version for name, version in found.items() if name not in NEVER_LOCKED}


def main() -> None:
    print(" ".join(sorted(set(installed()) - set(pins(Path(sys.argv[1]))))))


if __name__ == "__main__":
    main()
