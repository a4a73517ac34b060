"""Checkpoints: DCP save/load, the barrier-guarded atomic commit, manifests, retention.

Owns the files of a checkpoint and the protocol that makes them appear atomically. Must
not know what the tensors mean (that is ``resumequal.state``) nor drive training.
"""

from resumequal.checkpoint.layout import Position
from resumequal.checkpoint.manager import CheckpointManager, Loaded
from resumequal.checkpoint.manifest import Manifest, verify
from resumequal.checkpoint.remote import RemoteRoot, checkpoint_location

__all__ = [
    "CheckpointManager",
    "Loaded",
    "Manifest",
    "Position",
    "RemoteRoot",
    "checkpoint_location",
    "verify",
]
