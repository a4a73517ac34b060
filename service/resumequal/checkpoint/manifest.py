"""The manifest: every file of a checkpoint with its size and sha256.

Written last before the commit, verified before any byte of a checkpoint is loaded: a
torn, truncated, tampered or padded checkpoint fails here, naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from resumequal.checkpoint.layout import MANIFEST
from resumequal.errors import CheckpointError

MANIFEST_FORMAT = 1
_CHUNK = 1 << 20


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int
    sha256: str


class Manifest(BaseModel):
    """What a committed checkpoint holds."""

    model_config = ConfigDict(extra="forbid")
    format: int = MANIFEST_FORMAT
    name: str
    step: int
    microstep: int
    world_size: int
    attempt: int
    created_at: float
    files: dict[str, FileEntry]
    info: dict[str, Any] = {}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)


def fsync_dir(path: Path) -> None:
    """Make a rename or file creation inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(
    directory: Path,
    *,
    name: str,
    step: int,
    microstep: int,
    world_size: int,
    attempt: int,
    info: dict[str, Any] | None = None,
) -> Manifest:
    """Hash every file under ``directory`` and write the manifest durably."""
    files = {
        str(p.relative_to(directory)): FileEntry(size=p.stat().st_size, sha256=sha256_file(p))
        for p in _files(directory)
    }
    manifest = Manifest(
        name=name,
        step=step,
        microstep=microstep,
        world_size=world_size,
        attempt=attempt,
        created_at=time.time(),
        files=files,
        info=info or {},
    )
    write_manifest_file(directory, manifest)
    return manifest


def write_manifest_file(directory: Path, manifest: Manifest) -> None:
    """Write ``manifest`` durably as the manifest of ``directory``."""
    tmp = directory / f".{MANIFEST}.tmp"
    with tmp.open("w") as f:
        f.write(manifest.model_dump_json(indent=1))
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(directory / MANIFEST)
    fsync_dir(directory)


def read_manifest(directory: Path) -> Manifest:
    path = directory / MANIFEST
    try:
        return Manifest.model_validate(json.loads(path.read_text()))
    except FileNotFoundError as e:
        raise CheckpointError(f"{directory}: no {MANIFEST}; the checkpoint is not complete") from e
    except (json.JSONDecodeError, ValidationError) as e:
        raise CheckpointError(f"{path}: unreadable manifest: {e}") from e


def verify(directory: Path) -> Manifest:
    """Check every file against the manifest: presence, size, sha256, and nothing extra."""
    manifest = read_manifest(directory)
    present = {str(p.relative_to(directory)) for p in _files(directory)}
    extra = sorted(present - set(manifest.files))
    if extra:
        raise CheckpointError(f"{directory}: files not in the manifest: {', '.join(extra)}")
    for rel, entry in sorted(manifest.files.items()):
        path = directory / rel
        if not path.is_file():
            raise CheckpointError(f"{directory}: {rel} is listed in the manifest but missing")
        size = path.stat().st_size
        if size != entry.size:
            raise CheckpointError(
                f"{directory}: {rel} has {size} bytes, the manifest says {entry.size}"
            )
        digest = sha256_file(path)
        if digest != entry.sha256:
            raise CheckpointError(
                f"{directory}: {rel} fails its sha256 check (manifest {entry.sha256[:12]}…, "
                f"file {digest[:12]}…): the checkpoint was modified after it was committed"
            )
    return manifest
