"""The manifest: every file of a checkpoint with its size and chunk digests, and its MAC.

Written last before the commit from the digests each rank took while writing its files
(:mod:`resumequal.checkpoint.chunks`); every byte of a checkpoint is checked against it
before it is used: a torn, truncated, tampered or padded checkpoint fails, naming the file
(and the chunk). A resuming rank checks just the chunks it reads, as it reads them
(:mod:`resumequal.checkpoint.reading`); :func:`verify` and :func:`copy_verified` check
whole folders.

The manifest's bytes are authenticated with the checkpoint key (:mod:`resumequal.run.signing`;
HMAC-SHA256 in ``manifest.hmac`` beside it) before anything else of the checkpoint is
read, the manifest's own JSON included: whoever can write to the store can recompute the
BLAKE3 digests, not the MAC. Every reader (the folder and object-store roots, the comparator)
goes through :func:`authenticate` here.

A manifest also names the run (``RESUMEQUAL_RUN_ID``), the leg and the position that wrote
it, and a reader refuses one of another run or leg, or one filed under another position:
a checkpoint copied from another run or leg (one signed with the same key) is refused by
name, never resumed from nor compared.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    model_validator,
)
from typing_extensions import Buffer, TypedDict  # pydantic needs it before Python 3.12

from resumequal.checkpoint.chunks import CHUNK_BYTES, chunk_count, chunk_digests
from resumequal.checkpoint.layout import MANIFEST, MANIFEST_MAC, Position
from resumequal.errors import CheckpointError
from resumequal.run.signing import authentic, key_from_env, run_id_from_env, sign
from resumequal.store import regular

# 2: the manifest names its run. 3: a BLAKE3 digest per chunk of each file instead of per file.
MANIFEST_FORMAT = 3
# What a reader takes of a manifest and of its MAC before refusing them unread: a manifest
# lists a checkpoint's files and a digest (about 70 bytes) per 4 MiB chunk of them, so
# this holds checkpoints up to about 900 GB; a MAC is 64 hex characters.
MANIFEST_BYTES = 16 << 20
MAC_BYTES = 1024
# The files of a checkpoint folder that its manifest does not list.
_UNLISTED = frozenset({MANIFEST, MANIFEST_MAC})


class FileEntry(BaseModel):
    """One file: its size and the BLAKE3 digest of each of its chunks, in order."""

    model_config = ConfigDict(extra="forbid")
    size: NonNegativeInt
    chunks: list[str]


class CheckpointInfo(TypedDict, total=False):
    """What a checkpoint says of itself beyond its position (the manifest's ``info``)."""

    leg: str
    """The leg that wrote it."""
    global_microstep: int
    """Microbatches the leg had run, over every update, when it was taken."""


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
    chunk_bytes: PositiveInt = CHUNK_BYTES
    """The size of the chunks every file is cut into, each with its own BLAKE3 digest."""
    files: dict[str, FileEntry]
    info: CheckpointInfo = {}
    run: str = ""
    """The run that wrote it (``RESUMEQUAL_RUN_ID``; empty when it had none)."""

    @model_validator(mode="after")
    def _whole_files(self) -> Self:
        for rel, entry in self.files.items():
            if len(entry.chunks) != chunk_count(entry.size, self.chunk_bytes):
                raise ValueError(f"{rel}: {len(entry.chunks)} chunk digests for "
                                 f"{entry.size} bytes")
        return self


@dataclass(frozen=True)
class Owned:
    """Whose checkpoints a root holds: a manifest that names another leg or run is refused."""

    # The leg whose checkpoints these are (None: any).
    leg: str | None = field(default=None, compare=False, kw_only=True)
    # The run they belong to (default: this process's RESUMEQUAL_RUN_ID).
    run: str | None = field(default=None, compare=False, kw_only=True)


def entry_of(data: Buffer) -> FileEntry:
    """The manifest entry of a file holding ``data``."""
    return FileEntry(size=len(memoryview(data).cast("B")), chunks=chunk_digests(data))


def folder_files(directory: Path) -> dict[str, int]:
    """Every file of checkpoint folder ``directory`` (but its manifest and MAC) with its
    size; CheckpointError naming a link, a FIFO or anything but a regular file there (or
    ``directory`` itself a link), which no save of ours makes."""
    try:
        found = regular.regular_sizes(directory.parent, directory.name)
    except regular.NotRegular as e:
        raise CheckpointError(f"checkpoint {directory} is refused: {e.strerror}") from e
    return {rel: size for rel, size in found.items() if rel not in _UNLISTED}


def make_manifest(
    position: Position, files: dict[str, FileEntry], *, world_size: int, attempt: int,
    info: CheckpointInfo, run: str | None = None,
) -> Manifest:
    """The manifest of a checkpoint at ``position`` holding ``files``, naming run ``run``
    (default: this process's run id)."""
    return Manifest(name=position.name, step=position.step, microstep=position.microstep,
                    world_size=world_size, attempt=attempt, created_at=time.time(),
                    files=dict(sorted(files.items())), info=info,
                    run=run if run is not None else run_id_from_env() or "")


def manifest_bytes(manifest: Manifest) -> bytes:
    """The bytes a manifest is stored (and signed) as."""
    return manifest.model_dump_json(indent=1).encode()


def manifest_digest(manifest: Manifest) -> str:
    """sha256 of the bytes ``manifest`` is stored as: what names one committed checkpoint."""
    return hashlib.sha256(manifest_bytes(manifest)).hexdigest()


def signed(manifest: Manifest, key: bytes | None = None) -> tuple[bytes, bytes]:
    """The manifest's bytes and their MAC under ``key`` (default: this process's key)."""
    data = manifest_bytes(manifest)
    return data, sign(data, key if key is not None else key_from_env()).encode()


def authenticate(data: bytes, mac: bytes | None, where: str,
                 key: bytes | None = None, *, leg: str | None = None,
                 run: str | None = None) -> Manifest:
    """The manifest of checkpoint ``where`` from its stored bytes, once their MAC verifies,
    and once it names this run (``run``, else this process's run id if it has one) and
    ``leg`` (when given).

    Nothing is parsed before the MAC is checked. CheckpointError naming the checkpoint
    when there is no key, no MAC, a MAC that does not match (a manifest written without
    this run's key, or changed since), or a manifest of another run or leg.
    """
    try:
        key = key if key is not None else key_from_env()
    except CheckpointError as e:
        raise CheckpointError(f"checkpoint {where} cannot be authenticated: {e}") from e
    if mac is None:
        raise CheckpointError(
            f"checkpoint {where} is refused: it has no {MANIFEST_MAC}, so its manifest "
            "cannot be authenticated"
        )
    if not authentic(data, mac, key):
        raise CheckpointError(
            f"checkpoint {where} is refused: its manifest does not match {MANIFEST_MAC} "
            "under this run's checkpoint key (written without the key, or changed since)"
        )
    try:
        manifest: Manifest | None = Manifest.model_validate_json(data)
        invalid: ValidationError | None = None
    except ValidationError as e:
        manifest, invalid = None, e
    if manifest is None or manifest.format != MANIFEST_FORMAT:
        fmt = _format(data)
        if fmt != MANIFEST_FORMAT:
            raise CheckpointError(
                f"checkpoint {where} is refused: its manifest has format {fmt}; this version "
                f"reads format {MANIFEST_FORMAT} (a BLAKE3 digest per chunk) only"
            ) from invalid
        raise CheckpointError(f"checkpoint {where}: unreadable manifest: {invalid}") from invalid
    return check_bound(manifest, where, leg, run)


def _format(data: bytes) -> object:
    """The ``format`` an authentic manifest's JSON names, whatever else it holds."""
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError):  # not JSON, or nested too deep to parse
        return None
    return parsed.get("format") if isinstance(parsed, dict) else None


