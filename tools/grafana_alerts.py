"""Grafana-managed alert rules rendered from the Prometheus rule file, built in code; the
chart ships the file it writes for Grafana's alert sidecar.

    python tools/grafana_alerts.py --write    # regenerate charts/.../files/grafana-alerts.yaml
    python tools/grafana_alerts.py --check    # exit 1 when the committed file is stale

One source, two renderings: every alert of charts/resumequal/files/alerts.yaml becomes a
Grafana rule with the same query, ``for``, labels and annotations. Grafana has no
recording rules of ours, so each alert's query carries the records it reads inlined. The
rules take the shape Grafana's own Prometheus-rule converter gives them
(pkg/services/ngalert/prom/convert.go and query.go in github.com/grafana/grafana): an
instant query, a math expression that is 1 for every series the query returns, and a
threshold above 0, so a rule alerts for exactly the series its PromQL returns, as in
Prometheus.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any, Literal

import yaml
from grafana_foundation_sdk.builders import alerting, expr, prometheus
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import alerting as alerting_model
from grafana_foundation_sdk.models import dashboard as dashboard_model

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "charts/resumequal/files/alerts.yaml"
OUTPUT = ROOT / "charts/resumequal/files/grafana-alerts.yaml"

# Defaults the chart overrides from values.yaml (grafanaAlerts.*).
DATASOURCE_UID = "prometheus"
FOLDER = "resumequal"
GROUP = "resumequal"
INTERVAL = "1m"
ORG_ID = 1

# The node names and defaults of Grafana's converter (pkg/services/ngalert/prom/convert.go:
# queryRefID, prometheusMathRefID, thresholdRefID, defaultTimeRange, NoDataState OK,
# ExecErrState Error).
QUERY, MATH, THRESHOLD = "query", "prometheus_math", "threshold"
MATH_EXPRESSION = f"is_number(${QUERY}) || is_nan(${QUERY}) || is_inf(${QUERY})"
TIME_RANGE_SECONDS = 600
EXPRESSION_DATASOURCE = "__expr__"
NO_DATA_STATE: Literal["OK"] = "OK"
EXEC_ERR_STATE: Literal["Error"] = "Error"

# The dashboard panel each alert links to (Grafana's __dashboardUid__ / __panelId__
# annotations, which notifications turn into dashboard and panel links).
PANELS = {
    "QualificationFailed": "Verdict of the latest run, by pin",
    "QualificationInvalid": "Verdict of the latest run, by pin",
    "ResumeDriftAboveThreshold": "Parameters: relative L2",
    "NegativeControlBlind": "Negative controls: detected vs total",
    "NoPassingQualification": "Verdict of the latest run, by pin",
    "OperatorDown": "Reconciles and errors",
    "ReconcileErrors": "Reconciles and errors",
}
# In Prometheus $value is the sample's value; in Grafana it is a string describing every
# expression, and the query's value is $values.query.Value
# (pkg/services/ngalert/state/template/template.go: Data, NewValues).
_VALUE = re.compile(r"\$value\b")
# Keys the SDK's Rule always writes that the file format holds on the group instead
# (pkg/services/provisioning/alerting/rules_types.go: AlertRuleGroupV1).
GROUP_KEYS = ("folderUID", "orgID", "ruleGroup")
# The order a rule's keys are written in, for a file that reads like Grafana's examples.
RULE_KEYS = (
    "uid", "title", "condition", "data", "noDataState", "execErrState", "for", "labels",
    "annotations", "isPaused",
)  # fmt: skip


@functools.cache
def _dashboard() -> Any:
    """tools/dashboard.py, which owns the panels the alerts link to."""
    spec = importlib.util.spec_from_file_location("dashboard_tool", ROOT / "tools/dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_rules(source: Path = SOURCE) -> list[dict[str, Any]]:
    """Every rule of the Prometheus rule file, records and alerts, in file order."""
    doc = yaml.safe_load(source.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def inline_records(expr_text: str, records: dict[str, str]) -> str:
    """``expr_text`` with every recording rule it reads replaced by its expression."""
    for _ in range(len(records) + 1):
        replaced = expr_text
        for name, body in records.items():
            pattern = re.compile(rf"(?<![\w:]){re.escape(name)}(?![\w:])")
            # Backslashes escaped, so the body is taken as it is (a regex in a matcher).
            replaced = pattern.sub(f"({body})".replace("\\", "\\\\"), replaced)
        if replaced == expr_text:
            return expr_text
        expr_text = replaced
    raise ValueError(f"recording rules refer to each other in a cycle: {sorted(records)}")


def grafana_template(text: str) -> str:
    """A Prometheus annotation template as Grafana expands it the same way."""
    return _VALUE.sub(f"$values.{QUERY}.Value", text)


def uid(alert: str) -> str:
    """The rule's UID: stable, at most 40 characters of [a-z0-9-] as Grafana requires."""
    kebab = re.sub(r"(?<!^)(?=[A-Z])", "-", alert).lower()
    value = f"resumequal-{kebab}"
    assert len(value) <= 40, value
    return value


