"""The whole local cluster: up, down, and what a running one is.

``up`` builds (or reuses) every program, then starts, in order: the pod network's bridge;
etcd, kube-apiserver, kube-controller-manager and kube-scheduler on the bridge's address;
CoreDNS (the cluster's DNS, as kubeadm deploys it, serving pods on the node's address);
the node agent; SeaweedFS's S3 gateway, published in the cluster as Service
``minio.storage`` on port 9000 (the address the README's example names); the Kubeflow
training operator, Trainer and JobSet from their upstream manifests, as Deployments whose
pods the node agent runs; and the resumequal chart with the real ``helm install``. The
admin kubeconfig is written to ``build/cluster/kubeconfig``; ``state.json`` beside it says
what runs where. ``down`` stops every process the cluster started (they carry its tag),
removes its network namespaces and bridge and its folder. A caller that needs a cluster
apart from that one (a test session beside ``make cluster-up``'s) names a root folder of
its own: ``up``, ``current`` and ``down`` then keep its state, kubeconfig and files there.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testing.ports import free_port

from . import build, controlplane, daemons, network, seaweed
from .controlplane import ControlPlane
from .pki import Authority
from .seaweed import S3Server

log = logging.getLogger(__name__)

REPO = build.REPO
ROOT = REPO / "build" / "cluster"
RUN = ROOT / "run"
STATE = ROOT / "state.json"
KUBECONFIG = ROOT / "kubeconfig"
NODE = "resumequal-node-0"
OPERATOR_NAMESPACE = "resumequal-system"
RELEASE = "resumequal"
# Namespaces the chart's operator serves: the README example's and the cluster tests'.
WATCHED = ("training", "resumequal-e2e")
S3_SERVICE = ("minio", "storage", 9000)  # name, namespace, port (the README's endpoint)
S3_SECRET = "resumequal-s3"
BUCKET = "resumequal-runs"
WORKER_IMAGE = "localhost/resumequal-worker:dev"
# The training images the examples name, held by the node as the worker image built from
# this checkout (as a cluster's node holds an image loaded under a user's name for it).
EXAMPLE_IMAGES = ("ghcr.io/acme/train",)
OPERATOR_IMAGE = "localhost/resumequal-operator:dev"
READY_TIMEOUT_S = 300.0
Obj = dict[str, Any]


@dataclass
class Cluster:
    """A running local cluster, as ``state.json`` records it."""

    id: str
    controlplane: ControlPlane
    bridge: network.Bridge
    s3: S3Server
    binaries: dict[str, Path]
    root: Path = ROOT

    @property
    def kubeconfig(self) -> Path:
        return self.root / KUBECONFIG.name

    @property
    def s3_in_cluster(self) -> str:
        name, namespace, port = S3_SERVICE
        return f"http://{name}.{namespace}.svc:{port}"

    def to_json(self) -> Obj:
        return {"id": self.id, "controlplane": self.controlplane.to_json(),
                "bridge": {"name": self.bridge.name, "subnet": self.bridge.subnet},
                "s3": self.s3.to_json(),
                "binaries": {k: str(v) for k, v in self.binaries.items()},
                "root": str(self.root)}

    @classmethod
    def from_json(cls, data: Obj) -> Cluster:
        return cls(data["id"], ControlPlane.from_json(data["controlplane"]),
                   network.Bridge(**data["bridge"]), S3Server.from_json(data["s3"]),
                   {k: Path(v) for k, v in data["binaries"].items()},
                   Path(data.get("root", ROOT)))

    def kubectl(self, *args: str, input: str | None = None,
                kubeconfig: Path | None = None) -> str:
        return controlplane.kubectl(self.controlplane, self.binaries["kubectl"], *args,
                                    input=input, kubeconfig_path=kubeconfig)

    def healthy(self) -> bool:
        """Whether the API server answers (the rest is watched by those who use it)."""
        return daemons.http_ok(f"{self.controlplane.server}/readyz",
                               context=self.controlplane.ssl_context())


def current(root: Path = ROOT) -> Cluster | None:
    """The cluster ``state.json`` under ``root`` describes, if one is recorded."""
    try:
        return Cluster.from_json(json.loads((root / STATE.name).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ---------------------------------------------------------------------- pieces of up


def node_kubeconfig(cp: ControlPlane) -> Path:
    """The node agent's credentials: system:node:<name> in system:nodes, as a kubelet's."""
    ca = Authority.load(cp.pki, "ca")
    pair = ca.issue(f"node-{NODE}", f"system:node:{NODE}", org="system:nodes", client=True)
    path = cp.root / "node.kubeconfig"
    path.write_text(controlplane.kubeconfig(cp.server, cp.pki / "ca.crt", f"system:node:{NODE}",
                                            client=pair))
    return path


def _token(cluster: Cluster, namespace: str, account: str, hours: int = 48) -> str:
    out = cluster.kubectl("create", "token", account, "-n", namespace,
                          f"--duration={hours}h")
    return out.strip()


COREDNS_RBAC = """\
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
"""


def corefile(bind: str, kubeconfig: Path, ready_port: int, health_port: int) -> str:
    """kubeadm's Corefile for the cluster zone, bound to the node's address, reading the API
    with CoreDNS's own ServiceAccount (kubeadm's ``system:coredns`` ClusterRole)."""
    return f"""\
cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {bind}
    errors
    health {bind}:{health_port}
    ready {bind}:{ready_port}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
       kubeconfig {kubeconfig} default
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 5
    }}
    cache 5
    loadbalance
}}
"""


def _start_coredns(cluster: Cluster) -> None:
    cp = cluster.controlplane
    cluster.kubectl("apply", "-f", "-", input=COREDNS_RBAC)
    token = _token(cluster, "kube-system", "coredns")
    kubeconfig = cp.root / "coredns.kubeconfig"
    kubeconfig.write_text(controlplane.kubeconfig(cp.server, cp.pki / "ca.crt", "default",
                                                  token=token))
    ready, health = free_port(), free_port()
    config = cp.root / "Corefile"
    config.write_text(corefile(cluster.bridge.gateway, kubeconfig, ready, health))
    proc = daemons.start("coredns", [str(cluster.binaries["coredns"]), "-conf", str(config)],
                         cluster=cluster.id, logs=cp.logs)
    daemons.wait_until("CoreDNS", lambda: daemons.http_ok(
        f"http://{cluster.bridge.gateway}:{ready}/ready"), READY_TIMEOUT_S, proc=proc,
        logs=cp.logs, name="coredns")


def start_node(cluster: Cluster) -> None:
    """The node agent, as a process of the cluster's; returns once its Node is Ready."""
    cp = cluster.controlplane
    kubeconfig = node_kubeconfig(cp)
    proc = daemons.start("node-agent", [
        sys.executable, "-m", "testing.cluster.node", f"--kubeconfig={kubeconfig}",
        f"--name={NODE}", f"--bridge={cluster.bridge.name}", f"--subnet={cluster.bridge.subnet}",
        f"--root={cp.root / 'node'}", f"--api-host={cluster.bridge.gateway}",
        f"--api-port={cp.ports.apiserver}", f"--dns-ip={cluster.bridge.gateway}",
        f"--netns-prefix=rq{cluster.id[:6]}-",
        *(f"--image-alias={repo}={WORKER_IMAGE}" for repo in EXAMPLE_IMAGES),
    ], cluster=cluster.id, logs=cp.logs, cwd=REPO,
        env={"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])})

    def ready() -> bool:
        try:
            out = cluster.kubectl("get", "node", NODE, "-o",
                                  "jsonpath={.status.conditions[?(@.type=='Ready')].status}")
        except daemons.ClusterError:
            return False
        return out.strip() == "True"

    daemons.wait_until("the node agent", ready, READY_TIMEOUT_S, proc=proc, logs=cp.logs,
                       name="node-agent")


def load_image(cluster: Cluster, reference: str, layer: Path, base: str = WORKER_IMAGE) -> None:
    """Load image ``reference`` into the node, as ``kind load`` does: ``base`` with the
    Python packages of folder ``layer`` first on its PYTHONPATH (node/images.py's load)."""
    from .node.images import load

    load(cluster.controlplane.root / "node" / "images", reference, base, layer)


def _publish_s3(cluster: Cluster, port: int) -> None:
    """The S3 gateway as a Service of the cluster: a selector-less Service whose
    EndpointSlice names the node's address, as one publishes a server outside the pods."""
    name, namespace, service_port = S3_SERVICE
    manifest = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
         "spec": {"clusterIP": "None", "ports": [{"name": "s3", "port": service_port}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": f"{name}-node", "namespace": namespace,
                      "labels": {"kubernetes.io/service-name": name,
                                 "endpointslice.kubernetes.io/managed-by": "resumequal.dev"}},
         "addressType": "IPv4",
         "endpoints": [{"addresses": [cluster.bridge.gateway],
                        "conditions": {"ready": True}}],
         "ports": [{"name": "s3", "port": port, "protocol": "TCP"}]},
    ]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(manifest))


