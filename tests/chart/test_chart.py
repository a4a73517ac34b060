"""The Helm chart, rendered by the real Helm engine (helm-python-sdk) and every object
validated: built-in kinds against Kubernetes' strict schemas, monitoring.coreos.com kinds
against strict models, QualificationRuns against the chart's own CRD."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from helm_python import _native as helm_native

from resumequal_operator import main as operator_main
from resumequal_operator.allowlist import Allowlist, SecurityAllowlist
from resumequal_operator.runkeys import MasterKey
from resumequal_operator.trainjob import leg_runtime
from resumequal_operator.validation import parse_run_spec
from testing import k8s_schemas
from tests.chart.monitoring import validate_monitoring
from tests.tools import require

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts/resumequal"
VALUES_ALL = ROOT / "tests/chart/values-all.yaml"
K8S_VERSION = "1.33.0"
RELEASE, NAMESPACE = "rq", "resumequal"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as c:
        yield c


# What a cluster with prometheus-operator serves: `--api-versions` of `helm template`.
MONITORING_APIS = ("monitoring.coreos.com/v1/ServiceMonitor",
                   "monitoring.coreos.com/v1/PrometheusRule")


def render_manifests(chart: helm.Chart, values: Obj | None = None,
                     api_versions: Sequence[str] = MONITORING_APIS) -> dict[str, str]:
    """Each template's output, as `helm template --api-versions ...` prints it."""
    # Chart.render does not pass api_versions on, though the engine takes them.
    opts = {"name": RELEASE, "namespace": NAMESPACE, "api_versions": list(api_versions)}
    out: dict[str, str] = json.loads(helm_native.call_string(
        "helm_render", chart._raw(), json.dumps(values) if values is not None else None,
        json.dumps(opts)))
    return out


def render(chart: helm.Chart, values: Obj | None = None,
           api_versions: Sequence[str] = MONITORING_APIS) -> list[Obj]:
    """Every object the chart renders (NOTES.txt left out), in template order, on a cluster
    serving ``api_versions`` besides the built-in ones."""
    out = render_manifests(chart, values, api_versions)
    objs: list[Obj] = []
    for name in sorted(out):
        if name.endswith("NOTES.txt"):
            continue
        objs.extend(d for d in yaml.safe_load_all(out[name]) if d)
    return objs


def values_all() -> Obj:
    data: Obj = yaml.safe_load(VALUES_ALL.read_text())
    return data


def by_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[Obj], kind: str) -> Obj:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def named(objs: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in by_kind(objs, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} objects named {name}"
    return found[0]


def validate(obj: Obj) -> None:
    what = f"{obj['kind']} {obj['metadata'].get('name')!r}"
    if obj["apiVersion"].startswith("monitoring.coreos.com/"):
        validate_monitoring(obj)
        return
    if obj["apiVersion"].startswith("trainer.kubeflow.org/"):
        k8s_schemas.validate_trainer(obj)
        return
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.caused_by.absolute_path)
        raise AssertionError(f"{what} invalid at .{path}: {e.caused_by.message}") from None


def args_of(deployment: Obj) -> list[str]:
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


@pytest.mark.parametrize("variant", ["default", "all"])
def test_every_rendered_object_is_valid(chart: helm.Chart, variant: str) -> None:
    objs = render(chart, values_all() if variant == "all" else None)
    assert objs
    for obj in objs:
        validate(obj)
    names = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]
    assert len(names) == len(set(names)), "two objects share kind, namespace and name"


def test_default_render(chart: helm.Chart) -> None:
    objs = render(chart)
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == sorted(
        [
            "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment",
            "PrometheusRule", "Role", "Role", "RoleBinding", "RoleBinding", "Secret",
            "Service", "ServiceAccount", "ServiceMonitor",
        ]
    )  # fmt: skip
    dep = one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 1
    assert args_of(dep) == [
        "run",
        "--port=8080",
        f"--namespace={NAMESPACE}",
        "--leader-elect",
        "--lease-name=resumequal-operator",
        f"--lease-namespace={NAMESPACE}",
        "--resync-seconds=60",
        "--workers=2",
        "--log-level=INFO",
        "--crd=apply",
        "--key-file=/var/run/resumequal/master-key/key",
        "--default-backend=pytorchjob",
    ]
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "ghcr.io/resumequal/resumequal-operator:0.1.0"
    )


