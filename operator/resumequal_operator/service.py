"""``resumequal-operator run``: connect to the cluster, run the operator until SIGTERM."""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from kubernetes import client as k8s  # type: ignore[import-untyped]
from kubernetes import config as k8s_config

from resumequal.errors import ClusterError
from resumequal_operator.allowlist import Allowlist
from resumequal_operator.crdsync import Policy, ensure_crd
from resumequal_operator.kube import Kube
from resumequal_operator.legjobs import TrainerSettings
from resumequal_operator.manager import Operator, Settings, default_identity
from resumequal_operator.resource import Backend
from resumequal_operator.runkeys import MasterKey
from resumequal_operator.runtime.leader import LeaseSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceOptions:
    """The command line's options (see ``resumequal-operator run --help``)."""

    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False
    port: int = 8080
    leader_elect: bool = True
    lease_name: str = "resumequal-operator"
    lease_namespace: str | None = None
    resync_seconds: float = 60.0
    workers: int = 2
    poll_seconds: float = 2.0
    crd_policy: Policy = "apply"
    allowlist: Allowlist = field(default_factory=Allowlist)
    network_policies: bool = True
    default_backend: Backend = "pytorchjob"
    trainer: TrainerSettings | None = None
    master_key: MasterKey | None = None  # None: one for this process's lifetime


def settings_from(opts: ServiceOptions, env: dict[str, str] | None = None) -> Settings:
    """Settings from options and POD_NAME / POD_NAMESPACE (the downward API)."""
    env = dict(os.environ) if env is None else env
    home = env.get("POD_NAMESPACE") or "default"
    if opts.all_namespaces and opts.namespaces:
        raise ValueError("--namespace and --all-namespaces exclude each other")
    namespaces = () if opts.all_namespaces else (opts.namespaces or (home,))
    return Settings(
        namespaces=namespaces, port=opts.port, leader_elect=opts.leader_elect,
        lease=LeaseSettings(name=opts.lease_name, namespace=opts.lease_namespace or home),
        identity=env.get("POD_NAME") or default_identity(),
        resync_seconds=opts.resync_seconds, workers=opts.workers,
        poll_seconds=opts.poll_seconds, allowlist=opts.allowlist,
        network_policies=opts.network_policies,
        default_backend=opts.default_backend, trainer=opts.trainer,
        master_key=opts.master_key,
    )


def cluster_configuration() -> Any:
    """In a pod: the service account; elsewhere: KUBECONFIG / ~/.kube/config."""
    configuration = k8s.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except k8s_config.ConfigException:
        try:
            k8s_config.load_kube_config(client_configuration=configuration)
        except (k8s_config.ConfigException, OSError) as e:
            raise ClusterError(f"no cluster to talk to: not in a pod, and no usable "
                               f"kubeconfig ({type(e).__name__})") from e
    return configuration


def freeze_startup() -> None:
    """Put what start-up made out of the cyclic collector's reach.

    The modules the operator loaded (the official client's models among them) are a few
    hundred thousand objects that live as long as the process. Each full pass of the
    collector walked all of them: a 35-45 ms stall of every worker at once, twice in 15 s
    of bench/operator_reconcile.py. Frozen, they are never walked again (nor collected:
    they are not garbage); what the operator makes from here on (its caches, every
    request's objects) is collected as before. Garbage already made is collected first.
    """
    gc.collect()
    gc.freeze()


def serve(opts: ServiceOptions) -> None:
    """Run until SIGTERM or SIGINT, then stop gracefully (the Lease is released)."""
    settings = settings_from(opts)
    kube = Kube.from_configuration(cluster_configuration())
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        log.info("CRD: %s", ensure_crd(kube, opts.crd_policy))
        operator = Operator(kube, settings)
        freeze_startup()
        operator.run_until(stop)
    finally:
        kube.close()
