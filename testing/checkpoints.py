"""Checkpoint folders made by hand, for the tests and the benches: a manifest over the files
a folder already holds, each read back and hashed.

A save never does this (it hashes each file as it writes it, and whoever can write the folder
could have changed a file since): so it lives here, not in the product.
"""

from __future__ import annotations

import time
from pathlib import Path

from resumequal.checkpoint.chunks import CHUNK_BYTES, ChunkHasher
from resumequal.checkpoint.manifest import (
    CheckpointInfo,
    FileEntry,
    Manifest,
    folder_files,
    write_manifest_file,
)
from resumequal.run.signing import run_id_from_env
from resumequal.store import regular

__all__ = ["file_entry", "write_manifest"]


def file_entry(path: Path) -> FileEntry:
    """The manifest entry of the regular file at ``path``, read from disk (a link or a
    FIFO there is refused)."""
    hasher = ChunkHasher()
    with open(regular.open_path(path, follow=False), "rb", buffering=0) as f:
        while block := f.read(CHUNK_BYTES):
            hasher.update(block)
    return FileEntry(size=hasher.size, chunks=hasher.digests())


def write_manifest(
    directory: Path,
    *,
    name: str,
    step: int,
    microstep: int,
    world_size: int,
    attempt: int,
    info: CheckpointInfo | None = None,
    run: str | None = None,
) -> Manifest:
    """Hash every file under ``directory`` and write the manifest durably, naming run ``run``
    (default: this process's run id). A save passes the digests taken while writing to
    write_manifest_file instead; this reads every file once more."""
    files = {rel: file_entry(directory / rel) for rel in folder_files(directory)}
    manifest = Manifest(
        name=name,
        step=step,
        microstep=microstep,
        world_size=world_size,
        attempt=attempt,
        created_at=time.time(),
        files=files,
        info=info or {},
        run=run if run is not None else run_id_from_env() or "",
    )
    write_manifest_file(directory, manifest)
    return manifest

