"""The comparator: validity checks, the boundary walk, drift statistics, the verdict.

Reads what the workers wrote to a run location (the spec, per-rank traces, beacons,
committed checkpoints) through :class:`~resumequal.run.location.RunLocation`, and concludes
PASS, FAIL, NONDETERMINISTIC or INVALID. It must not import the worker side
(``resumequal.train``, ``resumequal.train.state``, workloads): it judges the files, not the code
that wrote them.

Modules: ``files`` (reading a run location), ``validity`` (did the experiment test what
it claims), ``walk`` (boundaries in execution order, tolerance rules), ``drift`` (final
checkpoints, streamed tensor by tensor), ``judge`` (``compare_run``), ``ledger`` and
``resize`` (the verdict of a run whose world changes size), ``resizechecks`` (its validity).
"""

from resumequal.compare.controls import compare_qualification, evaluate_control
from resumequal.compare.drift import checkpoint_drift
from resumequal.compare.judge import compare_run
from resumequal.compare.validity import expected_checkpoint

__all__ = [
    "checkpoint_drift",
    "compare_qualification",
    "compare_run",
    "evaluate_control",
    "expected_checkpoint",
]
