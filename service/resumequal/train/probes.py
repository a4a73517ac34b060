"""What the torch of this process provides, probed API by API (never by its version).

One probe per feature of :data:`resumequal.spec.capabilities.FEATURES`: whether the APIs the
feature calls can be imported and looked up here. The CLI checks a spec against them
before it launches anything, and every leg again when it starts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from resumequal.spec import QualificationSpec
from resumequal.spec.capabilities import TorchInfo, check_supported


def _has(module: str, *names: str) -> bool:
    """Whether ``module`` imports and holds the attribute path ``names``."""
    try:
        found: object = importlib.import_module(module)
    except ImportError:
        return False
    for name in names:
        if not hasattr(found, name):
            return False
        found = getattr(found, name)
    return True


def _fsdp2() -> bool:
    return (_has("torch.distributed.fsdp", "FSDPModule", "set_custom_reduce_scatter")
            and _has("torch.distributed.fsdp._fully_shard._fsdp_api", "ReduceScatter"))


PROBES: dict[str, Callable[[], bool]] = {
    "fsdp2": _fsdp2,
}


def installed_torch() -> TorchInfo:
    """This process's torch: its version and the features whose probe fails."""
    return TorchInfo(str(torch.__version__),
                     frozenset(name for name, probe in PROBES.items() if not probe()))


def check_installed(spec: QualificationSpec) -> None:
    """Raise NotSupported when ``spec`` needs a feature this process's torch lacks."""
    check_supported(spec, installed_torch())
