"""The local cluster's one error: what could not be built, started or stopped, and why."""


class ClusterError(Exception):
    """A part of the local cluster could not be built, started or stopped; says which."""
