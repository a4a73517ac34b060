"""The operator against a real API server and SeaweedFS (a real S3 server).

``api`` is the session's kube-apiserver (:mod:`testing.cluster.testapi`: etcd and the API
server built from source, no controllers, the real CRDs; the operator talks to it through
a recording proxy, as the cluster's admin). Tests that drive pods (the ``pods`` fixture)
run on the session's pod cluster instead (:mod:`testing.cluster.podcluster`: the real
controllers, the real Kubeflow training operator, a node agent whose runs' containers are
played by the test's ``workers``), through the same kind of proxy.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from resumequal.results.verdict import Result
from resumequal_operator.kube import Kube
from testing.cluster.node.scriptnode import NodeRuntime
from testing.cluster.podcluster import PodCluster
from testing.cluster.testapi import APIServer, RealAPI
from testing.operator.harness import NAMESPACE, Admission, Operators, s3_store, store_s3
from testing.operator.workers import Workers

if TYPE_CHECKING:  # loaded as a plugin by tests/conftest.py; importing it here defeats
    # assert rewriting
    from tests.s3server import SeaweedFS


@pytest.fixture
def admission(api: RealAPI) -> Admission:
    """What was checked by the schemas of ``testing/k8s_schemas.py`` (Kubeflow's webhooks'
    rules among them): what the operator creates or replaces, as a validating webhook sees
    it, before the server's own validation."""
    check = Admission()
    api.add_validator(check)
    return check


@pytest.fixture
def api(request: pytest.FixtureRequest) -> Iterator[RealAPI]:
    """The session's real API server behind a proxy of this test's; the pod cluster's for
    tests that drive pods (``pods``), its scripts bound to this test's ``workers`` first
    (so they are let go only after the test's namespaces are swept)."""
    server: APIServer
    if "pods" in request.fixturenames:
        server = request.getfixturevalue("pods").api
    else:
        server = request.getfixturevalue("test_api_server")
    real = RealAPI(server, NAMESPACE)
    try:
        yield real
    finally:
        real.close()


@pytest.fixture
def store(s3_server: SeaweedFS, aws_env: dict[str, str]) -> dict[str, str]:
    """A fresh bucket on the shared S3 server: the ``store`` section of a run."""
    return s3_store(s3_server.endpoint, s3_server.new_bucket())


@pytest.fixture
def operators(api: RealAPI, aws_env: dict[str, str], s3_server: SeaweedFS
              ) -> Iterator[Operators]:
    """Operator replicas, allowed to use the S3 server's endpoint; stopped before the AWS
    environment they read is taken away."""
    ops = Operators(api, endpoints=(s3_server.endpoint,))
    try:
        yield ops
    finally:
        ops.stop_all()


@pytest.fixture
def verdict_result() -> Result:
    """The verdict the scripted comparator writes; a module overrides it to test a FAIL."""
    return Result.PASS


@pytest.fixture
def workers(store: dict[str, str], verdict_result: Result) -> Workers:
    """Scripted workers and comparator writing into the run's store."""
    return Workers(s3=store_s3(store), result=verdict_result)


@pytest.fixture
def pods(pod_cluster: PodCluster, workers: Workers) -> Iterator[PodCluster]:
    """The pod cluster, its runs' containers played by ``workers`` (in a node process of
    their own, started with the first pod: what the test set on ``workers`` before counts);
    a script that raised fails the test."""
    made: list[NodeRuntime] = []

    def node() -> NodeRuntime:
        made.append(NodeRuntime(workers))
        return made[-1]

    pod_cluster.scripts.bind(node)
    try:
        yield pod_cluster
    finally:
        pod_cluster.scripts.unbind()
    errors = [e for n in made for e in n.errors]
    if errors:
        raise RuntimeError("a scripted container failed") from errors[0]


@pytest.fixture
def kube(api: RealAPI) -> Iterator[Kube]:
    """The operator's API client for the test's API server, closed after the test."""
    k = Kube(api.api_client())
    try:
        yield k
    finally:
        k.close()
