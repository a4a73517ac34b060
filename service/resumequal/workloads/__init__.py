"""Workloads: what trains during a qualification.

This package owns the reference workloads (``dropout-mlp``, ``tiny-gpt``), the factory
protocol a user's training code implements (:mod:`resumequal.workloads.base`), and
:func:`load_workload`, which turns ``spec.workload`` into a :class:`Workload`.

It only builds things. It must not create or use process groups, read or write
checkpoints, or wrap models in DDP: the training loop does all three.

Errors from :func:`load_workload`:

- ``SpecError`` (names ``workload.name`` or ``workload.params.<field>``): unknown workload,
  factory module not importable, attribute missing or not callable, bad parameters.
- ``TrainingError``: the factory ran but returned something that is not a ``Workload``, a
  data source that is neither a ``StatefulDataset`` nor a ``StatefulDataLoader``, or a
  source that does not match ``workload.loader``.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import replace

from resumequal.errors import TrainingError
from resumequal.spec import SpecError, WorkloadSpec
from resumequal.workloads import dropout_mlp, loader, tiny_gpt
from resumequal.workloads.base import (
    Microbatch,
    StatefulDataset,
    Workload,
    WorkloadContext,
    WorkloadFactory,
    parse_params,
)

__all__ = [
    "BUILTIN_FACTORIES",
    "Microbatch",
    "StatefulDataset",
    "Workload",
    "WorkloadContext",
    "WorkloadFactory",
    "load_workload",
    "parse_params",
]

logger = logging.getLogger(__name__)

BUILTIN_FACTORIES: dict[str, WorkloadFactory] = {
    "dropout-mlp": dropout_mlp.build,
    "tiny-gpt": tiny_gpt.build,
}


def resolve_factory(name: str) -> WorkloadFactory:
    """The factory for a built-in name or a ``module:function`` reference."""
    if ":" not in name:
        if name not in BUILTIN_FACTORIES:
            raise SpecError(
                f"workload.name: unknown workload {name!r}; allowed: "
                f"{', '.join(BUILTIN_FACTORIES)} or a factory 'module:function'"
            )
        return BUILTIN_FACTORIES[name]
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise SpecError(
            f"workload.name: cannot import module {module_name!r} for factory {name!r}: {e}"
        ) from e
    try:
        factory = getattr(module, attr)
    except AttributeError as e:
        raise SpecError(
            f"workload.name: module {module_name!r} has no attribute {attr!r}"
        ) from e
    if not callable(factory):
        raise SpecError(
            f"workload.name: {name!r} is not callable; it is of type {type(factory).__name__}"
        )
    return factory  # type: ignore[no-any-return]


def load_workload(spec: WorkloadSpec, ctx: WorkloadContext) -> Workload:
    """Build the workload ``spec`` names; the factory sees ``spec.params`` as ``ctx.params``."""
    factory = resolve_factory(spec.name)
    logger.debug("building workload %s on rank %d", spec.name, ctx.rank)
    workload = factory(replace(ctx, params=dict(spec.params), loader=spec.loader))
    if not isinstance(workload, Workload):
        raise TrainingError(
            f"workload factory {spec.name!r} returned a {type(workload).__name__}, "
            "not a resumequal.workloads.base.Workload"
        )
    return replace(workload, dataset=_data_source(spec, workload.dataset))


def _data_source(spec: WorkloadSpec, dataset: object) -> StatefulDataset:
    """The workload's dataset behind the StatefulDataset protocol, checked against
    ``workload.loader``."""
    if loader.is_stateful_dataloader(dataset):
        dataset = loader.LoaderStream(dataset)  # type: ignore[arg-type]
    if isinstance(dataset, loader.LoaderStream):
        if spec.loader is None:
            raise TrainingError(
                f"workload factory {spec.name!r} returned a StatefulDataLoader: set "
                "workload.loader (e.g. 'loader: {workers: 2}') so that its state's negative "
                "control is planned and the spec says how it loads"
            )
        loader.check_settings(dataset, spec.loader)
        return dataset
    if spec.loader is not None:
        raise TrainingError(
            f"workload.loader is set but workload factory {spec.name!r} returned a "
            f"{type(dataset).__name__}, not a torchdata StatefulDataLoader"
        )
    if not isinstance(dataset, StatefulDataset):
        raise TrainingError(
            f"workload factory {spec.name!r} returned a dataset "
            f"({type(dataset).__name__}) without the StatefulDataset methods "
            "next_microbatch, synthetic_microbatch, state_dict, load_state_dict, and it is "
            "not a torchdata StatefulDataLoader"
        )
    return dataset