def check_bound(manifest: Manifest, where: str, leg: str | None = None,
                run: str | None = None) -> Manifest:
    """``manifest`` if it names run ``run`` (default: ``RESUMEQUAL_RUN_ID``, when set),
    ``leg`` (when given) and a position of its own name; CheckpointError naming ``where``."""
    run = run if run is not None else run_id_from_env()
    if run is not None and manifest.run != run:
        theirs = f"run {manifest.run}" if manifest.run else "no run"
        raise CheckpointError(
            f"checkpoint {where} is refused: it names {theirs}, not this run ({run}): a "
            "checkpoint of another run, copied here")
    if leg is not None and manifest.info.get("leg") != leg:
        writer = manifest.info.get("leg")
        raise CheckpointError(
            f"checkpoint {where} is refused: it was written by "
            f"{f'the {writer} leg' if writer else 'no leg'}, not the {leg} leg: a checkpoint "
            "of another leg, copied here")
    position = Position.parse(manifest.name)
    if position is None or (position.step, position.microstep) != (manifest.step,
                                                                 manifest.microstep):
        raise CheckpointError(
            f"checkpoint {where} is refused: its manifest names {manifest.name!r} at step "
            f"{manifest.step}, microbatch {manifest.microstep}, which do not agree")
    return manifest


