"""Capture and restore of the full training state, and the negative-control omissions.

Owns what a checkpoint must carry (model, optimizer, scheduler, RNGs, data cursor and a
StatefulDataLoader's state, counters, pending gradients at a mid-accumulation cut, AMP
scaler) and how a restore may
deliberately leave parts out. Knows nothing about files, stores or commit protocols.

The state is split in two: tensors that DCP writes (model, optimizer, rank-keyed pending
gradients) and a per-rank :class:`RankState` of plain values, stored as JSON (RNG states
included: their bytes and integers, never a pickle). DCP treats plain tensors saved
under the same key on every rank as replicated and restores rank 0's copy everywhere, so
anything rank-local is keyed by rank or kept in the per-rank mapping.

Pending gradients under FSDP2 (``parallelism.kind: fsdp2``): while gradient sync is off,
FSDP2 accumulates each rank's *unsharded* gradients on its private unsharded parameters
(the sharded parameters' ``grad`` stays None until the reduce-scatter of the last
microbatch). They are saved per rank under their parameter names, like DDP's, at their
full shape, and put back on the unsharded parameters (all-gathered first, resharded
after) where the next backward adds to them. This reads FSDP2's private per-parameter
state (``FSDPParam``), checked when it is used.
"""

from __future__ import annotations

import logging
import random
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal, cast

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import FSDPModule

from resumequal.errors import CheckpointError
from resumequal.spec import OMISSIONS
from resumequal.spec.omissions import StatePart, left_out
from resumequal.trace.records import StepPartial
from resumequal.workloads.base import Workload
from resumequal.workloads.loader import LoaderStream

log = logging.getLogger(__name__)

# 2: JSON (1 was a pickle, never loaded again).
RANK_STATE_FORMAT: Final = 2


@dataclass
class Counters:
    """Where the loop stands: completed optimizer steps and progress inside the next one."""

    step: int = 0
    microstep: int = 0
    global_microstep: int = 0

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.step, self.microstep, self.global_microstep)


@dataclass
class LiveState:
    """The live objects of one rank that together make up its training state."""

    workload: Workload
    model: nn.Module  # the DDP-wrapped model; state dicts are taken through it
    rank: int
    world_size: int
    scaler: torch.amp.GradScaler | None = None  # precision fp16's loss scaler
    counters: Counters = field(default_factory=Counters)
    trace_partial: StepPartial | None = None


class _Strict(BaseModel):
    # NaN and infinities (a diverging loss) survive the JSON round trip as constants.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants",
                              ser_json_bytes="base64", val_json_bytes="base64")


class PythonRng(_Strict):
    """``random.getstate()``."""

    version: int
    state: list[int]
    gauss_next: float | None


class NumpyRng(_Strict):
    """``np.random.get_state()`` (the legacy global MT19937)."""

    bit_generator: str
    key: list[int]
    pos: int
    has_gauss: int
    cached_gaussian: float


class RngState(_Strict):
    """Every RNG state of a rank, as plain values: Python, NumPy, torch CPU, each CUDA
    device (torch's states are their bytes)."""

    python: PythonRng
    numpy: NumpyRng
    torch: bytes
    cuda: list[bytes] | None = None

    @classmethod
    def of(cls, rng: dict[str, Any]) -> RngState:
        """From a mapping made by :func:`capture_rng`."""
        version, state, gauss_next = rng["python"]
        name, key, pos, has_gauss, cached = rng["numpy"]
        cuda = rng.get("cuda")
        return cls(
            python=PythonRng(version=version, state=list(state), gauss_next=gauss_next),
            numpy=NumpyRng(bit_generator=name, key=[int(k) for k in key], pos=int(pos),
                           has_gauss=int(has_gauss), cached_gaussian=float(cached)),
            torch=rng["torch"].numpy().tobytes(),
            cuda=None if cuda is None else [t.numpy().tobytes() for t in cuda],
        )

    def live(self) -> dict[str, Any]:
        """The mapping :func:`restore_rng` takes."""
        n = self.numpy
        rng: dict[str, Any] = {
            "python": (self.python.version, tuple(self.python.state), self.python.gauss_next),
            "numpy": (n.bit_generator, np.array(n.key, dtype=np.uint32), n.pos, n.has_gauss,
                      n.cached_gaussian),
            "torch": _byte_tensor(self.torch),
        }
        if self.cuda is not None:
            rng["cuda"] = [_byte_tensor(b) for b in self.cuda]
        return rng


def _byte_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


class CounterState(_Strict):
    step: int
    microstep: int
    global_microstep: int


