"""The node agent: a Node of the cluster whose pods run as processes on this machine.

It stands in for the kubelet (which needs a container runtime this machine does not have)
and does what the kubelet does towards the API server (paths under kubernetes
``pkg/kubelet/``), with the kubelet's own credentials: a client certificate for
``system:node:<name>`` in ``system:nodes``, so the Node authorizer and the
NodeRestriction admission plugin bound it exactly as they bound a kubelet (its own Node
and Lease, the pods bound to it, the Secrets, ConfigMaps and tokens those pods name).

- Registration (``kubelet_node_status.go`` registerWithAPIServer, initialNode): the Node
  with its labels, capacity, allocatable, addresses, ``nodeInfo`` and conditions; the
  ``Ready`` condition's heartbeat every ``node_status_s`` (nodeStatusReportFrequency).
- The Lease in ``kube-node-lease`` renewed every 10 s, 40 s long (``nodelease``).
- Pods bound to the node, from a watch on ``spec.nodeName`` (``config/apiserver.go``
  NewSourceApiserver), each run by a worker of its own (:mod:`.pods`).
- Services from a watch of every namespace's, kept for containers' environment variables
  (``kubelet.go`` NewMainKubelet: a Service informer's lister, read by
  ``kubelet_pods.go`` makeEnvironmentVariables), never listed per container.
- Events as the kubelet writes them (source ``kubelet``, host the node).
"""

from __future__ import annotations

import datetime
import logging
import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client import ApiException

from ..network import Bridge
from . import sandbox as sandboxes
from .envvars import ConfigError, container_env, service_variables
from .images import Images, by_repository
from .pods import PodWorker, ProcessRuntime, Runtime, now_rfc3339
from .volumes import MountError, PodVolumes

log = logging.getLogger(__name__)

Obj = dict[str, Any]
LEASE_S, LEASE_RENEW_S = 40, 10.0
# Connections to the API server kept open. The kubelet sends every request over one HTTP/2
# connection (client-go's transport); over HTTP/1.1 each request in flight needs one, and
# with the client's default pool (5 per CPU) a burst of pods' status writes opened a new
# TLS connection for each request past it, a handshake on the API server's CPU every time.
API_CONNECTIONS = 64
# How long a container start waits for the first listing of Services before it fails
# CreateContainerConfigError and is tried again (kubelet_pods.go makeEnvironmentVariables
# fails at once while the informer has not synced: a start just after the agent's own
# would fail once, and be tried again, for nothing).
SERVICES_SYNC_WAIT_S = 10.0


