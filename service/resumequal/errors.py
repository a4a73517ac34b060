"""Our exceptions, one per boundary; vendor errors are chained with ``from e``.

    ResumequalError
    ├── SpecError         a spec cannot be loaded or does not validate (resumequal.spec)
    ├── UsageError        the command line asks for what cannot be done (nothing ran)
    ├── TrainingError     a leg cannot go on (bad workload, restore disagreement, arm timeout)
    ├── CheckpointError   a checkpoint cannot be written, found, verified or loaded
    ├── StoreError        the store (file or object storage) refused an operation
    ├── TraceError        a trace file cannot be read or holds a line that is not a record
    │   └── TraceNotAuthentic   a trace segment's MAC does not hold for this run
    ├── ReportError       a report file cannot be read: unknown schema version or invalid
    ├── MetricsError      metrics cannot be written to a textfile or pushed to a gateway
    └── ClusterError      the Kubernetes API refused or failed a request
"""


class ResumequalError(Exception):
    """Base of every error resumequal raises on purpose."""


class UsageError(ResumequalError):
    """The command line asks for what cannot be done here (a run location another run
    holds); nothing ran."""


class TrainingError(ResumequalError):
    """A training leg cannot continue."""


class CheckpointError(ResumequalError):
    """A checkpoint is missing, torn, tampered with, or does not match what is restored."""


class CheckpointMissing(CheckpointError):
    """No committed checkpoint of that name exists."""


class StoreError(ResumequalError):
    """The store refused or failed an operation."""


class NotAuthentic(StoreError):
    """An object read back from a store carries no MAC, or one that does not hold for this
    run and the name it was read under: whoever can write the store wrote it."""


class TraceError(ResumequalError):
    """A trace file is unreadable or holds a bad line; the message names file and line."""


class TraceNotAuthentic(TraceError):
    """A trace segment carries no MAC, or one that does not hold for this run and name."""


class ReportError(ResumequalError):
    """A report or verdict file has an unknown schema version or does not validate."""


class MetricsError(ResumequalError):
    """Metrics could not be written or pushed; the message names the target, never secrets."""


class ClusterError(ResumequalError):
    """The Kubernetes API refused or failed a request; the message names the object and the
    HTTP status, never the response body. ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
