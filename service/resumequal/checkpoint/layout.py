"""Names and places of checkpoints inside a leg's checkpoint root.

A checkpoint is named for the training position it holds: ``step-00000005`` after five
completed optimizer steps, ``step-00000005+1`` when one microbatch of step 6 had also run
(an emergency checkpoint at a mid-accumulation cut). Only committed checkpoints carry such
a name at the root; work in progress lives under ``.staging/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

STAGING_DIR = ".staging"
TRASH_DIR = ".trash"
MANIFEST = "manifest.json"
# The manifest's HMAC-SHA256 under the checkpoint key (resumequal.run.signing), hex.
MANIFEST_MAC = "manifest.hmac"
DCP_DIR = "dcp"

_NAME = re.compile(r"^step-(\d{8,})(?:\+(\d+))?$")


@dataclass(frozen=True, order=True)
class Position:
    """Completed optimizer steps, and microbatches of the next step already run."""

    step: int
    microstep: int = 0

    @property
    def name(self) -> str:
        base = f"step-{self.step:08d}"
        return base if self.microstep == 0 else f"{base}+{self.microstep}"

    @classmethod
    def parse(cls, name: str) -> Position | None:
        m = _NAME.match(name)
        if m is None:
            return None
        pos = cls(int(m.group(1)), int(m.group(2) or 0))
        # Only the canonical spelling is a checkpoint: "+0" or "+01" would be looked up
        # under another name than the folder's.
        return pos if pos.name == name else None


def rank_state_file(rank: int) -> str:
    return f"rank-{rank}.json"


def committed(root: Path) -> list[Position]:
    """Committed checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        pos = Position.parse(child.name)
        if pos is not None and child.is_dir():
            found.append(pos)
    return sorted(found)


def staging_path(root: Path, pos: Position, attempt: int) -> Path:
    return root / STAGING_DIR / f"{pos.name}.attempt-{attempt}"
