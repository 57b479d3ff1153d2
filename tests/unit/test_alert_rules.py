"""deploy/prometheus/alerts.yaml is valid Prometheus rules (`promtool check rules`) and
passes its unit tests (`promtool test rules alerts.test.yaml`): each alert fires when it
must, stays quiet when it must, with the labels and annotations it is sent with. Every
PromQL expression of the Grafana dashboard parses too (checked by promtool as recording
rules). Which series they name: tests/service/test_dashboard_series.py."""

from __future__ import annotations

from pathlib import Path

import yaml  # type: ignore[import-untyped]

from tests.promtool import RULE_TESTS, RULES, dashboard_expressions, run


def test_the_alert_rules_are_valid() -> None:
    done = run("check", "rules", RULES)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_alert_rules_pass_their_unit_tests() -> None:
    done = run("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_test_that_fires_it() -> None:
    rules = yaml.safe_load(RULES.read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    tests = yaml.safe_load(RULE_TESTS.read_text())
    fired = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts - fired == set(), "alerts no test fires"


def test_every_dashboard_expression_parses(tmp_path: Path) -> None:
    expressions = dashboard_expressions()
    assert len(expressions) > 20
    # label_values() is Grafana's, not PromQL: its metric is checked as a selector
    as_promql = [
        expr.removeprefix("label_values(").rpartition(",")[0]
        if expr.startswith("label_values(")
        else expr
        for expr in expressions
    ]
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:expr_{index}", "expr": expr}
                    for index, expr in enumerate(as_promql)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    done = run("check", "rules", path)
    assert done.returncode == 0, done.stdout + done.stderr
