"""A stateful Kubernetes API server over real HTTP on loopback, for the operator's tests.

Owns: the emulated cluster state and its semantics, served to the official ``kubernetes``
client and ``kubectl``, plus the cluster side as upstream behaves: the Kubeflow training
operator v1.9 (PyTorchJob), the batch/v1 Job controller and a kubelet whose containers are
scripted threads or real processes (:mod:`.training`). Must not: import the operator
under test, or talk to anything but loopback.

    # fixtures (tests.kubeapi.fixtures, loaded by tests/conftest.py): kubeapi,
    # kube_client, training_operator, pod_runtime, real_pods

    with KubeAPI() as api:                          # or the ``kubeapi`` fixture
        api.register_pytorchjob_crd()               # register_crd(dict | path) for others
        core = kubernetes.client.CoreV1Api(api.api_client())

``KubeAPI``: ``start``/``stop`` (the same port again on restart, state kept), ``url``,
``configuration()``, ``api_client()``; setup: ``register_crd``, ``add_validator(fn)``
(admission: raise or return a message → 422), ``inject_fault(method=, kind=, code=,
times=)``, ``compact()`` (watches from older resourceVersions get 410), ``end_watches()``
(every stream ends; clients must resume); in-process
accessors that keep every semantic (resourceVersion, watch events, validators): ``get``
(None when absent), ``list``, ``create``, ``replace``, ``patch`` (merge/json),
``patch_status``, ``delete``, ``wait_for(predicate, timeout)``; records: ``deletions`` /
``deletions_of(kind)`` (grace period, policy, cause: api, garbage-collector,
training-operator, job-controller, namespace), ``created(kind)`` (every object ever
created), ``history(kind)`` (watch events), ``pruned`` (fields pruned from custom
resources), ``requests`` (HTTP requests). Kinds are named by plural (``pods``),
``plural.group`` (``jobs.batch``), Kind or short name (``qr``).

Served: core/v1 namespaces, pods, events, secrets; batch/v1 jobs; coordination.k8s.io/v1
leases; apiextensions.k8s.io/v1 customresourcedefinitions (creating one serves it);
discovery (``/version``, ``/api``, ``/apis``, ``/apis/<g>``, ``/apis/<g>/<v>``, enough for
the dynamic client and kubectl); what the real ``kubectl`` reads besides (:mod:`.kubectl`:
Tables of custom resources, OpenAPI v3 reduced to the PATCH operations) and
``fieldValidation``. Semantics: see :mod:`.store` (conflicts, status
subresource, generation, finalizers, garbage collection, graceful pod deletion, strict
field validation), :mod:`.patch`, :mod:`.selectors`, :mod:`.schema` (pruning),
:mod:`.server` (watch: ADDED / MODIFIED / DELETED as the selection sees it, BOOKMARK,
ERROR 410, timeoutSeconds, sendInitialEvents). Not emulated: authentication and RBAC,
strategic merge (415, as for custom resources) and server-side apply, Foreground
deletion, dry runs (400), deletecollection (405), list pagination, CRD schema validation
beyond pruning (register validators for that; an exception with a ``field`` names it in
the 422), CRD defaulting, conversion between CRD versions, field managers, pod logs/exec,
scale subresources, aggregated discovery, OpenAPI v2, printers of built-in kinds.
"""

from .api import PYTORCHJOB_CRD, QUALIFICATIONRUN_CRD, KubeAPI
from .errors import ApiError
from .resources import Kind
from .store import Deletion, WatchEvent

__all__ = ["PYTORCHJOB_CRD", "QUALIFICATIONRUN_CRD", "ApiError", "Deletion", "Kind", "KubeAPI",
           "WatchEvent"]
