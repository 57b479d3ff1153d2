"""The virtualenv is exactly the lock, and the service locks agree with it.

`make setup` installs requirements/dev.txt with hashes required and no resolution
(scripts/setup-venv.sh); `make lock` resolves requirements/*.txt from pyproject.toml.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from scripts.unlocked_packages import canonical, installed, pins

REPO = Path(__file__).resolve().parents[2]
LOCKS = REPO / "requirements"
SERVICE_EXTRAS = ("coordinator", "preview", "gateway", "processor", "triton")


def test_every_pin_carries_hashes() -> None:
    for lock in LOCKS.glob("*.txt"):
        blocks = re.split(r"\n(?=[A-Za-z0-9])", lock.read_text())
        unhashed = [b.split()[0] for b in blocks if "==" in b and "--hash=sha256:" not in b]
        assert not unhashed, f"{lock.name}: pins without hashes: {unhashed}"


def test_the_venv_holds_exactly_the_lock() -> None:
    assert installed() == pins(LOCKS / "dev.txt"), (
        "run `make setup` (or `make lock` after editing pyproject.toml)"
    )


@pytest.mark.parametrize("extra", SERVICE_EXTRAS)
def test_a_service_lock_names_the_versions_of_the_whole_lock(extra: str) -> None:
    whole = pins(LOCKS / "dev.txt")
    service = pins(LOCKS / f"{extra}.txt")
    assert {name: whole.get(name) for name in service} == service


def test_the_lock_satisfies_pyproject() -> None:
    whole = pins(LOCKS / "dev.txt")
    unmet = [
        str(req)
        for text in metadata.requires("workshop") or []
        if (req := Requirement(text)).name != "workshop"
        and not req.specifier.contains(whole.get(canonical(req.name), "0"), prereleases=True)
    ]
    assert not unmet, f"pyproject.toml asks for what the lock lacks, run `make lock`: {unmet}"
