"""A stateful Kubernetes API server over real HTTP on loopback, for the operator's tests and
benches (testing/kubeapi/README.md: what it reproduces, and from which upstream source).

Owns: the emulated cluster state and its semantics, served to the official ``kubernetes``
client and ``kubectl``, and the cluster side as upstream behaves: the Kubeflow training
operator v1.9 (PyTorchJob), the batch/v1 Job controller and a kubelet whose containers are
scripted threads, here or on a node process of their own (:mod:`.node`), or real processes
(:mod:`.training`). Must not: import the operator
under test, or talk to anything but loopback.

    with KubeAPI() as api:                          # or the ``kubeapi`` fixture
        api.register_pytorchjob_crd()
        core = kubernetes.client.CoreV1Api(api.api_client())

Fixtures (:mod:`.fixtures`): kubeapi, kube_client, training_operator, pod_runtime,
real_pods. :class:`KubeAPI` has the lifecycle, set-up (CRDs, admission validators, injected
faults, compaction, ended watches), in-process accessors that keep every semantic, and
records (deletions, created objects, watch history, pruned fields, HTTP requests).

Served: namespaces, pods, events, secrets, batch/v1 jobs, leases, network policies (stored,
not enforced), CRDs and the custom
resources they define; discovery and what ``kubectl`` reads (:mod:`.kubectl`). Semantics in
:mod:`.store`, :mod:`.patch`, :mod:`.selectors`, :mod:`.schema` and :mod:`.server`, each
saying what it does not emulate (answered with an error, never approximated): among them
authentication and RBAC, JSON patch, strategic merge, server-side apply, dry runs,
Foreground deletion, namespace deletion, deletecollection, list pagination, streaming
lists, set-based selectors, CRD defaulting and conversion, pod logs and exec.
"""

from .api import PYTORCHJOB_CRD, QUALIFICATIONRUN_CRD, KubeAPI
from .errors import ApiError
from .resources import Kind
from .store import Deletion, WatchEvent

__all__ = ["PYTORCHJOB_CRD", "QUALIFICATIONRUN_CRD", "ApiError", "Deletion", "Kind", "KubeAPI",
           "WatchEvent"]
