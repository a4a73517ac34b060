"""The operator against the API emulator (real HTTP, the official client) and SeaweedFS
(a real S3 server).

Every object written to the emulator passes admission by the schemas in
``tests/k8s_schemas.py``: PyTorchJobs against Kubeflow's CRD, QualificationRuns (status
included) against the chart's CRD, Jobs, Leases and Events against Kubernetes' own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from resumequal.store.s3settings import S3Spec
from resumequal.verdict import Result
from resumequal_operator.kube import Kube
from testing.kubeapi import KubeAPI
from testing.kubeapi.training import SimulatedTrainingOperator
from tests.operator.harness import Admission, Operators
from tests.operator.workers import Workers

if TYPE_CHECKING:  # loaded as a plugin by tests/conftest.py; importing it here defeats
    # assert rewriting
    from tests.s3server import SeaweedFS


@pytest.fixture
def admission(kubeapi: KubeAPI) -> Admission:
    check = Admission()
    kubeapi.add_validator(check)
    return check


@pytest.fixture
def api(kubeapi: KubeAPI, admission: Admission) -> KubeAPI:
    """The emulator, with admission by the real schemas."""
    return kubeapi


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
def kube(kubeapi: KubeAPI) -> Iterator[Kube]:
    """The operator's API client for the test's API server, closed after the test."""
    k = Kube(kubeapi.api_client())
    try:
        yield k
    finally:
        k.close()
