"""The runtime inventory of a worker: versions, numerics flags and relevant env vars.

Runs inside workers and imports torch to ask it; the record it fills,
:class:`~resumequal.trace.records.InventoryRecord`, is torch-free.
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import torch

from resumequal.built import BuiltOptimizer
from resumequal.spec.launchers import FORKED_ENV
from resumequal.trace import digest
from resumequal.trace.records import CompileRecord, InventoryRecord

__all__ = ["collect_inventory", "relevant_env"]

_ENV_NAMES: Final = frozenset(
    {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED"}
)
_ENV_PREFIXES: Final = ("NCCL_", "TORCH_", "GLOO_", "CUDA_")
_SECRET_MARKERS: Final = ("KEY", "SECRET", "TOKEN", "PASSWORD", "CREDENTIAL")


def relevant_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Env vars that can change numerics or communication, never secret-looking ones."""
    environ = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for name in sorted(environ):
        upper = name.upper()
        if any(marker in upper for marker in _SECRET_MARKERS):
            continue
        if name in _ENV_NAMES or name.startswith(_ENV_PREFIXES):
            out[name] = environ[name]
    return out


def _nccl_version() -> str | None:
    if not (torch.cuda.is_available() and torch.distributed.is_nccl_available()):
        return None
    version: tuple[Any, ...] = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
    # (major, minor, patch) plus an optional build suffix such as "+cuda12.4".
    return ".".join(str(v) for v in version[:3]) + "".join(str(v) for v in version[3:])


def _cudnn_version() -> int | None:
    if not torch.backends.cudnn.is_available():  # type: ignore[no-untyped-call]
        return None
    version: int | None = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
    return version


def collect_inventory(rank: int, attempt: int, compile: CompileRecord | None = None,
                      built: BuiltOptimizer | None = None) -> InventoryRecord:
    """The runtime inventory of this process; ``compile`` where the model is compiled,
    ``built`` what the workload built."""
    return InventoryRecord(
        rank=rank,
        attempt=attempt,
        pid=os.getpid(),
        host=socket.gethostname(),
        python=platform.python_version(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        cudnn=_cudnn_version(),
        nccl=_nccl_version(),
        gloo=torch.distributed.is_available() and torch.distributed.is_gloo_available(),
        numpy=np.__version__,
        platform=platform.platform(),
        num_threads=torch.get_num_threads(),
        deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        cudnn_deterministic=bool(torch.backends.cudnn.deterministic),
        cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        cudnn_allow_tf32=bool(torch.backends.cudnn.allow_tf32),
        env=relevant_env(),
        compile=compile,
        launcher="forked" if os.environ.get(FORKED_ENV) == "1" else "torchrun",
        built=built,
        digest=digest.used(),
    )

