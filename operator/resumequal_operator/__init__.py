"""resumequal_operator: the cluster side (CRD, PyTorchJob backend, controller).

Drives the same qualification core as ``resumequal run`` with a Kubernetes backend.
Must never import torch: the operator image carries no training stack.
"""
