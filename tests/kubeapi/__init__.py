"""A stateful Kubernetes API server over real HTTP on loopback, for the operator's tests.

Owns: the emulated cluster state and its semantics (resourceVersion conflicts, status
subresource, generation, patches, selectors, watches with 410 Gone, finalizers, owner
garbage collection, admission validators), served to the official ``kubernetes`` client,
plus a simulated Kubeflow training operator and Job controller (``training``). Must not:
import the operator under test, or talk to anything but loopback.

    with KubeAPI() as api:
        api.register_pytorchjob_crd()
        core = kubernetes.client.CoreV1Api(api.api_client())

Fixtures for test modules: ``pytest_plugins = ("tests.kubeapi.fixtures",)``.
"""

from .api import PYTORCHJOB_CRD, QUALIFICATIONRUN_CRD, KubeAPI
from .errors import ApiError
from .resources import Kind
from .store import Deletion, WatchEvent

__all__ = ["PYTORCHJOB_CRD", "QUALIFICATIONRUN_CRD", "ApiError", "Deletion", "Kind", "KubeAPI",
           "WatchEvent"]
