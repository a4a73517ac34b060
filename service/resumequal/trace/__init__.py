"""The trace: what each rank did, step by step, written as JSON lines and compared later.

- :mod:`~resumequal.trace.records`: the record models, and reading and writing trace
  files. Imports no torch, so the comparator's report assembly and the operator can read
  traces.
- :mod:`~resumequal.trace.digest`: exact digests of tensors, optimizer and RNG state
  (torch).
- :mod:`~resumequal.trace.inventory`: the runtime inventory of a worker (torch).

This package imports nothing on its own: import the module you need, so reading a trace
never loads torch.
"""
