"""Which features of a spec need a newer torch than the project's floor, and the refusal.

The project runs on torch 2.6 and later (``pyproject.toml``). A feature that needs an API
only a later torch has is listed in :data:`FEATURES`: the spec fields that turn it on, a
predicate saying whether a spec needs it, and the first torch version that has it. A spec
that needs a feature the installed torch lacks is refused before anything launches
(:class:`NotSupported`), never left to die inside a leg of an ImportError.

Torch-free, so that the operator can read it: it cannot probe a training image, and judges
by ``stack.torchVersion`` with :meth:`TorchInfo.of_version`. A worker or the CLI probes the
torch it imports (:func:`resumequal.train.probes.installed_torch`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from resumequal.spec.qualification import QualificationSpec
from resumequal.spec.section import SpecError


@dataclass(frozen=True)
class Feature:
    """A feature some torch versions lack: what turns it on, and since when torch has it."""

    name: str
    fields: tuple[str, ...]  # spec paths, camelCase, as written in a spec
    needed_by: Callable[[QualificationSpec], bool]
    since: str  # the first torch release that has ``api``
    api: str  # what the feature needs from torch, as a refusal names it


FEATURES: tuple[Feature, ...] = (
    Feature(
        name="fsdp2",
        fields=("parallelism.kind",),
        needed_by=lambda spec: spec.parallelism.kind == "fsdp2",
        since="2.9.0",
        # The trace digests each rank's gradients before their reduce-scatter through it.
        api="FSDP2's custom reduce-scatter (FSDPModule.set_custom_reduce_scatter)",
    ),
)
FEATURE_NAMES: tuple[str, ...] = tuple(f.name for f in FEATURES)

_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


def version_key(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of ``2.6.0``, ``2.9.1+cu128`` or ``2.8.0a0+git1234``.

    A pre-release counts as its release: a nightly of 2.8 is judged as 2.8.0."""
    m = _VERSION.match(version.strip())
    if m is None:
        raise ValueError(f"{version!r} is not a torch version (e.g. 2.6.0)")
    return int(m[1]), int(m[2]), int(m[3] or 0)


@dataclass(frozen=True)
class TorchInfo:
    """A torch, as far as the table cares: its version and the features it lacks."""

    version: str
    lacks: frozenset[str]

    @classmethod
    def of_version(cls, version: str) -> TorchInfo:
        """What a torch of ``version`` lacks, by release; for whoever cannot import it."""
        key = version_key(version)
        return cls(version, frozenset(f.name for f in FEATURES if key < version_key(f.since)))


class NotSupported(SpecError):
    """The spec needs features the torch that would run it lacks; the message names each
    feature, its spec field, that torch and the first version that has it."""

    def __init__(self, missing: list[Feature], spec: QualificationSpec, torch: TorchInfo) -> None:
        self.features = tuple(f.name for f in missing)
        super().__init__("\n".join(refusal(f, spec, torch) for f in missing))


def refusal(feature: Feature, spec: QualificationSpec, torch: TorchInfo) -> str:
    """One feature's refusal, e.g. ``parallelism.kind=fsdp2 (fsdp2) is not supported by
    torch 2.6.0: it needs ..., first in torch 2.9.0``."""
    data = spec.model_dump(mode="json")
    fields = ", ".join(f"{path}={_shown(_at(data, path))}" for path in feature.fields)
    return (f"{fields} ({feature.name}) is not supported by torch {torch.version}: it needs "
            f"{feature.api}, first in torch {feature.since}")


def missing_features(spec: QualificationSpec, torch: TorchInfo) -> list[Feature]:
    """The features ``spec`` needs that ``torch`` lacks, in table order."""
    return [f for f in FEATURES if f.name in torch.lacks and f.needed_by(spec)]


def check_supported(spec: QualificationSpec, torch: TorchInfo) -> None:
    """Raise :class:`NotSupported` when ``spec`` needs a feature ``torch`` lacks."""
    missing = missing_features(spec, torch)
    if missing:
        raise NotSupported(missing, spec, torch)


def _at(data: dict[str, Any], path: str) -> Any:
    node: Any = data
    for key in path.split("."):
        node = node[key]
    return node


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