def _kustomize(cluster: Cluster, folder: Path | None = None, *, resources: tuple[Path, ...] = (),
               **kustomization: Any) -> str:
    """``kubectl kustomize`` of an upstream folder, or of a kustomization of ours over
    upstream resources (kustomize takes them relative to the kustomization)."""
    if folder is not None:
        return cluster.kubectl("kustomize", str(folder))
    with tempfile.TemporaryDirectory() as tmp:
        kustomization["resources"] = [os.path.relpath(r, tmp) for r in resources]
        (Path(tmp) / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        return cluster.kubectl("kustomize", "--load-restrictor=LoadRestrictionsNone", tmp)


def _kubeflow_manifests(cluster: Cluster, part: str) -> str:
    """One Kubeflow part's release manifests, rendered from its module."""
    if part == "training-operator":
        training = build.module_dir("github.com/kubeflow/training-operator")
        return _kustomize(cluster, training / "manifests/overlays/standalone")
    if part == "jobset":
        return _kustomize(cluster, build.module_dir("sigs.k8s.io/jobset") / "config/default")
    trainer = build.module_dir("github.com/kubeflow/trainer/v2")
    # The trainer's own overlay, less its third-party JobSet (fetched from GitHub there;
    # installed from its module instead).
    return _kustomize(
        cluster, namespace="kubeflow-system",
        resources=(trainer / "manifests/overlays/manager/namespace.yaml",
                   *(trainer / f"manifests/base/{p}"
                     for p in ("crds", "manager", "rbac", "webhook"))),
        secretGenerator=[{"name": "kubeflow-trainer-webhook-cert",
                          "namespace": "kubeflow-system",
                          "options": {"disableNameSuffixHash": True}}],
        configMapGenerator=[{"name": "kubeflow-trainer-public",
                             "literals": ["kubeflow_trainer_version=v2.3.0"],
                             "options": {"disableNameSuffixHash": True}}])


KUBEFLOW = {"training-operator": ("kubeflow", "training-operator"),
            "jobset": ("jobset-system", "jobset-controller-manager"),
            "trainer": ("kubeflow-system", "kubeflow-trainer-controller-manager")}


def install_kubeflow(cluster: Cluster, parts: tuple[str, ...] = tuple(KUBEFLOW)) -> None:
    """The training operator v1, JobSet and Trainer v2 from their releases' manifests, each
    waited for until its Deployment is available."""
    for part in parts:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                        input=_kubeflow_manifests(cluster, part))
    for part in parts:
        namespace, deployment = KUBEFLOW[part]
        cluster.kubectl("rollout", "status", f"deployment/{deployment}", "-n", namespace,
                        f"--timeout={int(READY_TIMEOUT_S)}s")


def _namespaces(cluster: Cluster) -> None:
    """The watched namespaces, enforcing Pod Security ``restricted``, each with the S3
    credentials Secret the README's example names and its pods' ServiceAccount."""
    objects: list[Obj] = []
    for ns in WATCHED:
        objects += [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest"}}},
            {"apiVersion": "v1", "kind": "Secret",
             "metadata": {"name": S3_SECRET, "namespace": ns},
             "type": "Opaque",
             "data": {"AWS_ACCESS_KEY_ID": base64.b64encode(
                 cluster.s3.access_key.encode()).decode(),
                      "AWS_SECRET_ACCESS_KEY": base64.b64encode(
                          cluster.s3.secret_key.encode()).decode()}},
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": "resumequal-worker", "namespace": ns}},
        ]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))


def helm_values(cluster: Cluster) -> Obj:
    """The chart's values for this cluster: our images, the watched namespaces, the S3
    endpoint allowed and the operator's credentials for it (from the Secret of its own
    namespace), TrainJob legs on."""
    repository, tag = OPERATOR_IMAGE.rsplit(":", 1)
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "watch": {"namespaces": list(WATCHED)},
        "allowlist": {"endpoints": [cluster.s3_in_cluster]},
        "trainjob": {"enabled": True},
        "operator": {"extraEnv": [
            {"name": "AWS_ENDPOINT_URL_S3", "value": cluster.s3_in_cluster},
            {"name": "AWS_REGION", "value": cluster.s3.region},
            *({"name": k, "valueFrom": {"secretKeyRef": {"name": S3_SECRET, "key": k}}}
              for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")),
        ]},
    }


