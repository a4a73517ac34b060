"""Pytest fixtures for the emulator, loaded as a plugin by ``tests/conftest.py``.

``kubeapi``: a started emulator serving PyTorchJob (and QualificationRun when the chart's
CRD exists), stopped after the test. ``kube_client``: an ``ApiClient`` for it.
``training_operator``: a started :class:`SimulatedTrainingOperator` on ``kubeapi``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import kubernetes.client
import pytest

from .api import QUALIFICATIONRUN_CRD, KubeAPI

if TYPE_CHECKING:
    from .training import SimulatedTrainingOperator


@pytest.fixture
def kubeapi() -> Iterator[KubeAPI]:
    """A running emulator with the PyTorchJob CRD (and QualificationRun's, when generated)."""
    with KubeAPI() as api:
        api.register_pytorchjob_crd()
        if QUALIFICATIONRUN_CRD.exists():
            api.register_crd(QUALIFICATIONRUN_CRD)
        yield api


@pytest.fixture
def kube_client(kubeapi: KubeAPI) -> Iterator[kubernetes.client.ApiClient]:
    """An official client talking to ``kubeapi``."""
    client = kubeapi.api_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def training_operator(kubeapi: KubeAPI) -> Iterator[SimulatedTrainingOperator]:
    """The simulated training operator and Job controller, running against ``kubeapi``."""
    from .training import SimulatedTrainingOperator

    operator = SimulatedTrainingOperator(kubeapi)
    operator.start()
    try:
        yield operator
    finally:
        operator.stop()
