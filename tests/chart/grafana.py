"""Grafana's alert provisioning file, validated against grafana-foundation-sdk's models, and
how Grafana evaluates rules of the shape its Prometheus-rule converter writes.

The file's envelope (apiVersion, groups with orgId, name, folder, interval) follows
pkg/services/provisioning/alerting/rules_types.go (AlertRuleGroupV1, AlertRuleV1, QueryV1)
in github.com/grafana/grafana; the SDK has no model of it, only of the rules, queries and
query models inside, which must survive a round trip through the SDK's models unchanged
(an unknown or misspelt key, a value outside a Literal, a query model of no known kind
fails).
"""

from __future__ import annotations

import json
import math
import re
import typing
from typing import Any

from grafana_foundation_sdk.cog import plugins, runtime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import alerting, expr
from pydantic import BaseModel, ConfigDict, Field, ValidationError

# The SDK decodes query models by data source type once its variants are registered.
plugins.register_default_plugins()

# Prometheus' model.ParseDuration, which rules_types.go parses `for` and `interval` with.
DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
# pkg/services/ngalert/models/alert_rule.go: the annotations that link a rule to a panel.
DASHBOARD_UID, PANEL_ID = "__dashboardUid__", "__panelId__"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Group(_Strict):
    """AlertRuleGroupV1: MapToModel refuses an empty name or folder, parses interval."""

    orgId: int = Field(ge=1)  # the file's key
    name: str = Field(min_length=1)
    folder: str = Field(min_length=1)
    interval: str = Field(pattern=DURATION)
    rules: list[dict[str, Any]] = Field(min_length=1)


class File(_Strict):
    apiVersion: typing.Literal[1]  # the file's key
    groups: list[Group] = Field(min_length=1)


def _encoded(obj: object) -> Any:
    return json.loads(json.dumps(obj, cls=JSONEncoder))


def _literal(model: type, field: str) -> tuple[str, ...]:
    return typing.get_args(typing.get_type_hints(model)[field])


def _round_trip(what: str, given: dict[str, Any], model: Any, nested: str = "") -> None:
    """``given`` read into ``model`` and written back: every key kept, every value equal
    (but ``nested``'s, which its caller checks item by item)."""
    back = _encoded(model.from_json(given))
    lost = sorted(set(given) - set(back))
    if lost:
        raise AssertionError(f"{what}: {model.__name__} has no field {lost}")
    for key, value in given.items():
        if key != nested and back[key] != value:
            raise AssertionError(f"{what}.{key}: {value!r} reads back as {back[key]!r}")


def _query_model(what: str, model: dict[str, Any]) -> None:
    decoded = runtime.dataquery_from_json(model, "")
    if isinstance(decoded, runtime.UnknownDataquery):
        raise AssertionError(f"{what}: a query model of no known kind: {model.get('datasource')}")
    _round_trip(what, model, type(decoded))
    if isinstance(decoded, expr.TypeThreshold):
        for condition in decoded.conditions or []:
            kinds = _literal(expr.ExprTypeThresholdConditionsEvaluator, "type_val")
            if condition.evaluator.type_val not in kinds:
                raise AssertionError(f"{what}: threshold {condition.evaluator.type_val!r}")


