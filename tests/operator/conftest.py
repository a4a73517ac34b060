"""The operator against a real API server and SeaweedFS (a real S3 server).

``api`` is the session's kube-apiserver (:mod:`testing.cluster.testapi`: etcd and the API
server built from source, no controllers, the real CRDs; the operator talks to it through
a recording proxy, as the cluster's admin). Tests that drive pods (the ``training``
fixture: the simulated Kubeflow training operator, Job controller and kubelet) or that
are marked ``double`` run on the API double instead (:mod:`testing.kubeapi`), where every
object written passes admission by the schemas in ``tests/k8s_schemas.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from resumequal.store.s3settings import S3Spec
from resumequal.verdict import Result
from resumequal_operator.kube import Kube
from testing.cluster.testapi import RealAPI, TestAPIServer
from testing.kubeapi import KubeAPI
from testing.kubeapi.training import SimulatedTrainingOperator
from tests.operator.harness import NAMESPACE, Admission, Operators
from tests.operator.workers import Workers

if TYPE_CHECKING:  # loaded as a plugin by tests/conftest.py; importing it here defeats
    # assert rewriting
    from tests.s3server import SeaweedFS


@pytest.fixture
def _double(kubeapi: KubeAPI) -> tuple[KubeAPI, Admission]:
    """The double, every object written to it checked by the real schemas."""
    check = Admission()
    kubeapi.add_validator(check)
    return kubeapi, check


@pytest.fixture
def admission(request: pytest.FixtureRequest, api: KubeAPI | RealAPI) -> Admission:
    """What was checked by the schemas of ``tests/k8s_schemas.py`` (Kubeflow's webhooks'
    rules among them): on the real API server, what the operator creates or replaces, as
    a validating webhook sees it, before the server's own validation."""
    if on_double(request):
        return request.getfixturevalue("_double")[1]  # type: ignore[no-any-return]
    check = Admission()
    api.add_validator(check)
    return check


# Fixtures that need the double: its simulated cluster runs on the double's store.
_DOUBLE_FIXTURES = frozenset({"training", "kubeapi", "training_operator", "real_pods"})


def on_double(request: pytest.FixtureRequest) -> bool:
    """Whether this test runs on the API double (see the module docstring)."""
    return (request.node.get_closest_marker("double") is not None
            or bool(_DOUBLE_FIXTURES & set(request.fixturenames)))


@pytest.fixture
def api(request: pytest.FixtureRequest) -> Iterator[KubeAPI | RealAPI]:
    """The session's real API server behind a proxy of this test's; the double (with
    admission by the real schemas) for tests that drive pods or are marked ``double``."""
    if on_double(request):
        yield request.getfixturevalue("_double")[0]
        return
    server: TestAPIServer = request.getfixturevalue("test_api_server")
    real = RealAPI(server, NAMESPACE)
    try:
        yield real
    finally:
        real.close()


@pytest.fixture
def store(s3_server: SeaweedFS, aws_env: dict[str, str]) -> dict[str, str]:
    """A fresh bucket on the shared S3 server: the ``store`` section of a run."""
    return {"uri": f"s3://{s3_server.new_bucket()}/runs",
            "endpointUrl": s3_server.endpoint, "region": "us-east-1",
            "addressingStyle": "path"}


@pytest.fixture
def operators(api: KubeAPI, aws_env: dict[str, str], s3_server: SeaweedFS
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
    return Workers(s3=S3Spec(endpoint_url=store["endpointUrl"], region=store["region"],
                             addressing_style="path"), result=verdict_result)


@pytest.fixture
def training(api: KubeAPI, workers: Workers) -> Iterator[SimulatedTrainingOperator]:
    """The simulated Kubeflow training operator, its containers played by ``workers``."""
    sim = SimulatedTrainingOperator(api, run_container=workers).start()
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture
def kube(api: KubeAPI | RealAPI) -> Iterator[Kube]:
    """The operator's API client for the test's API server, closed after the test."""
    k = Kube(api.api_client())
    try:
        yield k
    finally:
        k.close()
