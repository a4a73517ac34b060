"""The operator's controller runtime: what runs a reconciler, whatever it reconciles.

Owns the work queue of object keys (``workqueue``), the list-then-watch that keeps objects
in caches and feeds the queue (``watching``, ``cache``), leader election on a Lease
(``leader``), the ``/metrics``, ``/healthz`` and ``/readyz`` port (``health``) and the
thread pool requests are sent on side by side (``fanout``), as controller-runtime keeps
``pkg/workqueue``, ``pkg/cache`` and ``pkg/leaderelection`` apart from reconcilers.

Must not depend on what the operator does with the objects it serves: it imports nothing
of the operator's domain modules (resource, controller, backend, manager, status,
manifests, CRD) and nothing of resumequal but its error tree
(:class:`resumequal.errors.ClusterError`, which the API door raises and the state machine
retries). It reaches the API server only through :mod:`resumequal_operator.kube`, whose
catalog of kinds gives the watcher its default kind, QualificationRuns. An import-linter
contract in ``pyproject.toml`` checks all of this. The QualificationRun reconciler is
wired to it in :mod:`resumequal_operator.manager`.
"""
