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

What compiling did is traced by :class:`CompileWatch`: after each step during which graphs
compiled, a :class:`CompiledRecord` with dynamo's compile time, inductor's and
AOTAutograd's cache hits and misses and the kernels max-autotune chose (inductor's feedback
savers report each benchmark it runs; a graph loaded from the cache runs the kernels chosen
when it was compiled, and on CPU training graphs call ATen for their matmuls, so nothing is
autotuned there).
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from pathlib import Path
from typing import Any

from torch import nn

from resumequal.errors import TrainingError
from resumequal.spec import CompileSpec
from resumequal.trace.records import AutotuneChoice, CompiledRecord, CompileRecord

__all__ = ["CACHE_FOLDER", "CompileWatch", "compile_blocks", "compile_model", "place_cache"]

# Under the run's scratch folder: a private one, never the run folder (which may be the
# store, writable by others).
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
    folder = cache_dir(spec, scratch, rank)
    scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
    for part in (folder.parent, folder):
        _own_folder(part)
    folder = folder.resolve()
    warm = any(folder.iterdir())
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    os.environ["TRITON_CACHE_DIR"] = str(folder / "triton")
    return CompileRecord(mode=spec.mode, cache=spec.cache, cache_dir=str(folder), warm=warm)


def _own_folder(path: Path) -> None:
    """Make ``path`` (0700) unless it exists; TrainingError unless it is a folder of this
    user that no one else can write to: inductor runs the code it finds in its cache."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or mode & 0o022:
        raise TrainingError(
            f"compile cache folder {path} is not a folder of this user that only it can "
            f"write to (owner uid {info.st_uid}, mode {mode:o}, "
            f"{'a folder' if stat.S_ISDIR(info.st_mode) else 'not a folder'}): inductor "
            "would run what others put there")


def compile_model(model: nn.Module, spec: CompileSpec) -> None:
    """Compile ``model``'s forward in place (before DDP wraps it)."""
    model.compile(mode=spec.mode)


def compile_blocks(blocks: list[nn.Module], spec: CompileSpec) -> None:
    """Compile each FSDP2-sharded block's forward in place."""
    for block in blocks:
        block.compile(mode=spec.mode)


class CompileWatch:
    """Collects what compiled in this process between steps (one per process: inductor's
    feedback savers and dynamo's compilation metrics are process-wide)."""

    def __init__(self, rank: int, attempt: int) -> None:
        # Imported here: a second of start-up every eager worker would pay for nothing.
        from torch._dynamo import utils
        from torch._inductor import select_algorithm

        self.rank, self.attempt = rank, attempt
        self._chosen: list[AutotuneChoice] = []
        self._metrics, self._clear = utils.get_compilation_metrics, utils.clear_compilation_metrics
        self._clear()
        select_algorithm.add_feedback_saver(self._saw_benchmark)

    def _saw_benchmark(self, timings: dict[Any, float], name: str, input_nodes: list[Any],
                       *_: Any) -> None:
        if not timings:
            return
        best = min(timings, key=lambda c: timings[c])
        self._chosen.append(AutotuneChoice(
            op=name, inputs=[str(list(n.get_size())) for n in input_nodes],
            choice=str(getattr(best, "name", best))))

    def after_step(self, step: int) -> CompiledRecord | None:
        """What compiled since the last call, or None when nothing did."""
        metrics = self._metrics()
        if not metrics:
            return None
        self._clear()
        chosen, self._chosen = self._chosen, []

        def total(field: str) -> int:
            return sum(int(getattr(m, field, None) or 0) for m in metrics)

        # A forward frame's entire_frame_compile_time_s covers dynamo, AOTAutograd and the
        # forward graph's inductor compile; AOTAutograd compiles the backward lazily, at
        # the first backward, in an entry of its own.
        seconds = sum(float(getattr(m, "entire_frame_compile_time_s", None) or 0.0)
                      for m in metrics) + total("backward_cumulative_compile_time_us") / 1e6
        return CompiledRecord(
            rank=self.rank, attempt=self.attempt, step=step, graphs=len(metrics),
            seconds=round(seconds, 6),
            fx_cache_hits=total("inductor_fx_local_cache_hit_count"),
            fx_cache_misses=total("inductor_fx_local_cache_miss_count"),
            autograd_cache_hits=total("aotautograd_local_cache_hit_count"),
            autograd_cache_misses=total("aotautograd_local_cache_miss_count"),
            autotuned=chosen)
