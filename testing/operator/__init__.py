"""What the operator tests and the reconcile bench share: a run's manifest and the operator
started against the pod cluster (harness), and the scripted workers of its legs (workers)."""