def write_manifest_file(directory: Path, manifest: Manifest, key: bytes | None = None) -> None:
    """Write ``manifest`` and its MAC durably as the manifest of ``directory``, each under a
    fresh name first (a link planted at any name is never written through)."""
    data, mac = signed(manifest, key)
    for name, body in ((MANIFEST_MAC, mac), (MANIFEST, data)):
        regular.write_file(directory.parent, f"{directory.name}/{name}", body)


def read_manifest(directory: Path, key: bytes | None = None, *,
                  leg: str | None = None, run: str | None = None) -> Manifest:
    """The authenticated manifest of checkpoint folder ``directory`` (of ``leg``, if given).
    The folder and its files are opened without following a link, a FIFO never blocks."""
    try:
        data = _read_capped(directory, MANIFEST, MANIFEST_BYTES)
    except FileNotFoundError as e:
        raise CheckpointError(f"{directory}: no {MANIFEST}; the checkpoint is not complete") from e
    try:
        mac: bytes | None = _read_capped(directory, MANIFEST_MAC, MAC_BYTES)
    except FileNotFoundError:
        mac = None
    return authenticate(data, mac, str(directory), key, leg=leg, run=run)


def _read_capped(directory: Path, name: str, max_bytes: int) -> bytes:
    try:
        data = regular.read_file(directory.parent, f"{directory.name}/{name}", max_bytes)
    except (regular.NotRegular, NotADirectoryError, IsADirectoryError) as e:
        raise CheckpointError(f"checkpoint {directory} is refused: "
                              f"{e.strerror or e}") from e
    if len(data) > max_bytes:
        raise CheckpointError(f"{directory / name}: larger than the {max_bytes} bytes it may "
                              "hold; not read")
    return data


def check_listing(directory: Path, manifest: Manifest) -> None:
    """Every file the manifest lists is in ``directory`` with its size, and nothing else
    is; the contents are checked as they are read."""
    check_sizes(str(directory), manifest, folder_files(directory), "files")


def check_sizes(where: str, manifest: Manifest, present: Mapping[str, int],
                kind: str) -> None:
    """``present`` (name -> size, of checkpoint ``where``) is exactly what the manifest
    lists, each with its size; ``kind`` names them in the error ("files", "objects")."""
    refused = f"checkpoint {where} is refused:"
    extra = sorted(set(present) - set(manifest.files))
    if extra:
        raise CheckpointError(f"{refused} {kind} not in the manifest: {', '.join(extra)}")
    for rel, entry in sorted(manifest.files.items()):
        if rel not in present:
            raise CheckpointError(f"{refused} {rel} is listed in the manifest but missing")
        if present[rel] != entry.size:
            raise CheckpointError(f"{refused} {rel} has {present[rel]} bytes, the manifest "
                                  f"says {entry.size}")


