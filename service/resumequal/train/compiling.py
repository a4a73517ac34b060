"""``torch.compile`` of the model (``compile.enabled``): where inductor caches, and what is
compiled.

Inductor keeps compiled graphs (the FX graph and AOTAutograd caches) and, on CUDA, Triton
kernels and autotuning results on disk under ``TORCHINDUCTOR_CACHE_DIR`` (Triton's under
``TRITON_CACHE_DIR``). Whether a resumed process finds them warm or compiles afresh is part
of what a qualification pins, so :func:`place_cache` sets both, per ``compile.cache``, in
this process before anything compiles: inductor reads them when it first looks for its
cache, and compile workers it spawns later inherit them.

The model is compiled in place with ``nn.Module.compile``, which keeps the module and its
parameter names (checkpoints, digests and the optimizer's bindings are the eager model's):
under DDP the bare model, before DDP wraps it (DDP's reducer hooks then see the gradients
the compiled backward accumulates); under FSDP2 each sharded block, after ``fully_shard``
(per-block, as torchtitan does, so FSDP2's all-gathers and reduce-scatters stay outside the
graphs). Both run on CPU with inductor's C++ backend.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from torch import nn

from resumequal.spec import CompileSpec
from resumequal.trace.records import CompileRecord

__all__ = ["CACHE_FOLDER", "compile_blocks", "compile_model", "place_cache"]

# Under the run's scratch folder.
CACHE_FOLDER = "compile-cache"


def cache_dir(spec: CompileSpec, scratch: Path, rank: int) -> Path:
    """The cache folder for this process under ``compile.cache``."""
    root = scratch / CACHE_FOLDER
    if spec.cache == "shared":
        return root / "shared"
    if spec.cache == "per-rank":
        return root / f"rank-{rank}"
    return root / f"fresh-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def place_cache(spec: CompileSpec, scratch: Path, rank: int) -> CompileRecord:
    """Point inductor's (and Triton's) caches at this process's folder and say whether it
    held anything when this process started."""
    folder = cache_dir(spec, scratch, rank).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    warm = any(folder.iterdir())
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    os.environ["TRITON_CACHE_DIR"] = str(folder / "triton")
    return CompileRecord(mode=spec.mode, cache=spec.cache, cache_dir=str(folder), warm=warm)


def compile_model(model: nn.Module, spec: CompileSpec) -> None:
    """Compile ``model``'s forward in place (before DDP wraps it)."""
    model.compile(mode=spec.mode)


def compile_blocks(blocks: list[nn.Module], spec: CompileSpec) -> None:
    """Compile each FSDP2-sharded block's forward in place."""
    for block in blocks:
        block.compile(mode=spec.mode)