def validate_rule(what: str, rule: dict[str, Any]) -> None:
    """One rule of a provisioning file; AssertionError naming the field."""
    # The SDK's Rule also holds what the file keeps on the group (folderUID, orgID, ruleGroup).
    _round_trip(what, rule, alerting.Rule, nested="data")
    for field, key in (("exec_err_state", "execErrState"), ("no_data_state", "noDataState")):
        if rule.get(key) not in _literal(alerting.Rule, field):
            raise AssertionError(f"{what}.{key}: {rule.get(key)!r}")
    # AlertRuleV1.mapToModel: a title, a UID, a condition, some data, a parseable `for`.
    for key in ("uid", "title", "condition"):
        if not rule.get(key):
            raise AssertionError(f"{what}: no {key}")
    if not re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", rule["uid"]):
        raise AssertionError(f"{what}.uid: {rule['uid']!r} is not a Grafana UID")
    if not re.fullmatch(DURATION, str(rule.get("for", ""))):
        raise AssertionError(f"{what}.for: {rule.get('for')!r}")
    refs = [q.get("refId") for q in rule.get("data", [])]
    if not refs or rule["condition"] not in refs:
        raise AssertionError(f"{what}.condition: {rule['condition']!r} is none of {refs}")
    for i, query in enumerate(rule["data"]):
        _round_trip(f"{what}.data[{i}]", query, alerting.Query, nested="model")
        _query_model(f"{what}.data[{i}].model", query["model"])
    # SetDashboardAndPanelFromAnnotations: both or neither, and the panel an integer.
    annotations = rule.get("annotations") or {}
    if (DASHBOARD_UID in annotations) != (PANEL_ID in annotations):
        raise AssertionError(f"{what}: {DASHBOARD_UID} and {PANEL_ID} go together")
    if PANEL_ID in annotations and not annotations[PANEL_ID].isdigit():
        raise AssertionError(f"{what}.annotations.{PANEL_ID}: {annotations[PANEL_ID]!r}")


def validate_provisioning(doc: dict[str, Any]) -> None:
    """A Grafana alert provisioning file (apiVersion 1); AssertionError naming the field."""
    try:
        parsed = File.model_validate(doc)
    except ValidationError as e:
        first = e.errors()[0]
        path = ".".join(str(p) for p in first["loc"])
        raise AssertionError(f"provisioning file invalid at .{path}: {first['msg']}") from None
    uids: set[str] = set()
    for g, group in enumerate(parsed.groups):
        for r, rule in enumerate(group.rules):
            validate_rule(f"groups[{g}].rules[{r}]", rule)
            if rule["uid"] in uids:
                raise AssertionError(f"groups[{g}].rules[{r}].uid: {rule['uid']} twice")
            uids.add(rule["uid"])


# --- evaluation -------------------------------------------------------------------------

# The three nodes of pkg/services/ngalert/prom/query.go (createQueryNode, createMathNode,
# createThresholdNode): the only shape alerting() below knows how to evaluate.
MATH = "is_number($query) || is_nan($query) || is_inf($query)"


def promql(rule: dict[str, Any]) -> str:
    """The PromQL a rule of the converter's shape sends its data source (an instant query)."""
    query, math, threshold = rule["data"]
    assert query["refId"] == "query" and query["model"]["instant"] is True, query
    assert math["model"] == {
        "expression": MATH,
        "refId": "prometheus_math",
        "type": "math",
        "datasource": {"type": "__expr__", "uid": "__expr__"},
    }, math
    assert threshold["model"]["expression"] == "prometheus_math", threshold
    assert threshold["model"]["conditions"] == [{"evaluator": {"params": [0], "type": "gt"}}]
    assert rule["condition"] == "threshold" and rule["noDataState"] == "OK", rule
    expression: str = query["model"]["expr"]
    return expression


def alerting_instances(
    rule: dict[str, Any], result: list[dict[str, Any]]
) -> set[frozenset[tuple[str, str]]]:
    """The label sets a rule alerts for, given its instant query's result vector.

    Each series of the result is one alert instance (pkg/services/ngalert/eval/eval.go);
    the math node is 1 for any number, NaN or Inf (is_number, is_nan and is_inf of
    pkg/expr/mathexp/funcs.go joined by ||), the threshold node keeps what is above 0
    (pkg/expr/threshold.go), so every returned series alerts, as the converter means it to
    (pkg/services/ngalert/prom/query.go, createQuery); no series is NoData, which
    noDataState OK keeps Normal. ``__name__`` is left out, as Prometheus leaves it out of
    an alert's labels.
    """
    promql(rule)
    alerting: set[frozenset[tuple[str, str]]] = set()
    for series in result:
        value = float(series["value"][1])
        is_nan, is_inf = math.isnan(value), math.isinf(value)
        prometheus_math = float((not is_nan and not is_inf) or is_nan or is_inf)
        if prometheus_math > 0:
            alerting.add(frozenset((k, v) for k, v in series["metric"].items() if k != "__name__"))
    return alerting
