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
    at_least,
    describe_settings,
    load_settings,
    setting,
)

REPO = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Example:
    url: str = setting(help="required url")
    workers: int = setting(4, help="worker count", check=at_least(1))
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


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(Example, "EX", {"EX_WORKERS": "0", "EX_RATIO": "half"})
    assert caught.value.problems == [
        ("EX_URL", "required but not set"),
        ("EX_WORKERS", "must be at least 1"),
        ("EX_RATIO", "expected a number, got 'half'"),
    ]


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


def test_a_service_names_every_missing_setting_in_one_start() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services.preview"],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PREVIEW_S3_THREADS": "0"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == EXIT_BAD_SETTINGS, result.stderr
    named = [line.split(":")[0].strip() for line in result.stderr.splitlines()[1:]]
    assert named == [
        "PREVIEW_S3_ENDPOINT",
        "PREVIEW_S3_ACCESS_KEY",
        "PREVIEW_S3_SECRET_KEY",
        "PREVIEW_S3_THREADS",
        "PREVIEW_SERVICE_KEY",
    ]


# Every field that holds a credential, by service: its value must never reach a log.
SECRET_FIELDS = {
    "services.coordinator.settings.CoordinatorSettings": {"database_url", "lease_attestation_key"},
    "services.gateway.settings.GatewaySettings": {"key"},
    "services.preview.settings.PreviewSettings": {
        "s3_secret_key",
        "service_key",
        "lease_attestation_key",
    },
    "services.processor.settings.ProcessorSettings": {"key", "s3_secret_key"},
}


def _settings_class(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    cls: type = getattr(__import__(module, fromlist=[name]), name)
    return cls


@pytest.mark.parametrize("dotted", sorted(SECRET_FIELDS))
def test_a_services_secrets_are_marked_and_left_out_of_its_repr(dotted: str) -> None:
    cls = _settings_class(dotted)
    fields = {field.name: field for field in dataclasses.fields(cls)}
    marked = {name for name, field in fields.items() if field.metadata.get("secret")}
    assert marked == SECRET_FIELDS[dotted]
    # a field named like a credential is marked (a new one must be added above)
    credential_like = {
        name for name in fields if name.endswith(("key", "secret_key", "url", "password"))
    }
    assert credential_like - {"s3_access_key"} <= marked
    values = {
        name: f"SECRET-{name}" if name in marked else field.default
        for name, field in fields.items()
        if name in marked or field.default is not dataclasses.MISSING
    }
    required = [name for name in fields if name not in values]
    values |= dict.fromkeys(required, "x")
    shown = repr(cls(**values))
    for name in marked:
        assert f"SECRET-{name}" not in shown
        assert f" {name}=" not in shown
        assert f"({name}=" not in shown
    assert "port=" in shown  # the other fields are still there
