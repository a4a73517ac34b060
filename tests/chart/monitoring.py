"""The monitoring.coreos.com/v1 objects the chart writes, as strict pydantic models, and
the series names resumequal exposes.

Field names, types and patterns follow prometheus-operator's CRDs
(example/prometheus-operator-crd/monitoring.coreos.com_{prometheusrules,servicemonitors}.yaml
in github.com/prometheus-operator/prometheus-operator, v0.82). The models cover the fields
this chart uses and forbid any other, so a misspelt field fails here instead of being
pruned silently by the API server.
"""

from __future__ import annotations

from typing import Any, Literal

from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from resumequal.results.metrics import QualificationMetrics

DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ObjectMeta(_Strict):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    namespace: str
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class Rule(_Strict):
    alert: str | None = None
    record: str | None = None
    expr: str
    for_: str | None = Field(default=None, alias="for", pattern=DURATION)
    keep_firing_for: str | None = Field(default=None, pattern=DURATION, min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    def model_post_init(self, context: Any, /) -> None:
        if (self.alert is None) == (self.record is None):
            raise ValueError("exactly one of alert and record must be set")
        if self.record is not None and self.annotations:
            raise ValueError(f"{self.record}: annotations are for alerting rules only")


class RuleGroup(_Strict):
    name: str = Field(min_length=1)
    interval: str | None = Field(default=None, pattern=DURATION)
    limit: int | None = None
    rules: list[Rule]


class PrometheusRuleSpec(_Strict):
    groups: list[RuleGroup]


class PrometheusRule(_Strict):
    api_version: Literal["monitoring.coreos.com/v1"] = Field(alias="apiVersion")
    kind: Literal["PrometheusRule"]
    metadata: ObjectMeta
    spec: PrometheusRuleSpec


class LabelSelector(_Strict):
    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")


class NamespaceSelector(_Strict):
    any: bool | None = None
    match_names: list[str] = Field(default_factory=list, alias="matchNames")


class Endpoint(_Strict):
    port: str
    path: str | None = None
    scheme: Literal["http", "https", "HTTP", "HTTPS"] | None = None
    interval: str | None = Field(default=None, pattern=DURATION)
    scrape_timeout: str | None = Field(default=None, alias="scrapeTimeout", pattern=DURATION)
    honor_labels: bool | None = Field(default=None, alias="honorLabels")


class ServiceMonitorSpec(_Strict):
    job_label: str | None = Field(default=None, alias="jobLabel")
    selector: LabelSelector
    namespace_selector: NamespaceSelector | None = Field(default=None, alias="namespaceSelector")
    endpoints: list[Endpoint]


class ServiceMonitor(_Strict):
    api_version: Literal["monitoring.coreos.com/v1"] = Field(alias="apiVersion")
    kind: Literal["ServiceMonitor"]
    metadata: ObjectMeta
    spec: ServiceMonitorSpec


MODELS: dict[str, type[BaseModel]] = {
    "PrometheusRule": PrometheusRule,
    "ServiceMonitor": ServiceMonitor,
}


def validate_monitoring(obj: dict[str, Any]) -> None:
    """A monitoring.coreos.com/v1 object; AssertionError naming the field on failure."""
    what = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')!r}"
    model = MODELS.get(str(obj.get("kind")))
    if model is None:
        raise AssertionError(f"{what}: not a monitoring object this chart writes")
    try:
        model.model_validate(obj)
    except ValidationError as e:
        first = e.errors()[0]
        path = ".".join(str(p) for p in first["loc"])
        raise AssertionError(f"{what} invalid at .{path}: {first['msg']}") from None


# The operator's own families (resumequal-operator run serves them next to the
# qualification families of resumequal.results.metrics).
OPERATOR_FAMILIES = {
    "resumequal_operator_reconcile_total",
    "resumequal_operator_reconcile_errors_total",
    "resumequal_operator_queue_depth",
    "resumequal_operator_reconcile_duration_seconds",
    "resumequal_operator_queue_wait_seconds",
    "resumequal_operator_api_request_duration_seconds",
    "resumequal_operator_events_dropped_total",
    "resumequal_operator_leader",
    "resumequal_operator_build_info",
}


def metric_names() -> set[str]:
    """Every series name resumequal exposes: its qualification and operator families."""
    registry = CollectorRegistry()
    QualificationMetrics(registry)
    known: set[str] = set()
    for family in registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}
        known |= {family.name + s for s in suffixes.get(family.type, [""])}
    for name in OPERATOR_FAMILIES:
        known |= {name, f"{name}_bucket", f"{name}_count", f"{name}_sum"}
    return known
