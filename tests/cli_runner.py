"""Runs the `workshop` command line as a subprocess (`python -m tools.cli`), with the
harness coordinator's address and admin key in its environment."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from testbed.harness.coordinator import CoordinatorHarness


@dataclasses.dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def lines(self) -> list[Any]:
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]


def admin_secret(c: CoordinatorHarness) -> str:
    return dict(c.admin)["authorization"].removeprefix("Bearer ")


def environment(c: CoordinatorHarness | None, extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WORKSHOP_", "PROCESSOR_"))}
    if c is not None:
        env |= {"WORKSHOP_COORDINATOR": f"127.0.0.1:{c.port}", "WORKSHOP_KEY": admin_secret(c)}
    env["COLUMNS"] = "200"  # rich tables wide enough to assert on
    return env | dict(extra)


async def start(
    c: CoordinatorHarness | None, *args: str, env: Mapping[str, str] | None = None
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tools.cli",
        *args,
        env=environment(c, env or {}),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def workshop(
    c: CoordinatorHarness | None,
    *args: str,
    env: Mapping[str, str] | None = None,
    stdin: str = "",
) -> Result:
    """`workshop ARGS...`; never a traceback, whatever the exit code."""
    process = await start(c, *args, env=env)
    out, err = await process.communicate(stdin.encode())
    assert process.returncode is not None
    result = Result(process.returncode, out.decode(), err.decode())
    assert "Traceback" not in result.err, result.err
    return result