def test_operator_pod_is_locked_down(chart: helm.Chart) -> None:
    for values in (None, values_all()):
        pod = one(render(chart, values), "Deployment")["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        (c,) = pod["containers"]
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        port = {p["name"]: p["containerPort"] for p in c["ports"]}["http-metrics"]
        assert c["livenessProbe"]["httpGet"]["port"] == "http-metrics"
        assert f"--port={port}" in c["args"]
        env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"][:2]}
        assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}


def test_all_values_render(chart: helm.Chart) -> None:
    objs = render(chart, values_all())
    dep = one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    args = args_of(dep)
    assert [a for a in args if a.startswith("--namespace=")] == [
        "--namespace=training",
        "--namespace=research",
        "--namespace=ci",
    ]
    assert "--leader-elect" in args and "--lease-name=resumequal-leader" in args
    assert "--port=9090" in args and "--workers=4" in args
    at = args.index("--default-backend=trainjob")
    assert args[at:at + 4] == ["--default-backend=trainjob", "--trainjob",
                               "--trainjob-runtime=rq-leg",
                               "--trainjob-runtime-kind=TrainingRuntime"]
    # A TrainingRuntime in each watched namespace, the operator's own runtime object.
    runtimes = by_kind(objs, "TrainingRuntime")
    assert [r["metadata"]["namespace"] for r in runtimes] == ["training", "research", "ci"]
    for r in runtimes:
        labels = {k: v for k, v in r["metadata"]["labels"].items()
                  if k != "trainer.kubeflow.org/framework"}
        assert r == leg_runtime("rq-leg", kind="TrainingRuntime",
                                namespace=r["metadata"]["namespace"], backoff_limit=12,
                                labels=labels)
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == (
        "ghcr.io/resumequal/resumequal-operator:0.1.0-rc1@sha256:" + "0123456789abcdef" * 4
    )
    assert {"name": "LOG_FORMAT", "value": "json"} in container["env"]

    sm = one(objs, "ServiceMonitor")
    assert sm["metadata"]["namespace"] == "monitoring"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    service = one(objs, "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    # The run's own namespace label must survive the scrape.
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True
    assert service["metadata"]["labels"][sm["spec"]["jobLabel"]] == "resumequal-operator"
    assert service["spec"]["ports"][0]["port"] == 9090

    cm = [o for o in by_kind(objs, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    assert cm[0]["metadata"]["labels"]["grafana_dashboard"] == "resumequal"
    assert cm[0]["metadata"]["annotations"] == {"grafana_folder": "Training"}


def _rules(role: Obj) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


# What the operator requests (tests/operator/test_rbac.py), and no more.
OPERATOR_RULES = (
    {("resumequal.dev", "qualificationruns", v) for v in ("get", "list", "watch", "patch")}
    | {("resumequal.dev", "qualificationruns/status", "update")}
    | {("resumequal.dev", "qualificationruns/finalizers", "update")}  # blockOwnerDeletion
    # Its own jobs are watched (by its managed-by label) and read from that cache.
    | {("kubeflow.org", "pytorchjobs", v) for v in ("get", "list", "watch", "create", "delete")}
    | {("kubeflow.org", "pytorchjobs", "patch")}  # a resize's Worker replicas
    | {("batch", "jobs", v) for v in ("get", "list", "watch", "create", "delete")}
    | {("", "pods", v) for v in ("get", "delete")}
    | {("", "events", "create")}
    | {("", "secrets", "create")}  # each run's checkpoint key, never read back
    | {("networking.k8s.io", "networkpolicies", "create")}  # each leg's (networkPolicy)
)


# With TrainJob legs (trainjob.enabled): the same for TrainJobs, never patched (no resize).
TRAINJOB_RULES = {("trainer.kubeflow.org", "trainjobs", v)
                  for v in ("get", "list", "watch", "create", "delete")}


def test_rbac_is_least_privilege_per_watched_namespace(chart: helm.Chart) -> None:
    objs = render(chart, values_all())
    roles = {o["metadata"]["name"]: o for o in by_kind(objs, "Role")}
    watched = {"training", "research", "ci"}
    run_roles = [o for o in by_kind(objs, "Role") if o["metadata"]["name"] == "rq-resumequal"]
    assert {r["metadata"]["namespace"] for r in run_roles} == watched
    for role in run_roles:
        assert _rules(role) == OPERATOR_RULES | TRAINJOB_RULES
    bindings = [b for b in by_kind(objs, "RoleBinding") if b["roleRef"]["name"] == "rq-resumequal"]
    assert {b["metadata"]["namespace"] for b in bindings} == watched
    for b in bindings:
        assert b["subjects"] == [
            {"kind": "ServiceAccount", "name": "rq-resumequal", "namespace": NAMESPACE}
        ]
    lease = roles["rq-resumequal-leader-election"]
    assert lease["metadata"]["namespace"] == NAMESPACE
    assert _rules(lease) == {
        ("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")
    }
    assert [r.get("resourceNames") for r in lease["rules"]] == [None, ["resumequal-leader"]]
    for obj in by_kind(objs, "Role") + by_kind(objs, "ClusterRole"):
        for group, resource, verb in _rules(obj):
            assert "*" not in (group, resource, verb), obj["metadata"]["name"]
            assert resource != "secrets" or verb == "create", (
                f"{obj['metadata']['name']} reads secrets")
    # Cluster-wide: only its own CRD (Helm never upgrades crds/; the operator applies it).
    [crd_role] = by_kind(objs, "ClusterRole")
    assert crd_role["metadata"]["name"] == "rq-resumequal-crd"
    assert _rules(crd_role) == {("apiextensions.k8s.io", "customresourcedefinitions", v)
                                for v in ("get", "update", "create")}
    assert [r.get("resourceNames") for r in crd_role["rules"]] == [
        ["qualificationruns.resumequal.dev"], None]
    [crd_binding] = by_kind(objs, "ClusterRoleBinding")
    assert crd_binding["roleRef"]["name"] == "rq-resumequal-crd"


@pytest.mark.parametrize(("policy", "verbs"), [("verify", {"get"}), ("skip", None)])
def test_crd_policy_narrows_the_crd_role(chart: helm.Chart, policy: str,
                                         verbs: set[str] | None) -> None:
    objs = render(chart, {"operator": {"crdPolicy": policy}})
    assert f"--crd={policy}" in args_of(one(objs, "Deployment"))
    roles = [o for o in by_kind(objs, "ClusterRole") if o["metadata"]["name"].endswith("-crd")]
    if verbs is None:
        assert roles == []
    else:
        assert {v for _, _, v in _rules(roles[0])} == verbs
    with pytest.raises(helm.HelmValuesError, match="crdPolicy"):
        render(chart, {"operator": {"crdPolicy": "sometimes"}})


def test_all_namespaces_uses_one_cluster_role(chart: helm.Chart) -> None:
    objs = render(chart, {"watch": {"allNamespaces": True}})
    assert "--all-namespaces" in args_of(one(objs, "Deployment"))
    assert not [a for a in args_of(one(objs, "Deployment")) if a.startswith("--namespace=")]
    [role] = [o for o in by_kind(objs, "ClusterRole") if o["metadata"]["name"] == "rq-resumequal"]
    assert _rules(role) == OPERATOR_RULES
    [binding] = [o for o in by_kind(objs, "ClusterRoleBinding")
                 if o["metadata"]["name"] == "rq-resumequal"]
    assert binding["subjects"][0]["namespace"] == NAMESPACE
    # Only the lease Role stays namespaced.
    assert [r["metadata"]["name"] for r in by_kind(objs, "Role")] == [
        "rq-resumequal-leader-election"
    ]


def test_leader_election(chart: helm.Chart) -> None:
    objs = render(chart, {"leaderElection": {"enabled": False}})
    assert "--no-leader-elect" in args_of(one(objs, "Deployment"))
    assert not [r for r in by_kind(objs, "Role") if "leader" in r["metadata"]["name"]]
    with pytest.raises(helm.HelmRenderError, match=r"leaderElection\.enabled"):
        render(chart, {"replicas": 2, "leaderElection": {"enabled": False}})


def test_nightly_cronjob(chart: helm.Chart) -> None:
    objs = render(chart, values_all())
    cron = one(objs, "CronJob")
    assert cron["metadata"]["namespace"] == "training"
    assert cron["spec"]["schedule"] == "30 1 * * *"
    assert cron["spec"]["timeZone"] == "Europe/Berlin"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    # A retry would create the runs of a partly created night again.
    assert cron["spec"]["jobTemplate"]["spec"]["backoffLimit"] == 0
    assert cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "registry.k8s.io/kubectl:v1.31.4"
    assert c["args"] == ["create", "-f", "/etc/resumequal/qualificationruns.yaml"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["runAsUser"] == 65532
    # Its own account, allowed to create QualificationRuns and nothing else.
    assert pod["serviceAccountName"] == "rq-resumequal-nightly"
    role = named(objs, "Role", "rq-resumequal-nightly")
    assert role["metadata"]["namespace"] == "training"
    assert _rules(role) == {("resumequal.dev", "qualificationruns", "create")}

    cm = named(objs, "ConfigMap", "rq-resumequal-nightly")
    runs = [d for d in yaml.safe_load_all(cm["data"]["qualificationruns.yaml"]) if d]
    assert [r["metadata"]["generateName"] for r in runs] == [
        "nightly-torch-nightly-",
        "nightly-torch-stable-",
    ]
    first, second = (r["spec"] for r in runs)
    assert first["stack"]["image"].startswith("ghcr.io/acme/train@sha256:")
    assert first["stack"]["pin"] == "torch-nightly"
    assert second["stack"] == {
        "image": "ghcr.io/acme/train:2.7.1-cu126",
        "imagePullSecrets": ["ghcr-pull"],
        "imagePullPolicy": "IfNotPresent",
    }
    assert first["store"]["uri"] == "s3://resumequal-runs/nightly"
    assert all(r["metadata"]["namespace"] == "training" for r in runs)


def test_nightly_runs_are_valid_qualificationruns(chart: helm.Chart) -> None:
    objs = render(chart, values_all())
    cm = named(objs, "ConfigMap", "rq-resumequal-nightly")
    for run in yaml.safe_load_all(cm["data"]["qualificationruns.yaml"]):
        # The API server turns generateName into a name.
        run["metadata"]["name"] = run["metadata"].pop("generateName") + "x7k2q"
        k8s_schemas.validate_qualificationrun(run)


def test_nightly_needs_pins_a_store_and_a_watched_namespace(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmValuesError) as e:
        render(chart, {"nightly": {"enabled": True}})
    assert "/nightly/pins" in str(e.value) and "/nightly/spec" in str(e.value)
    pins = [{"name": "p", "image": "img:1.0.0"}]
    with pytest.raises(helm.HelmValuesError, match="/nightly/spec/store"):
        render(chart, {"nightly": {"enabled": True, "pins": pins, "spec": {"store": {}}}})
    nightly = {"enabled": True, "pins": pins, "spec": {"store": {"uri": "s3://b/p"}}}
    with pytest.raises(helm.HelmRenderError, match=r"nightly\.namespace: elsewhere"):
        render(chart, {"nightly": {**nightly, "namespace": "elsewhere"}})
    objs = render(
        chart,
        {"watch": {"allNamespaces": True}, "nightly": {**nightly, "namespace": "elsewhere"}},
    )
    assert one(objs, "CronJob")["metadata"]["namespace"] == "elsewhere"
    # Off, nothing is asked of it.
    assert not by_kind(render(chart, {"nightly": {"enabled": False, "pins": []}}), "CronJob")


def test_optional_parts_can_be_turned_off(chart: helm.Chart) -> None:
    objs = render(
        chart,
        {
            "serviceMonitor": {"enabled": False},
            "prometheusRule": {"enabled": False},
            "grafanaDashboard": {"enabled": False},
            "serviceAccount": {"create": False, "name": "existing"},
            "rbac": {"create": False},
            "operator": {"masterKeySecret": "my-master-key"},
        },
    )
    assert sorted(o["kind"] for o in objs) == ["Deployment", "Service"]
    volumes = one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "master-key", "secret": {
        "secretName": "my-master-key", "defaultMode": 0o440,
        "items": [{"key": "key", "path": "key"}]}} in volumes
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "existing"


def test_monitoring_objects_need_the_prometheus_operator_apis(chart: helm.Chart) -> None:
    kinds = {o["kind"] for o in render(chart, api_versions=())}
    assert kinds.isdisjoint({"ServiceMonitor", "PrometheusRule"})
    only_monitor = render(chart, api_versions=MONITORING_APIS[:1])
    assert one(only_monitor, "ServiceMonitor")["spec"]["endpoints"][0]["honorLabels"] is True
    assert not by_kind(only_monitor, "PrometheusRule")
    assert {o["kind"] for o in render(chart)} >= {"ServiceMonitor", "PrometheusRule"}


def test_notes_say_what_a_plain_cluster_goes_without(chart: helm.Chart) -> None:
    plain = render_manifests(chart, api_versions=())["resumequal/templates/NOTES.txt"]
    assert "no PrometheusRule" in plain and "no ServiceMonitor" in plain
    full = render_manifests(chart)["resumequal/templates/NOTES.txt"]
    assert "Alerts: PrometheusRule rq-resumequal" in full and "no ServiceMonitor" not in full


def test_plain_cluster_render_is_valid(chart: helm.Chart) -> None:
    for obj in render(chart, api_versions=()):
        assert not obj["apiVersion"].startswith("monitoring.coreos.com/")
        validate(obj)


def test_prometheus_rule_embeds_the_alert_file(chart: helm.Chart) -> None:
    rule = one(render(chart), "PrometheusRule")
    alerts = yaml.safe_load((CHART / "files/alerts.yaml").read_text())
    # The default threshold in values.yaml is the one in the file: the same rules exactly.
    assert rule["spec"]["groups"] == alerts["groups"]
    annotations = [
        r["annotations"]["summary"]
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r
    ]
    # Prometheus' own templates arrive untouched by Helm's.
    assert "Pin {{ $labels.pin }} is not resume-exact" in annotations[0]


def test_prometheus_rule_overrides(chart: helm.Chart, tmp_path: Path) -> None:
    rule = one(render(chart, values_all()), "PrometheusRule")
    assert rule["metadata"]["namespace"] == "monitoring"
    rules = {r.get("alert") or r["record"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert rules["resumequal:drift_threshold:param_rel_l2"]["expr"] == "vector(0.0005)"
    assert "ReconcileErrors" not in rules
    assert rules["OperatorDown"]["for"] == "10m"
    assert rules["OperatorDown"]["labels"] == {"severity": "warning", "team": "ml-platform"}
    assert rules["QualificationFailed"]["labels"] == {"severity": "critical", "team": "ml-platform"}
    # What the chart produced is still a rule file Prometheus accepts.
    promtool = require("promtool")
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_configmap_holds_the_committed_json(chart: helm.Chart) -> None:
    cm = named(render(chart), "ConfigMap", "rq-resumequal-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    committed = (CHART / "files/dashboard.json").read_text()
    assert json.loads(cm["data"]["resumequal.json"]) == json.loads(committed)


def test_crd_ships_with_the_chart(chart: helm.Chart) -> None:
    (crd,) = chart.crds
    doc = yaml.safe_load(crd["data"])
    assert doc["kind"] == "CustomResourceDefinition"
    assert doc["spec"]["group"] == "resumequal.dev"
    assert doc["spec"]["names"]["kind"] == "QualificationRun"


@pytest.mark.parametrize("variant", ["default", "all"])
def test_lint(variant: str) -> None:
    values = values_all() if variant == "all" else None
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == []


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"replicas": "two"}, "/replicas"),
        ({"replicas": -1}, "/replicas"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"watch": {"namespaces": ["Not_A_Namespace"]}}, "/watch/namespaces/0"),
        ({"operator": {"port": 70000}}, "/operator/port"),
        ({"operator": {"workers": 0}}, "/operator/workers"),
        ({"operator": {"logLevel": "chatty"}}, "/operator/logLevel"),
        ({"serviceMonitor": {"interval": "soon"}}, "/serviceMonitor/interval"),
        ({"prometheusRule": {"driftThreshold": -1}}, "/prometheusRule/driftThreshold"),
        ({"prometheusRule": {"driftThreshold": "small"}}, "/prometheusRule/driftThreshold"),
        ({"prometheusRule": {"alerts": {"QualificationFaild": {}}}}, "/prometheusRule/alerts"),
        (
            {"prometheusRule": {"alerts": {"OperatorDown": {"for": "5 minutes"}}}},
            "/prometheusRule/alerts/OperatorDown/for",
        ),
        (
            {"prometheusRule": {"alerts": {"OperatorDown": {"severity": "page"}}}},
            "/prometheusRule/alerts/OperatorDown/severity",
        ),
        ({"nightly": {"pins": [{"name": "p"}]}}, "/nightly/pins/0"),
        ({"nightly": {"pins": [{"name": "P!", "image": "i:1.0.0"}]}}, "/nightly/pins/0/name"),
        ({"nightly": {"pins": [{"name": "p", "image": "i:1.0.0", "pin": "x'} or vector(1)"}]}},
         "/nightly/pins/0/pin"),
        ({"serviceMonitor": {"enabled": "yes"}}, "/serviceMonitor/enabled"),
        ({"leaderElection": {"enable": True}}, "/leaderElection"),
        ({"replica": 2}, "'replica'"),
        ({"backend": "mpijob"}, "/backend"),
        ({"trainjob": {"runtime": {"kind": "Runtime"}}}, "/trainjob/runtime/kind"),
        ({"trainjob": {"runtime": {"name": "Not A Name"}}}, "/trainjob/runtime/name"),
        ({"trainjob": {"runtime": {"backoffLimit": -1}}}, "/trainjob/runtime/backoffLimit"),
    ],
)
def test_schema_rejects_bad_values(chart: helm.Chart, values: Obj, field: str) -> None:
    with pytest.raises(helm.HelmValuesError) as e:
        render(chart, values)
    assert field in str(e.value)


def test_defaults_satisfy_the_schema(chart: helm.Chart) -> None:
    chart.validate_schema(chart.values)
    chart.validate_schema(values_all())


@pytest.mark.parametrize("variant", ["default", "all", "allNamespaces", "noLeader"])
def test_the_operator_accepts_the_arguments(chart: helm.Chart, variant: str) -> None:
    values = {
        "default": None,
        "all": values_all(),
        "allNamespaces": {"watch": {"allNamespaces": True}},
        "noLeader": {"leaderElection": {"enabled": False}},
    }[variant]
    container = one(render(chart, values), "Deployment")["spec"]["template"]["spec"]
    command, *args = container["containers"][0]["args"]
    run = operator_main.main.commands[command]
    # Parses and converts every option as `resumequal-operator run ...` would.
    with run.make_context(command, list(args)) as ctx:
        assert ctx.params["port"] == container["containers"][0]["ports"][0]["containerPort"]
        assert ctx.params["leader_elect"] is (variant != "noLeader")
        assert ctx.params["all_namespaces"] is (variant == "allNamespaces")
        assert ctx.params["trainjob"] is (variant == "all")


def _allowlist(chart: helm.Chart, values: Obj | None) -> Allowlist:
    """The allowlist the operator runs with, from the rendered Deployment's arguments."""
    container = one(render(chart, values), "Deployment")["spec"]["template"]["spec"]
    command, *args = container["containers"][0]["args"]
    run = operator_main.main.commands[command]
    with run.make_context(command, list(args)) as ctx:
        p = ctx.params
        security = operator_main.security_allowlist_of(
            p["allow_privileged"], p["allow_run_as_root"], p["allow_privilege_escalation"],
            p["allow_unconfined"], p["allow_capabilities"], p["allow_sysctls"])
        return operator_main.allowlist_of(p["allow_images"], p["allow_service_accounts"],
                                          p["allow_buckets"], p["allow_endpoints"],
                                          security=security)


def test_the_allowlist_values_become_the_operators_allowlist(chart: helm.Chart) -> None:
    assert _allowlist(chart, None) == Allowlist()  # nothing restricted but endpoints
    allowlist = _allowlist(chart, values_all())
    assert allowlist == Allowlist(
        images=("ghcr.io/acme/*", "registry.internal/train@sha256:*"),
        service_accounts=("default", "resumequal-*"),
        buckets=("resumequal-runs", "acme-ci-*"),
        endpoints=("http://minio.storage.svc:9000",),
        security=SecurityAllowlist(run_as_root=True, unconfined=True,
                                   capabilities=("SYS_PTRACE", "IPC_LOCK"),
                                   sysctls=("net.ipv4.tcp_*",)))
    # Each entry is one argument, whatever it holds.
    odd = {"allowlist": {"images": ["reg.example/a b*"]}}
    with pytest.raises(helm.HelmValuesError, match="/allowlist/images/0"):
        render(chart, odd)
    # The chart's own nightly runs pass the allowlist it configures.
    cm = named(render(chart, values_all()), "ConfigMap", "rq-resumequal-nightly")
    for run in yaml.safe_load_all(cm["data"]["qualificationruns.yaml"]):
        assert allowlist.refusals(parse_run_spec(run["spec"])) == []


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"allowlist": {"endpoints": ["http://u:p@minio:9000"]}}, "/allowlist/endpoints/0"),
        ({"allowlist": {"endpoints": ["ftp://minio"]}}, "/allowlist/endpoints/0"),
        ({"allowlist": {"images": [""]}}, "/allowlist/images/0"),
        ({"allowlist": {"buckets": "b"}}, "/allowlist/buckets"),
        ({"allowlist": {"image": ["x"]}}, "/allowlist"),
        ({"allowlist": {"security": {"privileged": "yes"}}}, "/allowlist/security/privileged"),
        ({"allowlist": {"security": {"capabilities": ["SYS ADMIN"]}}},
         "/allowlist/security/capabilities/0"),
        ({"allowlist": {"security": {"hostNetwork": True}}}, "/allowlist/security"),
        ({"networkPolicy": {"enabled": "no"}}, "/networkPolicy/enabled"),
    ],
)
def test_the_schema_rejects_bad_allowlists(chart: helm.Chart, values: Obj, field: str) -> None:
    with pytest.raises(helm.HelmValuesError) as e:
        render(chart, values)
    assert field in str(e.value)


