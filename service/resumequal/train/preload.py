"""What the forkserver of :mod:`resumequal.agent` loads once, before it forks any worker.

The code every leg's worker loads before its first step (see ``bench/restart_floor.py``):
torch and torch.distributed, torchrun's module (with the elastic agent's wrapper, which
runs each worker's function), DCP (with DTensor, FX and sympy), dynamo (DDP's constructor
reads one of its settings, and loads it), our CLI with the spec models, and our worker
modules. What only some legs use (boto3 for an S3 store, inductor for a compiled leg) a
worker still loads itself.

Then what was loaded is frozen out of the cyclic collector's reach: a worker forked from
here shares those pages with the forkserver, and a full pass of its collector would walk
(and so copy) every one of them. Nothing here runs a parallel region or a collective,
touches CUDA (a forked worker may still initialise it) or reads what torchrun sets per
worker (RANK, LOCAL_RANK, ...): a forked worker starts from the state a fresh one imports
into.
"""

from __future__ import annotations

import gc
import importlib

MODULES = (
    "torch", "torch.distributed",
    "torch.distributed.run",  # the agent's workers are run by its function
    "torch.distributed.checkpoint", "torch._dynamo",
    "resumequal.cli", "resumequal.train.worker",
)

gc.disable()  # half a million objects to come: no pass over them while they load
try:
    for name in MODULES:
        importlib.import_module(name)
finally:
    gc.collect()
    gc.freeze()
    gc.enable()
