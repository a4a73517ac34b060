"""The spec digest: a stable sha256 of what decides the numerics of training, tying a run
folder to one experiment.

Where a leg is cut, how legs are compared, timeouts, controls and the matrix are left out:
the legs of one run differ in exactly those. A field added after the first release is left
out while it holds the value every spec had before it existed (:data:`ADDED_AFTER_V1`), so
run folders made then still belong to their spec.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from resumequal.spec.sections import SpecSections

# The sections digested.
DIGESTED: Final[tuple[str, ...]] = ("workload", "world", "training", "checkpoint", "ddp",
                                    "parallelism", "compile")

# The fields added to the digested sections after v1, by camelCase path, each with the value
# (as JSON) that leaves it out of the digest. Fields added together form one entry, left out
# only when all of them hold that value: an fp16 spec with the scaler's defaults digests both
# precision and gradScaler. A new field of a digested section needs an entry here, or the
# digests of every spec written before it change.
ADDED_AFTER_V1: Final[tuple[Mapping[str, Any], ...]] = tuple(MappingProxyType(m) for m in (
    {"training.precision": "fp32",
     "training.gradScaler": {"initScale": 65536.0, "growthFactor": 2.0, "backoffFactor": 0.5,
                             "growthInterval": 2}},
    {"parallelism": {"kind": "ddp"}},
    {"compile": {"enabled": False, "mode": "default", "cache": "shared"}},
    {"workload.loader": None},
    {"world.launcher": "torchrun"},
    # Left out of dumps while unset (sections.CheckpointSpec), so absent rather than null.
    {"checkpoint.gcs": None},
))


def spec_digest(spec: SpecSections) -> str:
    """The sha256 (hex) of ``spec``'s digested sections, less the later fields at their v1
    values."""
    data = spec.model_dump(mode="json", include=set(DIGESTED))
    for added in ADDED_AFTER_V1:
        if all(_parent(data, path).get(_leaf(path)) == v1 for path, v1 in added.items()):
            for path in added:
                _parent(data, path).pop(_leaf(path), None)
    if spec.preemption.resize is not None:
        # Every leg of a resize run draws its data globally, the reference leg too.
        data["data"] = "global"
    canonical = json.dumps(data, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _parent(data: dict[str, Any], path: str) -> dict[str, Any]:
    """The mapping that holds the last key of a dotted ``path``."""
    for key in path.split(".")[:-1]:
        data = data[key]
    return data


def _leaf(path: str) -> str:
    return path.rpartition(".")[2]