def test_the_trainjob_runtime_is_the_one_the_operator_names(chart: helm.Chart) -> None:
    objs = render(chart, {"trainjob": {"enabled": True}})
    [runtime] = by_kind(objs, "ClusterTrainingRuntime")
    labels = {k: v for k, v in runtime["metadata"]["labels"].items()
              if k != "trainer.kubeflow.org/framework"}
    # The chart's template and the function the operator's tests run legs on are one object.
    assert runtime == leg_runtime(labels=labels)
    args = args_of(one(objs, "Deployment"))
    assert args[-4:] == ["--default-backend=pytorchjob", "--trainjob",
                         "--trainjob-runtime=resumequal-leg",
                         "--trainjob-runtime-kind=ClusterTrainingRuntime"]
    [role] = [o for o in by_kind(objs, "Role") if o["metadata"]["name"] == "rq-resumequal"]
    assert _rules(role) == OPERATOR_RULES | TRAINJOB_RULES
    own = render(chart, {"trainjob": {"enabled": True, "runtime": {"install": False}}})
    assert by_kind(own, "ClusterTrainingRuntime") == []
    assert "--trainjob" in args_of(one(own, "Deployment"))
    with pytest.raises(helm.HelmRenderError, match=r"backend: trainjob needs trainjob\.enabled"):
        render(chart, {"backend": "trainjob"})
    with pytest.raises(helm.HelmRenderError, match=r"with watch\.allNamespaces use "
                       r"ClusterTrainingRuntime"):
        render(chart, {"trainjob": {"enabled": True, "runtime": {"kind": "TrainingRuntime"}},
                       "watch": {"allNamespaces": True}})