def _own_manifest(directory: Path, key: bytes | None, leg: str | None,
                  run: str | None) -> Manifest:
    manifest = read_manifest(directory, key, leg=leg, run=run)
    if manifest.name != directory.name:
        raise CheckpointError(
            f"checkpoint {directory} is refused: its manifest is the one of {manifest.name}"
        )
    return manifest


def _open_listed(directory: Path, rel: str) -> BinaryIO:
    """File ``rel`` of checkpoint folder ``directory``, a regular file reached without a
    link; CheckpointError naming it otherwise."""
    try:
        fd = regular.open_file(directory.parent, f"{directory.name}/{rel}")
    except (regular.NotRegular, NotADirectoryError, IsADirectoryError) as e:
        raise CheckpointError(f"checkpoint {directory} is refused: {e.strerror or e}") from e
    return open(fd, "rb", buffering=0)


def stream_check(f: BinaryIO, entry: FileEntry, chunk_bytes: int,
                 sink: Callable[[bytes], object] | None = None) -> tuple[int, int | None]:
    """Read file ``f`` chunk by chunk against ``entry`` (each chunk to ``sink`` once read,
    before it is checked): the bytes read (at most one past the manifest's size) and the
    first chunk that does not match, or None."""
    size, bad = 0, None
    for i in range(len(entry.chunks) + 1):
        want = min(chunk_bytes, entry.size - size) if i < len(entry.chunks) else 1
        block = f.read(want)
        if not block:
            break
        if sink is not None:
            sink(block)
        size += len(block)
        if i == len(entry.chunks):
            break
        if bad is None and len(block) == want and chunk_digests(block, chunk_bytes) != [
                entry.chunks[i]]:
            bad = i
        if len(block) < want:
            break
    return size, bad


def verify(directory: Path, key: bytes | None = None, *, leg: str | None = None,
           run: str | None = None) -> Manifest:
    """Authenticate the manifest (of ``leg``, if given), then check every file against it:
    presence, size, every chunk's BLAKE3 digest, and nothing extra. ``key`` defaults to this
    process's key."""
    manifest = _own_manifest(directory, key, leg, run)
    check_listing(directory, manifest)
    for rel, entry in sorted(manifest.files.items()):
        with _open_listed(directory, rel) as f:
            size, bad = stream_check(f, entry, manifest.chunk_bytes)
        if size != entry.size:
            raise CheckpointError(
                f"{directory}: {rel} has {size} bytes, the manifest says {entry.size}")
        if bad is not None:
            raise CheckpointError(
                f"{directory}: {rel} fails its BLAKE3 check at chunk {bad} (bytes "
                f"{bad * manifest.chunk_bytes}-"
                f"{min((bad + 1) * manifest.chunk_bytes, entry.size)}): the checkpoint was "
                "modified after it was committed"
            )
    return manifest


def copy_verified(directory: Path, dest: Path, key: bytes | None = None, *,
                  leg: str | None = None, run: str | None = None) -> Manifest:
    """Copy checkpoint folder ``directory`` into ``dest``, each file checked against the
    authenticated manifest as it is copied; ``dest`` then holds the checkpoint with its
    manifest. What is later read is the copy, so a file changed in ``directory`` after the
    check is never read (no window between verifying and loading)."""
    manifest = _own_manifest(directory, key, leg, run)
    dest.mkdir(parents=True)
    for rel, entry in sorted(manifest.files.items()):
        out = dest / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise CheckpointError(f"checkpoint {directory} fails verification: the manifest "
                                  f"lists {rel!r}, outside the folder")
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            with _open_listed(directory, rel) as f, out.open("wb") as w:
                size, bad = stream_check(f, entry, manifest.chunk_bytes, w.write)
        except FileNotFoundError as e:
            raise CheckpointError(f"checkpoint {directory} fails verification: {rel} is "
                                  "listed in the manifest but missing") from e
        if size != entry.size or bad is not None:
            raise CheckpointError(
                f"checkpoint {directory} fails verification: {rel} does not match the "
                "manifest's size and BLAKE3 digests: it was modified after it was committed")
    write_manifest_file(dest, manifest)
    return manifest
