"""The workload factory protocol: what a user's training code hands to resumequal.

A factory is a function ``factory(ctx: WorkloadContext) -> Workload``, named in the spec as
``workload.name: "my_package.my_module:my_factory"``. resumequal seeds every RNG with
``training.seed`` before calling it (so model initialisation is identical on every rank),
wraps ``Workload.model`` in DDP itself (or, with ``parallelism.kind: fsdp2``, shards it with
``fully_shard`` and points the optimizer's param groups at the sharded parameters of the
same names, so the optimizer must be built on the model's own parameters and not have
stepped), and owns the loop: the factory only builds things.

Rules a factory must follow for a resume to be exact:

- The dataset is a :class:`StatefulDataset`: everything that decides which samples come
  next lives in ``state_dict()`` (plain Python values), and ``load_state_dict`` restores it
  strictly (a missing or unexpected key raises ``KeyError`` naming the key).
- Or, with ``workload.loader`` in the spec, the dataset is a torchdata
  ``StatefulDataLoader`` built with ``ctx.loader`` (a ``torch.utils.data.Dataset``, a
  sampler, worker processes): :func:`~resumequal.workloads.load_workload` puts it behind
  the protocol (:class:`~resumequal.workloads.loader.LoaderStream`, which says how a batch
  carries its sample ids) and its ``state_dict`` is checkpointed per rank. Wrap it in a
  ``LoaderStream`` yourself to keep the field's type, or to choose the ids key.
- For a resize (``preemption.resize``) the dataset must also be a
  :class:`PositionalDataset`: each step's samples are taken by global position, not from a
  per-rank cursor (the built-in workloads' datasets are).
- Randomness in the input path may draw from the global Python ``random``, NumPy and torch
  RNGs (resumequal checkpoints them per rank); any private generator must be part of the
  dataset's state. In a DataLoader worker process the global RNGs are the worker's own,
  seeded afresh on a resume: a dataset drawing from them must be ``Stateful`` and carry
  them (as :class:`~resumequal.workloads.loader.SampleDataset` does), or draw from a
  generator seeded by the sample id.
- ``loss_fn(model, microbatch)`` returns the un-normalised loss of one microbatch; the loop
  divides by the accumulation steps.
- Precision is the spec's, not the factory's: with ``training.precision`` bf16 or fp16 the
  loop runs ``loss_fn`` under ``torch.autocast`` and, for fp16, scales the loss with a
  GradScaler it makes, checkpoints and traces itself. A factory builds an fp32 model and
  neither autocasts nor scales.

A factory may validate ``ctx.params`` with :func:`parse_params` to report bad parameters the
way the rest of the spec does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch
from pydantic import BaseModel, ValidationError
from torch import nn

from resumequal.spec import LoaderSpec, SpecError, TrainingSpec


@dataclass
class Microbatch:
    """One microbatch: the global sample ids it holds and the tensors ``loss_fn`` consumes."""

    sample_ids: list[int]
    data: Any


@runtime_checkable
class StatefulDataset(Protocol):
    """A per-rank stream of microbatches with an explicit, checkpointable cursor."""

    def next_microbatch(self) -> Microbatch:
        """The next microbatch for this rank; advances the cursor."""
        ...

    def synthetic_microbatch(self) -> Microbatch:
        """A well-formed microbatch that consumes neither the cursor nor any global RNG."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The cursor (and any private generator) as JSON values (checkpoints store it as
        JSON: a tuple comes back as a list, and a tensor or an object cannot be saved)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the cursor strictly: missing or unexpected keys raise KeyError."""
        ...


@runtime_checkable
class PositionalDataset(Protocol):
    """A dataset that can also give the samples at any global position: what a resize run
    (``preemption.resize``) needs, where a step's samples must not depend on the world."""

    def microbatch_at(self, position: int, size: int) -> Microbatch:
        """The ``size`` samples at global positions ``position ..`` of the sample order
        (epoch after epoch), built now; no cursor moves."""
        ...


LossFn = Callable[[nn.Module, Microbatch], torch.Tensor]


@dataclass
class Workload:
    """Everything the loop needs from a workload. ``model`` is not yet wrapped in DDP."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    dataset: StatefulDataset
    loss_fn: LossFn
    description: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkloadContext:
    """What a factory is given: its parameters, the training section, and its place;
    ``loader`` is ``workload.loader`` (None: the factory's dataset is its own)."""

    params: dict[str, Any]
    training: TrainingSpec
    rank: int
    world_size: int
    device: torch.device
    loader: LoaderSpec | None = None


WorkloadFactory = Callable[[WorkloadContext], Workload]


ParamsModel = TypeVar("ParamsModel", bound=BaseModel)


def parse_params(model: type[ParamsModel], params: Mapping[str, Any]) -> ParamsModel:
    """Validate workload parameters; a SpecError names each bad ``workload.params.<field>``."""
    try:
        return model.model_validate(dict(params))
    except ValidationError as e:
        lines = []
        for error in e.errors():
            loc = tuple(str(part) for part in error["loc"])
            path = ".".join(("workload.params", *loc))
            if error["type"] == "extra_forbidden":
                msg = "unknown parameter"
                if len(loc) == 1:
                    msg += f"; allowed: {', '.join(sorted(model.model_fields))}"
            elif error["type"] == "missing":
                msg = "required parameter is missing"
            else:
                msg = error["msg"].removeprefix("Value error, ")
                if loc:  # a whole-model check would echo every parameter
                    msg += f" (got {error['input']!r})"
            lines.append(f"{path}: {msg}")
        raise SpecError("\n".join(lines)) from e
