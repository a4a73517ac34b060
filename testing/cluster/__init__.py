"""A real Kubernetes control plane on this machine, for the cluster tests and by hand.

Owns: building etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
helm, the Kubeflow controllers and SeaweedFS from their pinned Go modules; starting them
on loopback with keys made on the spot; the node agent that stands in for the kubelet
(the one part that cannot run without a container runtime); installing the chart with
helm; stopping every process it started. Must not: be imported by the product, or stand in
for anything that runs here for real.
"""
