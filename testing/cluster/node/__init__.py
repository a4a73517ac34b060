"""The node agent: the one part of the local cluster that is ours, standing in for the
kubelet (no container runtime runs here). It registers a Node and runs the pods the real
scheduler binds to it as processes in network namespaces of their own, with their volumes,
environment, user, probes, restarts and deletions as the kubelet handles them.

Owns: what the kubelet does towards the API server and to a pod's processes, each rule
naming the upstream file it follows. Must not: decide anything a controller decides, nor
reach the API with more than a node's credentials.
"""