class NodeAgent:
    """One Node of the cluster and the pods bound to it."""

    def __init__(self, api: client.ApiClient, *, name: str, bridge: Bridge, images: Images,
                 root: Path, api_host: str, api_port: int, dns_ip: str,
                 capacity: dict[str, str], netns_prefix: str,
                 node_status_s: float = 60.0, version: str = "v1.36.3",
                 runtimes: dict[str, Runtime] | None = None) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.name, self.bridge, self.images, self.root = name, bridge, images, root
        self.api_host, self.api_port, self.dns_ip = api_host, api_port, dns_ip
        self.node_ip = bridge.gateway
        self.capacity = capacity
        self.netns_prefix = netns_prefix
        self.node_status_s = node_status_s
        self.version = version
        self.addresses = sandboxes.Addresses(bridge)
        # Which runtime runs an image's containers (repository globs); processes otherwise.
        self.runtimes = dict(runtimes or {})
        self.processes = ProcessRuntime()
        self.stopping = threading.Event()
        self._workers: dict[str, PodWorker] = {}
        self._lock = threading.Lock()
        # Every namespace's Services by uid, from the watch (_watch_services).
        self._services: dict[str, Obj] = {}
        self._services_synced = threading.Event()

    # ------------------------------------------------------------------ the node

    def node_object(self) -> Obj:
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.name, "labels": {
                "kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": {"x86_64": "amd64", "aarch64": "arm64"}.get(
                    platform.machine(), platform.machine()),
                "beta.kubernetes.io/os": "linux"}},
            "spec": {"podCIDR": self.bridge.subnet, "podCIDRs": [self.bridge.subnet]},
        }

    def node_status(self) -> Obj:
        stamp = now_rfc3339()
        conditions = [
            {"type": t, "status": "False", "reason": r, "message": m,
             "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
            for t, r, m in (
                ("MemoryPressure", "KubeletHasSufficientMemory",
                 "kubelet has sufficient memory available"),
                ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                ("PIDPressure", "KubeletHasSufficientPID",
                 "kubelet has sufficient PID available"))]
        conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                           "message": "kubelet is posting ready status",
                           "lastHeartbeatTime": stamp, "lastTransitionTime": stamp})
        return {
            "capacity": self.capacity, "allocatable": self.capacity,
            "addresses": [{"type": "InternalIP", "address": self.node_ip},
                          {"type": "Hostname", "address": self.name}],
            "conditions": conditions,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "",
                         "kernelVersion": platform.release(), "osImage": "resumequal node agent",
                         "containerRuntimeVersion": "resumequal://0.1",
                         "kubeletVersion": self.version, "kubeProxyVersion": "",
                         "operatingSystem": "linux",
                         "architecture": self.node_object()["metadata"]["labels"][
                             "kubernetes.io/arch"]},
        }

    def register(self) -> None:
        """Create the Node (or take over the one of that name), then post its status."""
        try:
            self.core.create_node(self.node_object())
        except ApiException as e:
            if e.status != 409:
                raise
        self._post_node_status()

    def _post_node_status(self) -> None:
        current = self.core.read_node(self.name)
        before = {c.type: c for c in (current.status.conditions or [])}
        status = self.node_status()
        for cond in status["conditions"]:  # a transition time moves only with the status
            old = before.get(cond["type"])
            if old is not None and old.status == cond["status"] and old.last_transition_time:
                cond["lastTransitionTime"] = old.last_transition_time.strftime(
                    "%Y-%m-%dT%H:%M:%SZ")
        self.core.patch_node_status(self.name, {"status": status})

    def _renew_lease(self) -> None:
        micro = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": "kube-node-lease",
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Node",
                                                  "name": self.name,
                                                  "uid": self.core.read_node(
                                                      self.name).metadata.uid}]},
                "spec": {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_S,
                         "renewTime": micro}}
        try:
            self.coordination.patch_namespaced_lease(self.name, "kube-node-lease",
                                                     {"spec": body["spec"]})
        except ApiException as e:
            if e.status != 404:
                raise
            self.coordination.create_namespaced_lease("kube-node-lease", body)

    def _heartbeat(self) -> None:
        last_status = time.monotonic()
        while not self.stopping.wait(LEASE_RENEW_S):
            try:
                self._renew_lease()
                if time.monotonic() - last_status >= self.node_status_s:
                    self._post_node_status()
                    last_status = time.monotonic()
            except Exception:
                log.exception("node %s: heartbeat failed", self.name)

    # ------------------------------------------------------------------ pods

    def _watch_pods(self) -> None:
        selector = f"spec.nodeName={self.name}"
        while not self.stopping.is_set():
            try:
                listed = self.core.list_pod_for_all_namespaces(field_selector=selector)
                seen = set()
                for pod in listed.items:
                    obj = self.api.sanitize_for_serialization(pod)
                    seen.add(obj["metadata"]["uid"])
                    self._dispatch(obj, deleted=False)
                with self._lock:
                    gone = [w for uid, w in self._workers.items() if uid not in seen]
                for worker in gone:
                    worker.update(None)
                stream = watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces, field_selector=selector,
                    resource_version=listed.metadata.resource_version,
                    allow_watch_bookmarks=True, timeout_seconds=300, _preload_content=False)
                for event in stream:
                    if self.stopping.is_set():
                        return
                    if event["type"] == "BOOKMARK":
                        continue
                    obj = event["raw_object"]
                    self._dispatch(obj, deleted=event["type"] == "DELETED")
            except ApiException as e:
                if e.status != 410:  # an expired resourceVersion: list again
                    log.warning("node %s: pod watch: %s", self.name, e.reason)
                    time.sleep(1)
            except Exception:
                log.exception("node %s: pod watch failed", self.name)
                time.sleep(1)

    def _watch_services(self) -> None:
        """Every namespace's Services, listed once and then watched (a reflector's loop)."""
        while not self.stopping.is_set():
            try:
                listed = self.core.list_service_for_all_namespaces()
                services = {}
                for svc in listed.items:
                    obj = self.api.sanitize_for_serialization(svc)
                    services[obj["metadata"]["uid"]] = obj
                with self._lock:
                    self._services = services
                self._services_synced.set()
                stream = watch.Watch().stream(
                    self.core.list_service_for_all_namespaces,
                    resource_version=listed.metadata.resource_version,
                    allow_watch_bookmarks=True, timeout_seconds=300, _preload_content=False)
                for event in stream:
                    if self.stopping.is_set():
                        return
                    if event["type"] == "BOOKMARK":
                        continue
                    obj = event["raw_object"]
                    with self._lock:
                        if event["type"] == "DELETED":
                            self._services.pop(obj["metadata"]["uid"], None)
                        else:
                            self._services[obj["metadata"]["uid"]] = obj
            except ApiException as e:
                if e.status != 410:  # an expired resourceVersion: list again
                    log.warning("node %s: service watch: %s", self.name, e.reason)
                    time.sleep(1)
            except Exception:
                log.exception("node %s: service watch failed", self.name)
                time.sleep(1)

    def _dispatch(self, pod: Obj, *, deleted: bool) -> None:
        uid = pod["metadata"]["uid"]
        with self._lock:
            worker = self._workers.get(uid)
            if worker is None:
                if deleted:
                    return
                worker = self._workers[uid] = PodWorker(self, pod).start()
                return
        worker.update(None if deleted else pod)

    def forget(self, uid: str) -> None:
        with self._lock:
            self._workers.pop(uid, None)

    # ------------------------------------------------------------------ for the workers

    def runtime_for(self, reference: str) -> Runtime:
        """The runtime of containers of image ``reference``."""
        return by_repository(self.runtimes, reference) or self.processes

    def make_sandbox(self, pod: Obj) -> sandboxes.Sandbox:
        return sandboxes.create(self.bridge, self.addresses, self.root / "pods", pod,
                                self.netns_prefix)

    def lookup(self, kind: str, namespace: str, name: str) -> Obj | None:
        """A Secret or ConfigMap a pod of this node names; None when it does not exist.
        Refused (the Node authorizer's graph not yet holding the pod) is a mount error the
        worker retries, as the kubelet's volume manager retries."""
        try:
            read = (self.core.read_namespaced_secret if kind == "Secret"
                    else self.core.read_namespaced_config_map)
            obj: Obj = self.api.sanitize_for_serialization(read(name, namespace))
            return obj
        except ApiException as e:
            if e.status == 404:
                return None
            raise MountError(f"{kind.lower()} {namespace}/{name}: HTTP {e.status} "
                             f"{e.reason}") from e

    def request_token(self, namespace: str, account: str, audiences: list[str],
                      expiry_s: int, pod: Obj) -> tuple[str, float]:
        body = {"spec": {"audiences": audiences or None, "expirationSeconds": expiry_s,
                         "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                            "name": pod["metadata"]["name"],
                                            "uid": pod["metadata"]["uid"]}}}
        answer = self.core.create_namespaced_service_account_token(account, namespace, body)
        return answer.status.token, answer.status.expiration_timestamp.timestamp()

    def pod_volumes(self, pod: Obj, root: Path) -> PodVolumes:
        return PodVolumes(pod, root, self.lookup, self.request_token, self.capacity)

    def container_env(self, pod: Obj, container: Obj) -> dict[str, str]:
        if not self._services_synced.wait(SERVICES_SYNC_WAIT_S):
            raise ConfigError("services have not yet been read at least once, cannot "
                              "construct envvars")
        with self._lock:
            services = list(self._services.values())
        variables = service_variables(services, self.api_host, self.api_port,
                                      pod["metadata"]["namespace"])
        return container_env(pod, container, services=variables, lookup=self.lookup,
                             node_allocatable=self.capacity)

    def event(self, pod: Obj, kind: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        stamp = now_rfc3339()
        body = {"metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {"kind": "Pod", "apiVersion": "v1", "name": meta["name"],
                                   "namespace": meta["namespace"], "uid": meta["uid"]},
                "reason": reason, "message": message, "type": kind,
                "source": {"component": "kubelet", "host": self.name},
                "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1}
        try:
            self.core.create_namespaced_event(meta["namespace"], body)
        except ApiException as e:
            log.debug("event %s for %s: %s", reason, meta["name"], e.reason)

    # ------------------------------------------------------------------ running

    def run(self) -> None:
        """Register, then serve pods until :meth:`stop`."""
        self.register()
        self._renew_lease()
        threads = [threading.Thread(target=self._heartbeat, daemon=True, name="heartbeat"),
                   threading.Thread(target=self._watch_services, daemon=True,
                                    name="services"),
                   threading.Thread(target=self._watch_pods, daemon=True, name="pods")]
        for t in threads:
            t.start()
        log.info("node %s ready (%s, pods on %s)", self.name, self.node_ip, self.bridge.subnet)
        self.stopping.wait()
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.wake.set()
        for worker in workers:
            worker.done.wait(timeout=15)

    def stop(self) -> None:
        self.stopping.set()


def machine_capacity(pods: int = 110) -> dict[str, str]:
    """What the node offers the scheduler: this machine's cores and memory, and 110 pods
    (the kubelet's default maxPods)."""
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {"cpu": str(os.cpu_count() or 1), "memory": f"{pages // 1024}Ki",
            "pods": str(pods), "ephemeral-storage": "100Gi"}
