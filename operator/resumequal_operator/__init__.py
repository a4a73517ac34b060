"""resumequal_operator: the cluster side of resumequal.

Owns the QualificationRun custom resource (``resource``: spec and status models; ``crd``:
the CRD generated from them), the manifests a run starts (``pytorchjob``: one Kubeflow
PyTorchJob per leg, one comparator Job), and the controller that drives the same
qualification core as ``resumequal run`` through a Kubernetes backend. The controller
runtime it runs in (work queue, watches and caches, leader election, health port) is a
package of its own, ``runtime``: of the rest it imports only the API door, ``kube``.

Must never import torch or numpy, directly or through anything it imports: the operator
image carries no training stack. Of resumequal it uses only the torch-free packages and
modules (spec, plan, qualify, verdict, metrics, store, errors, run). Training runs in
the pods it starts, never in the operator.
"""