def test_the_security_allowlist_values_become_arguments_the_operator_reads(
    chart: helm.Chart,
) -> None:
    # Closed by default: no argument, and the operator's allowlist grants nothing.
    args = args_of(one(render(chart), "Deployment"))
    assert not [a for a in args if a.startswith(("--allow-priv", "--allow-run-as",
                                                 "--allow-unconfined", "--allow-capab",
                                                 "--allow-sysctl"))]
    assert _allowlist(chart, None).security == SecurityAllowlist()
    everything = {"allowlist": {"security": {
        "privileged": True, "runAsRoot": True, "allowPrivilegeEscalation": True,
        "unconfined": True, "capabilities": ["*"], "sysctls": ["kernel.shm_rmid_forced"]}}}
    args = args_of(one(render(chart, everything), "Deployment"))
    assert {"--allow-privileged", "--allow-run-as-root", "--allow-privilege-escalation",
            "--allow-unconfined", "--allow-capability=*",
            "--allow-sysctl=kernel.shm_rmid_forced"} <= set(args)
    assert _allowlist(chart, everything).security == SecurityAllowlist(
        privileged=True, run_as_root=True, allow_privilege_escalation=True, unconfined=True,
        capabilities=("*",), sysctls=("kernel.shm_rmid_forced",))