class RankState(_Strict):
    """The per-rank part of a checkpoint: everything but the tensors DCP writes.

    The data cursor, scheduler and scaler states are whatever their objects'
    ``state_dict`` gives, which must be JSON values (a tuple comes back as a list).
    """

    format: Literal[2] = RANK_STATE_FORMAT
    rank: int
    world_size: int
    counters: CounterState
    rng: RngState
    # Any, not JsonValue: a tuple is accepted (and comes back as a list); what JSON
    # cannot hold fails when the checkpoint is saved, naming the rank state.
    data_cursor: dict[str, Any]
    # A StatefulDataLoader's state_dict, encoded as JSON values (workloads.plainstate).
    loader: dict[str, Any] | None = None
    scheduler: dict[str, Any] | None
    scaler: dict[str, Any] | None
    trace_partial: dict[str, Any] | None
    # Names, not a flag: a parameter that got no gradient yet has none to restore.
    pending_grads: list[str]



def omitted_parts(omit: frozenset[str]) -> frozenset[StatePart]:
    """The union of state parts the given omissions leave out (their descriptors' in
    :data:`resumequal.spec.omissions.CONTROLS`)."""
    unknown = sorted(set(omit) - set(OMISSIONS))
    if unknown:
        raise ValueError(f"unknown omission(s) {unknown}; allowed: {', '.join(OMISSIONS)}")
    return left_out(omit)


def capture_rng() -> dict[str, Any]:
    """Every RNG this process draws from: Python, NumPy, torch CPU and each CUDA device."""
    rng: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: dict[str, Any]) -> None:
    """Set every RNG from a mapping made by :func:`capture_rng`."""
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng:
        torch.cuda.set_rng_state_all(rng["cuda"])


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) with one value."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _pending_key(rank: int) -> str:
    return f"rank_{rank}"


def tensor_state(live: LiveState, with_pending_grads: bool) -> dict[str, Any]:
    """The DCP state dict: model, optimizer and, mid-accumulation, this rank's pending grads."""
    w = live.workload
    model_sd, optim_sd = get_state_dict(
        live.model, w.optimizer, options=StateDictOptions(strict=True)
    )
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    if with_pending_grads:
        state[_pending_key(live.rank)] = {"pending_grads": pending_grads(live.model)}
    return state


def _fsdp_params(model: FSDPModule) -> dict[str, Any]:
    """FSDP2's private per-parameter state (``FSDPParam``) of every sharded module under
    ``model``, by the parameter's name."""
    assert isinstance(model, nn.Module)
    # By module and attribute: a restore may have swapped the parameter objects.
    prefixes = {id(m): f"{n}." if n else "" for n, m in model.named_modules()}
    out: dict[str, Any] = {}
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        for group in _fsdp_param_groups(module):
            for fsdp_param in group.fsdp_params:
                info = fsdp_param._module_info
                out[prefixes[id(info.module)] + info.param_name] = fsdp_param
    return out


def _fsdp_param_groups(module: FSDPModule) -> list[Any]:
    """The parameter groups of one sharded module: a list in a recent torch, a single
    group (or None) under ``_fsdp_param_group`` in an older one (2.9)."""
    state = module._get_fsdp_state()
    groups: list[Any] | None = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return groups
    if not hasattr(state, "_fsdp_param_group"):
        raise CheckpointError(
            f"pending gradients under parallelism.kind=fsdp2 read FSDP2's per-parameter "
            f"state, which torch {torch.__version__} keeps elsewhere")
    group = state._fsdp_param_group
    return [] if group is None else [group]


def _fsdp_pending(fsdp_param: Any) -> torch.Tensor | None:
    accumulated: torch.Tensor | None = fsdp_param.unsharded_accumulated_grad
    if accumulated is not None:
        return accumulated
    unsharded = getattr(fsdp_param, "_unsharded_param", None)
    return None if unsharded is None else unsharded.grad


def pending_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """This rank's accumulated, not yet reduced gradients, by parameter name: DDP's (on
    the parameters) or FSDP2's (unsharded, on FSDP2's unsharded parameters)."""
    if isinstance(model, FSDPModule):
        found = ((n, _fsdp_pending(fp)) for n, fp in _fsdp_params(model).items())
        return {n: g for n, g in found if g is not None}
    return {n: p.grad for n, p in _unwrapped(model).named_parameters() if p.grad is not None}


def _set_pending_grads(model: nn.Module, grads: dict[str, torch.Tensor]) -> None:
    if not isinstance(model, FSDPModule):
        for name, p in _unwrapped(model).named_parameters():
            if name in grads:
                p.grad = grads[name].detach().clone()
        return
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:  # every rank: an all-gather makes the unsharded parameters
        unit.unshard()
    for name, fsdp_param in _fsdp_params(model).items():
        if name in grads:
            fsdp_param.unsharded_param.grad = grads[name].detach().clone()
    for unit in units:
        unit.reshard()


