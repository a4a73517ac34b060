"""A local cluster for the operator's tests that drive pods, apart from ``make cluster-up``'s.

The real control plane (kube-apiserver, etcd, the controller manager's Job controller and
garbage collector, the scheduler) and the real Kubeflow training operator, the chart
installed for its CRD and RBAC only (no operator Deployment: the tests run the operator
themselves), and a node agent in this process whose containers of the runs' image are
scripted (:class:`~.node.scripted.Scripts`, bound by each test to its own scripts); every
other pod (the training operator's) runs as a process, as on ``make cluster-up``'s node.

Its files live under a folder of its own (``build/podcluster-*``, not ``build/cluster``), so
``cluster.current()`` never finds it and a session started beside it (the slow tier's
``local_cluster``) starts one of its own; ``close`` stops every process, network
namespace and link it made. A session that died without closing its cluster (SIGKILL)
leaves its folder, naming the process that made it: the next one stops that cluster first.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from kubernetes import client, config

from . import cluster as local
from .node.agent import API_CONNECTIONS, NodeAgent, machine_capacity
from .node.images import cluster_images
from .node.scripted import ScriptedRuntime, Scripts
from .testapi import APIError, APIServer

log = logging.getLogger(__name__)

OWNER = "owner"  # in the folder: the pid and start time of the process that made it

# The image the operator tests' runs name (tests/operator/harness.py's manifests): its
# containers are the scripts bound, the worker image's configuration held under its name.
RUN_IMAGE = "ghcr.io/acme/train"
# As Pod Security enforces it on the namespaces the chart serves (docs/cluster.md).
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


class PodCluster:
    """The cluster, its node agent and the scripts of its runs' containers; ``api`` for
    :class:`~.testapi.RealAPI` (every namespace but those there at the start is a test's)."""

    def __init__(self, namespace: str) -> None:
        # Beside build/cluster, not under the session's temporary folder: the pods' users
        # (the training operator's 65532) must reach their folders, and pytest's are 0700.
        local.REPO.joinpath("build").mkdir(exist_ok=True)
        reap_orphans(local.REPO / "build")
        self.root = Path(tempfile.mkdtemp(prefix="podcluster-", dir=local.REPO / "build"))
        self.root.chmod(0o755)
        (self.root / OWNER).write_text(_process_id(os.getpid()) or "")
        self.scripts = Scripts()
        self.agent: NodeAgent | None = None
        self._agent_thread: threading.Thread | None = None
        try:
            self.cluster = local.up(node=False, root=self.root)
            self._start_agent()
            local.install_kubeflow(self.cluster, ("training-operator",))
            self.cluster.kubectl("create", "namespace", namespace)
            self.cluster.kubectl("label", "namespace", namespace,
                                 *(f"{k}={v}" for k, v in RESTRICTED.items()))
            local.install_chart(self.cluster, {"replicas": 0,
                                               "watch": {"namespaces": [namespace]}})
            there = set(self.cluster.kubectl(
                "get", "namespaces", "-o", "jsonpath={.items[*].metadata.name}").split())
            self.api = APIServer(self.cluster.controlplane,
                                 ("qualificationruns.resumequal.dev", "pytorchjobs.kubeflow.org"),
                                 kept=frozenset(there - {namespace}),
                                 namespace_labels=RESTRICTED)
            self._wait_served(namespace)
        except BaseException:
            self.close()
            raise

    def _wait_served(self, namespace: str) -> None:
        """Until the CRDs' objects can be listed: a CRD the chart has just written answers
        429 (its storage (re)initializing) for a while."""
        deadline = time.monotonic() + local.READY_TIMEOUT_S
        for kind in ("qualificationruns", "pytorchjobs"):
            while True:
                try:
                    self.api.rest.call("GET", self.api.resources[kind].path(namespace))
                    break
                except APIError as e:
                    if e.code != 429 or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

    def _start_agent(self) -> None:
        cluster = self.cluster
        cp = cluster.controlplane
        node_config = client.Configuration()
        config.load_kube_config(config_file=str(local.node_kubeconfig(cp)),
                                client_configuration=node_config)
        node_config.connection_pool_maxsize = API_CONNECTIONS
        self.agent = NodeAgent(
            client.ApiClient(node_config), name=local.NODE, bridge=cluster.bridge,
            images=cluster_images(cluster.binaries, {RUN_IMAGE: local.WORKER_IMAGE}),
            root=cp.root / "node", api_host=cluster.bridge.gateway,
            api_port=cp.ports.apiserver, dns_ip=cluster.bridge.gateway,
            netns_prefix=f"rq{cluster.id[:6]}-",
            # Room for every test's pods, whatever they request (they are scripts).
            capacity={**machine_capacity(), "cpu": "1000", "memory": "4000Gi",
                      "pods": "5000"},
            runtimes={RUN_IMAGE: ScriptedRuntime(self.scripts)})
        self._agent_thread = threading.Thread(target=self.agent.run, daemon=True,
                                              name="node-agent")
        self._agent_thread.start()

    def close(self) -> None:
        """Stop the node agent, the scripts and the cluster; remove its folder."""
        try:
            if self.agent is not None:
                self.agent.stop()
            if self._agent_thread is not None:
                self._agent_thread.join(30)  # its pods' workers torn down
            self.scripts.close()
        finally:
            local.down(root=self.root)
            shutil.rmtree(self.root, ignore_errors=True)


def _process_id(pid: int) -> str | None:
    """``pid`` with its start time (a pid alone may be reused); None if it is not running."""
    try:
        # Field 22 of /proc/<pid>/stat, counted after the command's closing parenthesis.
        start = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
    return f"{pid} {start}"


def reap_orphans(build: Path) -> list[Path]:
    """Stop the pod clusters under ``build`` whose session is gone (killed before it could
    close them) and remove their folders; those reaped. A live session's is left alone."""
    reaped = []
    for folder in sorted(build.glob("podcluster-*")):
        try:
            owner = (folder / OWNER).read_text().strip()
        except OSError:
            continue  # being made, or not ours
        pid = owner.split()[0] if owner else ""
        if pid.isdigit() and _process_id(int(pid)) == owner:
            continue
        log.warning("stopping the pod cluster of a session that is gone: %s", folder)
        local.down(root=folder)
        shutil.rmtree(folder, ignore_errors=True)
        reaped.append(folder)
    return reaped