def install_chart(cluster: Cluster, values: Obj | None = None) -> None:
    """``helm install`` of the chart with :func:`helm_values` (or ``values``), waited for."""
    _namespaces_for_operator(cluster)
    path = cluster.controlplane.root / "values.yaml"
    path.write_text(yaml.safe_dump(values if values is not None else helm_values(cluster)))
    result = subprocess.run([
        str(cluster.binaries["helm"]), "install", RELEASE, str(REPO / "charts" / "resumequal"),
        "--namespace", OPERATOR_NAMESPACE, "--create-namespace", "--values", str(path),
        "--kubeconfig", str(cluster.controlplane.admin_kubeconfig), "--wait",
        f"--timeout={int(READY_TIMEOUT_S)}s"], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise daemons.ClusterError(f"helm install exited {result.returncode}: "
                                   f"{result.stderr.strip()[-3000:]}\n"
                                   f"{daemons.log_tail(cluster.controlplane.logs, 'node-agent')}")


def _namespaces_for_operator(cluster: Cluster) -> None:
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": S3_SECRET, "namespace": OPERATOR_NAMESPACE}, "type": "Opaque",
              "stringData": {"AWS_ACCESS_KEY_ID": cluster.s3.access_key,
                             "AWS_SECRET_ACCESS_KEY": cluster.s3.secret_key}}
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": OPERATOR_NAMESPACE, "labels": {
                     "pod-security.kubernetes.io/enforce": "restricted"}}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([namespace, secret]))


# ---------------------------------------------------------------------- up and down


def up(*, chart: bool = True, node: bool = True, kubeflow: tuple[str, ...] = tuple(KUBEFLOW),
       keep_failed: bool = False, root: Path = ROOT) -> Cluster:
    """Build what is missing and start the whole cluster (its files under ``root``); the
    running one if it is up. Without ``node`` (a caller runs its own node agent), nothing
    that needs pods is installed. A start that fails stops what it started, unless
    ``keep_failed``."""
    running = current(root)
    if running is not None and running.healthy():
        return running
    if running is not None:
        down(root=root)
    binaries = build.build_all()
    cluster_id = secrets.token_hex(5)
    run = root / RUN.name
    run.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    bridge = network.create_bridge(cluster_id)
    try:
        cp = controlplane.start(run, binaries, cluster=cluster_id, host=bridge.gateway,
                                audited=(OPERATOR_NAMESPACE,))
        # On the Service's port: a headless Service sends clients to the endpoint's port.
        s3 = seaweed.start(binaries["weed"], run / "seaweedfs", cluster=cluster_id,
                           host=bridge.gateway, port=S3_SERVICE[2])
        cluster = Cluster(cluster_id, cp, bridge, s3, binaries, root)
        (root / STATE.name).write_text(json.dumps(cluster.to_json(), indent=1))
        shutil.copyfile(cp.admin_kubeconfig, cluster.kubeconfig)
        _start_coredns(cluster)
        s3.client().create_bucket(Bucket=BUCKET)  # type: ignore[attr-defined]
        _publish_s3(cluster, int(s3.endpoint.rsplit(":", 1)[1]))
        _namespaces(cluster)
        if node:
            start_node(cluster)
            install_kubeflow(cluster, kubeflow)
            if chart:
                install_chart(cluster)
    except BaseException:
        if not keep_failed:
            down(cluster_id=cluster_id, bridge=bridge.name, root=root)
        raise
    log.info("cluster %s up in %.0f s: kubectl --kubeconfig %s", cluster_id,
             time.monotonic() - started, cluster.kubeconfig)
    return cluster


def down(*, cluster_id: str | None = None, bridge: str | None = None,
         root: Path = ROOT) -> None:
    """Stop every process of the cluster under ``root``, remove its namespaces, bridge and
    folder."""
    running = current(root)
    cluster_id = cluster_id or (running.id if running else None)
    bridge = bridge or (running.bridge.name if running else None)
    if cluster_id:
        daemons.stop_all(cluster_id)
        for netns in network.pod_namespaces(f"rq{cluster_id[:6]}-"):
            network.remove_pod(netns)
    if bridge:
        network.delete_bridge(bridge)
    (root / STATE.name).unlink(missing_ok=True)
    (root / KUBECONFIG.name).unlink(missing_ok=True)
    shutil.rmtree(root / RUN.name, ignore_errors=True)