def pending_grads_template(live: LiveState, names: list[str]) -> dict[str, Any]:
    """Tensors to load the named rank-local pending gradients into."""
    params = dict(_unwrapped(live.model).named_parameters())
    unknown = sorted(set(names) - set(params))
    if unknown:
        raise CheckpointError(f"pending gradients for unknown parameter(s): {unknown}")
    # At the full shape: FSDP2's pending gradients are unsharded (a DTensor's shape is too).
    return {
        _pending_key(live.rank): {
            "pending_grads": {n: torch.empty(params[n].shape, dtype=params[n].dtype,
                                             device=params[n].device) for n in names}
        }
    }


def rank_state(live: LiveState) -> RankState:
    """The per-rank plain-value part of the state."""
    w = live.workload
    return RankState(
        rank=live.rank,
        world_size=live.world_size,
        counters=CounterState(**asdict(live.counters)),
        rng=RngState.of(capture_rng()),
        data_cursor=w.dataset.state_dict(),
        loader=w.dataset.loader_state_dict() if isinstance(w.dataset, LoaderStream) else None,
        scheduler=w.scheduler.state_dict() if w.scheduler is not None else None,
        scaler=live.scaler.state_dict() if live.scaler is not None else None,
        trace_partial=live.trace_partial,
        pending_grads=sorted(pending_grads(live.model)) if live.counters.microstep > 0 else [],
    )


def restore(
    live: LiveState,
    tensors: dict[str, Any],
    ranks: RankState,
    omit: frozenset[str],
    source: str,
    *,
    global_data: bool = False,
) -> None:
    """Apply a loaded state to the live objects, leaving out what ``omit`` selects.

    With ``global_data`` (a resize run) the RNGs, data cursor and loader state are not
    restored: the loop draws every microbatch's samples and streams from its global
    position, and ``ranks`` may be another rank's state, of a world of another size."""
    left = omitted_parts(omit)
    parts: set[StatePart] = set(left)
    if global_data:
        parts |= {"rng", "data_cursor", "loader"}
    w = live.workload
    try:
        if "optimizer" in parts:
            set_model_state_dict(live.model, tensors["model"],
                                 options=StateDictOptions(strict=True))
            # The load wrote into the state get_state_dict had initialised for the template:
            # drop it, so the optimizer starts as a fresh one does (state built lazily).
            w.optimizer.state.clear()
        else:
            set_state_dict(
                live.model,
                w.optimizer,
                model_state_dict=tensors["model"],
                optim_state_dict=tensors["optim"],
                options=StateDictOptions(strict=True),
            )
    except (RuntimeError, KeyError, ValueError) as e:
        raise CheckpointError(f"{source}: model/optimizer state does not fit: {e}") from e

    w.optimizer.zero_grad(set_to_none=True)
    if ranks.pending_grads and "pending_grads" not in parts:
        _set_pending_grads(live.model, tensors[_pending_key(live.rank)]["pending_grads"])

    if "scheduler" not in parts:
        _load_optional(w.scheduler, ranks.scheduler, "scheduler", source)
    if "scaler" not in parts:
        _load_optional(live.scaler, ranks.scaler, "scaler", source)
    if "data_cursor" not in parts:
        try:
            w.dataset.load_state_dict(ranks.data_cursor)
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{source}: data cursor does not fit the dataset: {e}") from e
    if "loader" not in parts:
        _load_loader(w.dataset, ranks.loader, source)
    if "rng" not in parts:
        restore_rng(ranks.rng.live())
    c = ranks.counters
    live.counters = Counters(c.step, c.microstep, c.global_microstep)
    # Saved as the plain data the StepPartial TypedDict describes (it was written from one).
    live.trace_partial = cast("StepPartial | None", ranks.trace_partial)
    if left:  # the rank-keyed controls leave nothing out
        log.warning("rank %d restored %s without: %s", live.rank, source, ", ".join(sorted(parts)))


def _load_optional(obj: Any, state: Any, name: str, source: str) -> None:
    if (obj is None) != (state is None):
        have = "has" if obj is not None else "has no"
        saved = "saved one" if state is not None else "saved none"
        raise CheckpointError(f"{source}: the workload {have} {name} but the checkpoint {saved}")
    if obj is not None:
        obj.load_state_dict(state)


def _load_loader(dataset: object, state: dict[str, Any] | None, source: str) -> None:
    stream = dataset if isinstance(dataset, LoaderStream) else None
    if (stream is None) != (state is None):
        have = "reads from a" if stream is not None else "has no"
        saved = "saved" if state is not None else "saved no"
        raise CheckpointError(
            f"{source}: the workload {have} StatefulDataLoader but the checkpoint {saved} "
            "loader state")
    if stream is not None and state is not None:
        try:
            stream.load_loader_state_dict(state)
        except (KeyError, TypeError, ValueError, AssertionError) as e:
            raise CheckpointError(f"{source}: loader state does not fit the loader: {e}") from e


def _unwrapped(model: nn.Module) -> nn.Module:
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, nn.Module) else model
