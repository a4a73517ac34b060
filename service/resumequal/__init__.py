"""resumequal: qualify a training stack for exact resumption after preemption.

The worker side (spec, workloads, train, state, checkpoint, trace) runs inside every
training process; the comparator, reports and the local runner read what workers wrote.
"""

__version__ = "0.1.0"
