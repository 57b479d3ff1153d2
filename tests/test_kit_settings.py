"""Settings from the environment: typed parsing and fail-fast errors naming the variable."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from workshop.kit.settings import (
    EXIT_BAD_SETTINGS,
    SettingsError,
    describe_settings,
    load_settings,
    setting,
)

REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Example:
    url: str = setting(help="required url")
    workers: int = setting(4, help="worker count")
    ratio: float = setting(0.5, help="a ratio")
    enabled: bool = setting(False, help="a flag")
    note: str | None = setting(None, help="optional note")


def test_defaults_and_parsing() -> None:
    loaded = load_settings(
        Example,
        "EX",
        {"EX_URL": "x", "EX_WORKERS": "8", "EX_RATIO": "1.5", "EX_ENABLED": "true"},
    )
    assert loaded == Example(url="x", workers=8, ratio=1.5, enabled=True, note=None)


@pytest.mark.parametrize(
    ("environ", "variable", "problem"),
    [
        ({}, "EX_URL", "required but not set"),
        ({"EX_URL": "x", "EX_WORKERS": "many"}, "EX_WORKERS", "expected an integer"),
        ({"EX_URL": "x", "EX_RATIO": "half"}, "EX_RATIO", "expected a number"),
        ({"EX_URL": "x", "EX_ENABLED": "maybe"}, "EX_ENABLED", "expected a boolean"),
    ],
)
def test_bad_values_name_the_variable(environ: dict[str, str], variable: str, problem: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(Example, "EX", environ)
    assert caught.value.variable == variable
    assert problem in str(caught.value)


def test_describe_lists_every_field() -> None:
    rows = describe_settings(Example, "EX")
    assert [row[0] for row in rows] == ["EX_URL", "EX_WORKERS", "EX_RATIO", "EX_ENABLED", "EX_NOTE"]
    assert rows[0][1] == "required"


@pytest.mark.parametrize(
    ("module", "env", "variable"),
    [
        ("services.coordinator", {}, "COORDINATOR_DATABASE_URL"),
        (
            "services.coordinator",
            {"COORDINATOR_DATABASE_URL": "postgresql://x/y", "COORDINATOR_PORT": "http"},
            "COORDINATOR_PORT",
        ),
        ("services.preview", {}, "PREVIEW_S3_ENDPOINT"),
        ("services.gateway", {"GATEWAY_HTTP_PORT": "99999"}, "GATEWAY_HTTP_PORT"),
        ("services.processor", {}, "PROCESSOR_DEVICE_ID"),
    ],
)
def test_service_exits_2_naming_the_variable(
    module: str, env: dict[str, str], variable: str
) -> None:
    clean = {"PATH": "/usr/bin:/bin", **env}
    result = subprocess.run(
        [sys.executable, "-m", module],
        cwd=REPO,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == EXIT_BAD_SETTINGS, result.stderr
    assert variable in result.stderr
