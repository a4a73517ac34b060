"""Pytest fixtures for the emulator, loaded as a plugin by ``tests/conftest.py``.

``kubeapi``: a started emulator serving PyTorchJob (and QualificationRun when the chart's
CRD exists), stopped after the test. ``kube_client``: an ``ApiClient`` for it.
``training_operator``: the simulated training operator, Job controller and kubelet on
``kubeapi``, every container scripted as a process that runs until signalled (set
``run_container`` through the constructor for more). ``pod_runtime``: a
:class:`ProcessRuntime` under the test's tmp_path; ``real_pods``: the same simulation
running each container as a real process there, whose logs are printed at teardown
(pytest shows them for a failing test).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import kubernetes.client
import pytest

from .api import QUALIFICATIONRUN_CRD, KubeAPI

if TYPE_CHECKING:
    from .processes import ProcessRuntime
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
    """The simulated cluster on ``kubeapi``, with scripted containers that hold."""
    from .training import SimulatedTrainingOperator

    with SimulatedTrainingOperator(kubeapi) as operator:
        yield operator


@pytest.fixture
def pod_runtime(tmp_path: Path) -> ProcessRuntime:
    """Real containers: logs and working directories under ``tmp_path/pods``."""
    from .processes import ProcessRuntime

    return ProcessRuntime(tmp_path / "pods")


@pytest.fixture
def real_pods(kubeapi: KubeAPI, pod_runtime: ProcessRuntime
              ) -> Iterator[SimulatedTrainingOperator]:
    """The simulated cluster on ``kubeapi`` running every container as a real process."""
    from .training import SimulatedTrainingOperator

    operator = SimulatedTrainingOperator(kubeapi, runtime=pod_runtime).start()
    try:
        yield operator
    finally:
        try:
            operator.stop()
        finally:
            print(pod_runtime.logs())
