"""The handoff digest: the whole training state of a leg, gathered over its ranks.

A resize run (``preemption.resize``) restores a checkpoint in a world of another size, so
per-rank digests of the state (FSDP2's shards, per-rank optimizer shards) cannot be
compared across it. This digest is taken through the distributed state-dict API with full
state dicts: every rank gets the same unsharded model and optimizer state, keyed by
parameter name, whatever the world size. With the scheduler's state and the counters it is
what a resumed world must hold to continue where the saving world stopped.
It is a collective: every rank calls it at the same point.
"""

from __future__ import annotations

from typing import Any

from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from resumequal.trace.digest import value_digest
from resumequal.train.state import LiveState

_FULL = StateDictOptions(full_state_dict=True)


def handoff_digest(live: LiveState) -> str:
    """Digest of model, optimizer, scheduler and counters, gathered (a collective)."""
    w = live.workload
    state: dict[str, Any] = {
        "model": get_model_state_dict(live.model, options=_FULL),
        "optim": get_optimizer_state_dict(live.model, w.optimizer, options=_FULL),
        "scheduler": w.scheduler.state_dict() if w.scheduler is not None else None,
        "scaler": live.scaler.state_dict() if live.scaler is not None else None,
        "counters": (live.counters.step, live.counters.microstep),
    }
    return value_digest(state)
