"""What the forkserver of :mod:`resumequal.worker.agent` loads once, before it forks any worker.

The code every leg's worker loads before its first step (see ``bench/restart_floor.py``):
torch and torch.distributed, torchrun's module (with the elastic agent's wrapper, which
runs each worker's function), DCP (with DTensor, FX and sympy), dynamo (DDP's constructor
reads one of its settings, and loads it), our CLI with the spec models, and our worker
modules. What only some legs use (boto3 for an S3 store, inductor for a compiled leg) a
worker still loads itself.

Then what was loaded is frozen out of the cyclic collector's reach: a worker forked from
here shares those pages with the forkserver, and a full pass of its collector would walk
(and so copy) every one of them. Nothing here runs a parallel region or a collective,
touches CUDA (checked: a CUDA context does not survive a fork, and a forked worker must be
free to initialise its own) or reads what torchrun sets per worker (RANK, LOCAL_RANK, ...).
What the imports write into the environment (torch's inductor sets
``TORCHINDUCTOR_CACHE_DIR``) is undone: a worker starts from the environment torchrun
gives a fresh one.
"""

from __future__ import annotations

import gc
import importlib
import os

MODULES = (
    "torch", "torch.distributed",
    "torch.distributed.run",  # the agent's workers are run by its function
    "torch.distributed.checkpoint", "torch._dynamo",
    "resumequal.cli", "resumequal.train.worker",
)



def restore_environ(before: dict[str, str]) -> None:
    """Make ``os.environ`` what it was: imports may set variables a fresh worker lacks."""
    for name in set(os.environ) - set(before):
        del os.environ[name]
    for name, value in before.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def check_cuda_untouched() -> None:
    """Refuse to be forked from once CUDA is initialised here (no forked child could use it)."""
    import torch

    if torch.cuda.is_initialized():
        raise RuntimeError("resumequal.train.preload initialised CUDA in the forkserver; "
                           "forked workers could not use it")


_environ = dict(os.environ)
gc.disable()  # half a million objects to come: no pass over them while they load
try:
    for name in MODULES:
        importlib.import_module(name)
    check_cuda_untouched()
finally:
    restore_environ(_environ)
    gc.collect()
    gc.freeze()
    gc.enable()
