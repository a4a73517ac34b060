"""Checkpoints: DCP save/load, the barrier-guarded atomic commit, manifests, retention.

Owns the files of a checkpoint and the protocol that makes them appear atomically. Must
not know what the tensors mean (that is ``resumequal.train.state``) nor drive training.
"""

from resumequal.checkpoint.folder import FolderRoot
from resumequal.checkpoint.layout import Position
from resumequal.checkpoint.manager import CheckpointManager, Loaded
from resumequal.checkpoint.manifest import Manifest, verify
from resumequal.checkpoint.reading import VerifiedCheckpoint
from resumequal.checkpoint.remote import RemoteRoot
from resumequal.checkpoint.storage import CheckpointRoot, checkpoint_location

__all__ = [
    "CheckpointManager",
    "CheckpointRoot",
    "FolderRoot",
    "Loaded",
    "Manifest",
    "Position",
    "RemoteRoot",
    "VerifiedCheckpoint",
    "checkpoint_location",
    "verify",
]
