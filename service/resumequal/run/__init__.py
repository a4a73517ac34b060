"""The run location: everything of one qualification on a store (a folder or an object
store: ``s3://``, ``gs://``).

Owns the location's layout and the names of its objects (``layout``), its name
(``name``), the run's key and seal and the sealed JSON objects made with them
(``signing``, ``seal``), the location itself with its specs and claim (``location``), each
leg's beacons, kill orders and markers (``beacons``, ``legfiles``), the one reader and
writer of traces (``traces``), how far a leg got (``progress``), the run's results and their
export (``results``).
The names and formats it writes are a contract with existing runs.

Shared with the operator: must import neither torch nor numpy, nor the worker side
(``train``, ``checkpoint``, the trace's digests), nor ``report``, nor the qualification
machine that acts on it (``qualify``, whose timeline reads it). Importers name the module
they use: this package exports nothing of its own.
"""