def test_network_policies_are_on_by_default_and_can_be_turned_off(chart: helm.Chart) -> None:
    rule = ("networking.k8s.io", "networkpolicies", "create")
    on = render(chart)
    assert "--no-network-policies" not in args_of(one(on, "Deployment"))
    [role] = [o for o in by_kind(on, "Role") if o["metadata"]["name"] == "rq-resumequal"]
    assert rule in _rules(role)
    off = render(chart, {"networkPolicy": {"enabled": False}})
    dep = one(off, "Deployment")
    assert "--no-network-policies" in args_of(dep)
    [role] = [o for o in by_kind(off, "Role") if o["metadata"]["name"] == "rq-resumequal"]
    assert _rules(role) == OPERATOR_RULES - {rule}
    command, *args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    run = operator_main.main.commands[command]
    with run.make_context(command, list(args)) as ctx:
        assert ctx.params["network_policies"] is False


@pytest.mark.timeout(60)
def test_make_chart_packages_a_chart_that_renders(tmp_path: Path) -> None:
    make = require("make")
    # -o: the venv counts as installed, so the target never reinstalls it under a test.
    # Under `make test` this make is a sub-make: without the parent's flags and with
    # --no-print-directory its stdout is the target's alone, as a user's would be.
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    done = subprocess.run([make, "--no-print-directory", "-o", ".venv/.installed", "chart",
                           f"CHART_DIR={tmp_path}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stdout + done.stderr
    (archive,) = tmp_path.glob("resumequal-*.tgz")
    assert done.stdout.strip() == str(archive)
    with helm.Chart.load(archive) as packaged:
        assert len(packaged.crds) == 1
        objs = render(packaged)
    assert {"Deployment", "ServiceMonitor", "PrometheusRule"} <= {o["kind"] for o in objs}
    for obj in objs:
        validate(obj)


def test_the_master_key_is_made_at_install_kept_and_read_by_the_operator(
    chart: helm.Chart, tmp_path: Path
) -> None:
    objs = render(chart)
    [secret] = by_kind(objs, "Secret")
    assert secret["metadata"]["name"] == "rq-resumequal-key"
    # An uninstall keeps it: runs it made keys for may be judged again after a reinstall.
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    key = base64.b64decode(secret["data"]["key"])
    # A key's one form (resumequal.run.signing.check_key): 64 hex characters, 32 random bytes.
    assert re.fullmatch(rb"[0-9a-f]{64}", key), key
    # Another render (no cluster to look the Secret up in) makes another key: random.
    [again] = by_kind(render(chart), "Secret")
    assert again["data"]["key"] != secret["data"]["key"]
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "master-key"]
    assert mount == {"name": "master-key", "mountPath": "/var/run/resumequal/master-key",
                     "readOnly": True}
    assert {"name": "master-key", "secret": {
        "secretName": "rq-resumequal-key", "defaultMode": 0o440,
        "items": [{"key": "key", "path": "key"}]}} in pod["volumes"]
    # What the kubelet would mount, read as the operator reads --key-file.
    path = tmp_path / "key"
    path.write_bytes(key)
    path.chmod(0o440)
    master = MasterKey.from_file(path)
    assert master.run_key("uid-1") != master.run_key("uid-2")


def test_notes_follow_the_example_only_where_its_namespace_is_served(chart: helm.Chart) -> None:
    # A default install serves its own namespace, not the example's "training".
    default = render_manifests(chart)["resumequal/templates/NOTES.txt"]
    assert (f"which this release does not serve: set its metadata.namespace to {NAMESPACE}"
            in " ".join(default.split()))
    assert f"kubectl -n {NAMESPACE} get qr -w" in default
    assert "kubectl get qr" not in default
    served = render_manifests(chart, {"watch": {"namespaces": ["training", "ml"]}})[
        "resumequal/templates/NOTES.txt"]
    assert "Start the example qualification (namespace training)" in served
    assert "kubectl -n training get qr -w" in served and "does not serve" not in served
