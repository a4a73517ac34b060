"""A trial build of a spec's workload: ``python -m resumequal.train.trial SPEC RESULT``.

Run by :mod:`resumequal.local.trial` in a process of its own before anything launches:
the factory is imported and called as rank 0 of the spec's world would call it, on the
CPU. Exit 0 when it built; otherwise RESULT holds one message naming the workload and
what failed, and the exit status is 2.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import torch

from resumequal.errors import ResumequalError
from resumequal.spec import QualificationSpec, load_spec
from resumequal.train.devices import check_trains_on
from resumequal.workloads import WorkloadContext, load_workload


def build(spec: QualificationSpec) -> None:
    """Build the workload as the training loop does (seeded, its threads), then drop it."""
    t = spec.training
    torch.set_num_threads(spec.world.threads_per_rank)
    # As resumequal.train.state.seed_everything seeds, without the checkpoint machinery that
    # module loads (0.7 s of the trial's 2 s of imports).
    random.seed(t.seed)
    np.random.seed(t.seed % 2**32)
    torch.manual_seed(t.seed)
    ctx = WorkloadContext(params=dict(spec.workload.params), training=t, rank=0,
                          world_size=spec.world.world_size, device=torch.device("cpu"))
    workload = load_workload(spec.workload, ctx)
    # Built on the CPU, checked for the device the legs will train on here.
    backend = spec.world.backend
    cuda = backend == "nccl" or (backend == "auto" and torch.cuda.is_available())
    legs_device = "cuda" if cuda else "cpu"
    check_trains_on(workload.model, torch.device(legs_device), spec.workload.name)


def failure(name: str, e: BaseException) -> str:
    """What to tell: our errors name the field already; another names the workload and
    the exception's last line."""
    if isinstance(e, ResumequalError):
        return str(e)
    lines = str(e).strip().splitlines()
    last = f"{type(e).__name__}: {lines[-1]}" if lines else type(e).__name__
    return f"workload.name {name!r}: building the workload raised {last}"


def main(argv: list[str]) -> int:
    spec_path, result = argv
    spec = load_spec(spec_path)
    try:
        build(spec)
    except BaseException as e:  # the user's code: SystemExit and all are a failed build
        Path(result).write_text(failure(spec.workload.name, e))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
