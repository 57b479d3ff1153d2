"""Prometheus' `promtool`, for the checks of the alert rules and of the PromQL the deploy
files hold: `check rules`, and `test rules` (the rules' unit tests, and expressions
evaluated over series a test writes, such as a real service's scrape).

promtool comes from Debian's `prometheus` package, which `scripts/system-deps.sh`
installs for `make test` (without starting its server), so these checks never skip: a
machine without it fails them with that advice.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "alerts.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts.test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "workshop.json"


def promtool() -> str:
    path = shutil.which("promtool")
    assert path is not None, (
        "promtool is missing: run scripts/system-deps.sh (it installs Debian's prometheus "
        "package) or `apt-get install prometheus`"
    )
    return path


def run(*arguments: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *map(str, arguments)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        check=False,
    )


Sample = tuple[str, Mapping[str, str], float]


def series_line(name: str, labels: Mapping[str, str]) -> str:
    inside = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    return f"{name}{{{inside}}}"


def assert_evaluates(expr: str, samples: Iterable[Sample], expected: float, tmp: Path) -> None:
    """`expr`, evaluated by promtool over `samples` (each one value at time 0), is one
    sample without labels equal to `expected`."""
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": series_line(name, labels), "values": repr(float(value))}
                    for name, labels, value in samples
                ],
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "0m",
                        "exp_samples": [{"labels": "{}", "value": expected}],
                    }
                ],
            }
        ],
    }
    path = tmp / "expr.test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    done = run("test", "rules", path)
    assert done.returncode == 0, done.stdout + done.stderr


def dashboard_expressions() -> list[str]:
    """Every PromQL expression of the dashboard: its panels' targets and its variables'
    queries, with the variables as the dashboard's "All" would set them."""
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    found = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            found.append(query["query"])
    return [expr.replace("$runtime", ".*") for expr in found]
