"""Pytest fixtures for the local cluster, loaded as a plugin by ``tests/conftest.py``.

``local_cluster``: the running cluster (``make cluster-up``) if there is one, else one
started for the session and stopped at its end (nothing of it left running).
``cluster_admin``: an official client for it as the cluster's admin.
``test_api_server``: etcd and kube-apiserver alone (no controllers, no root needed) for the
session, the CRDs the operator meets installed (:mod:`testing.cluster.testapi`).
``pod_cluster``: a cluster of its own for the session's operator tests that drive pods
(:mod:`testing.cluster.podcluster`), apart from ``local_cluster``'s; stopped at its end.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import kubernetes.client

    from .cluster import Cluster
    from .podcluster import PodCluster
    from .testapi import TestAPIServer


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[Cluster]:
    """A whole local cluster: control plane, node agent, Kubeflow, SeaweedFS, the chart."""
    import os

    from . import cluster

    if os.geteuid() != 0:
        pytest.skip("the local cluster needs root: its pods run in network namespaces of "
                    "their own (make cluster-up explains)")
    running = cluster.current()
    if running is not None and running.healthy():
        yield running
        return
    started = cluster.up()
    try:
        yield started
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def cluster_admin(local_cluster: Cluster) -> Iterator[kubernetes.client.ApiClient]:
    """The official client, as the cluster's admin."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(local_cluster.kubeconfig),
                            client_configuration=configuration)
    with client.ApiClient(configuration) as api:
        yield api


@pytest.fixture(scope="session")
def test_api_server() -> Iterator[TestAPIServer]:
    """A real API server for the session's API tests; stopped at its end."""
    from .testapi import TestAPIServer

    server = TestAPIServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def pod_cluster() -> Iterator[PodCluster]:
    """The pod cluster, its tests' namespace ``quals``; stopped at the session's end."""
    import os

    from .podcluster import PodCluster

    if os.geteuid() != 0:
        pytest.skip("the pod cluster needs root: its pods run in network namespaces of "
                    "their own (make cluster-up explains)")
    started = PodCluster("quals")
    try:
        yield started
    finally:
        started.close()