def _query(expression: str) -> alerting.Query:
    model = (
        prometheus.Dataquery()
        .expr(expression)
        .instant()
        .ref_id(QUERY)
        .datasource(dashboard_model.DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID))
    )
    return (
        alerting.Query(QUERY)
        .datasource_uid(DATASOURCE_UID)
        .relative_time_range(alerting_model.RelativeTimeRange(from_val=TIME_RANGE_SECONDS, to=0))
        .model(model)
    )


def _expression_source() -> dashboard_model.DataSourceRef:
    return dashboard_model.DataSourceRef(type_val=EXPRESSION_DATASOURCE, uid=EXPRESSION_DATASOURCE)


def _math() -> alerting.Query:
    model = (
        expr.TypeMath().expression(MATH_EXPRESSION).ref_id(MATH).datasource(_expression_source())
    )
    return (
        alerting.Query(MATH).datasource_uid(EXPRESSION_DATASOURCE).query_type("math").model(model)
    )


def _threshold() -> alerting.Query:
    above_zero = expr.ExprTypeThresholdConditions().evaluator(
        expr.ExprTypeThresholdConditionsEvaluator().type("gt").params([0])
    )
    model = (
        expr.TypeThreshold()
        .expression(MATH)
        .conditions([above_zero])
        .ref_id(THRESHOLD)
        .datasource(_expression_source())
    )
    return (
        alerting.Query(THRESHOLD)
        .datasource_uid(EXPRESSION_DATASOURCE)
        .query_type("threshold")
        .model(model)
    )


def rule(alert: dict[str, Any], records: dict[str, str], panels: dict[str, int]) -> dict[str, Any]:
    """One Prometheus alerting rule as a rule of Grafana's provisioning file."""
    name = alert["alert"]
    annotations = {k: grafana_template(v) for k, v in alert.get("annotations", {}).items()}
    annotations["__dashboardUid__"] = _dashboard().UID
    annotations["__panelId__"] = str(panels[PANELS[name]])
    built = (
        alerting.Rule(name)
        .uid(uid(name))
        .condition(THRESHOLD)
        .queries([_query(inline_records(alert["expr"], records)), _math(), _threshold()])
        .for_val(alert.get("for", "0s"))
        .no_data_state(NO_DATA_STATE)
        .exec_err_state(EXEC_ERR_STATE)
        .labels(dict(alert.get("labels", {})))
        .annotations(annotations)
        .is_paused(False)
    )
    encoded: dict[str, Any] = json.loads(json.dumps(built.build(), cls=JSONEncoder))
    for key in GROUP_KEYS:
        del encoded[key]
    assert set(encoded) == set(RULE_KEYS), sorted(encoded)
    return {key: encoded[key] for key in RULE_KEYS}


def _panel_ids() -> dict[str, int]:
    board = _dashboard().build()
    return {p["title"]: p["id"] for p in board["panels"] if p["type"] != "row"}


def build(source: Path = SOURCE) -> dict[str, Any]:
    """The provisioning file (apiVersion 1) as the object Grafana reads."""
    rules = load_rules(source)
    records = {r["record"]: r["expr"] for r in rules if "record" in r}
    panels = _panel_ids()
    return {
        "apiVersion": 1,
        "groups": [
            {
                "orgId": ORG_ID,
                "name": GROUP,
                "folder": FOLDER,
                "interval": INTERVAL,
                "rules": [rule(r, records, panels) for r in rules if "alert" in r],
            }
        ],
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the queries) as literal blocks, long lines unfolded."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render() -> str:
    """The committed file's exact text."""
    header = (
        "# Generated by tools/grafana_alerts.py from alerts.yaml: do not edit; run\n"
        "# python tools/grafana_alerts.py --write. Grafana alert provisioning (apiVersion 1).\n"
    )
    body = yaml.dump(build(), Dumper=_Dumper, sort_keys=False, width=1 << 16, allow_unicode=True)
    return header + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", action="store_true", help=f"write {OUTPUT.name}")
    group.add_argument("--check", action="store_true", help="fail when the file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        OUTPUT.write_text(text, encoding="utf-8")
        return 0
    if not OUTPUT.exists() or OUTPUT.read_text(encoding="utf-8") != text:
        print(f"{OUTPUT} is stale: run python tools/grafana_alerts.py --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
