"""Checkpoints on an object store (``s3://``), which has no rename: a marker commits them.

Object layout under the leg's prefix (``<store>/<leg>/checkpoints/``)::

    step-00000004/dcp/.metadata, dcp/__<rank>_<i>.distcp, rank-<rank>.json
    step-00000004/manifest.json     every file above with its size and BLAKE3 digests
    step-00000004/manifest.hmac     the manifest's MAC under the checkpoint key
    step-00000004/COMMITTED         written last: only a prefix holding it is a checkpoint

Every rank sends its DCP shards to the store while DCP writes them
(:mod:`resumequal.checkpoint.streaming`: hashed and uploaded in parallel parts, no local
copy), then uploads the few other files it wrote into a local staging folder (DCP's
``.metadata``, its rank state) and reports every file's size and chunk digests; rank 0
uploads the manifest, then ``COMMITTED``. A kill or an endpoint failure anywhere before
the marker leaves a prefix without one: never listed as committed, deleted at the next
start. Resuming copies nothing: each rank fetches just the chunks holding what it loads,
in ranged GETs (:class:`StoreSource`, several at once), each checked against the manifest
before DCP sees a byte of it (:mod:`resumequal.checkpoint.reading`); the comparator reads
the final checkpoints the same way (:meth:`RemoteRoot.final`). The manifest itself is
authenticated (:func:`resumequal.checkpoint.manifest.authenticate`) before anything it
lists is listed or read.

This module does the store side; :mod:`resumequal.checkpoint.manager` runs the
collectives around it.
"""

from __future__ import annotations

import logging
import re
import shutil
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch.distributed.checkpoint as dcp

from resumequal.checkpoint import layout
from resumequal.checkpoint.layout import MANIFEST, MANIFEST_MAC, Position
from resumequal.checkpoint.manifest import (
    MAC_BYTES,
    MANIFEST_BYTES,
    CheckpointInfo,
    FileEntry,
    Manifest,
    Owned,
    authenticate,
    check_sizes,
    entry_of,
    make_manifest,
    signed,
)
from resumequal.checkpoint.reading import VerifiedCheckpoint
from resumequal.checkpoint.streaming import StreamingWriter
from resumequal.errors import CheckpointError, CheckpointMissing, StoreError
from resumequal.store import ObjectInfo, Store, StoreNotFound, regular
from resumequal.store.base import TMP_SUFFIX

log = logging.getLogger(__name__)

COMMITTED = "COMMITTED"
# Files of one rank uploaded at once; each large file also moves
# S3Config.max_concurrency parts at once.
_FILES_AT_ONCE = 4
# Chunks of one file a resuming rank fetches (and hashes) at once, in ranged GETs.
_RANGES_AT_ONCE = 8
# The objects of a checkpoint that are not listed in its manifest.
_UNLISTED = frozenset({MANIFEST, MANIFEST_MAC, COMMITTED})
_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")
_RANK_STATE = re.compile(r"^rank-(\d+)\.json$")


@dataclass(frozen=True)
class RemoteRoot(Owned):
    """Where one leg's checkpoints live on an object store, and its local working folder.

    ``local`` holds the staging folders of saves (loads read the store where it lies); it
    is scratch space, never a source of truth.
    """

    store: Store
    prefix: str
    local: Path
    # Staged files are scratch: the uploaded objects are the durable copy (a kill before
    # the marker leaves garbage either way), so no fsync of every shard.
    durable_staging = False

    @property
    def scratch(self) -> Path:
        return self.local

    def key(self, name: str, rel: str = "") -> str:
        return "/".join(p for p in (self.prefix, name, rel) if p)

    def uri(self, name: str = "", rel: str = "") -> str:
        return self.store.uri(self.key(name, rel))

    def prepare(self, name: str) -> None:
        """Remove an earlier checkpoint called ``name``: objects cannot be renamed over.

        One listing finds none, as at almost every save; only one that is there costs
        the deletes (marker first, see :func:`clear`).
        """
        if self.store.list(self.key(name)):
            clear(self, name)

    def writer(self, name: str, staging: Path) -> StreamingWriter:
        """A DCP writer that sends this rank's shards of ``name`` while writing them."""
        return StreamingWriter(staging, self.store, lambda rel: self.key(name, rel))

    def publish(self, name: str, staging: Path, rank: int, writer: dcp.FileSystemWriter,
                state: FileEntry) -> dict[str, FileEntry]:
        """Upload this rank's staged files; with the shards ``writer`` sent, their
        entries for the manifest (the rank state's is the bytes uploaded)."""
        sent = writer.sent if isinstance(writer, StreamingWriter) else {}
        return upload(self, name, staging, rank, sent)

    def commit(self, staging: Path, position: Position, files: dict[str, FileEntry], *,
               world_size: int, attempt: int, info: CheckpointInfo) -> None:
        """Upload the manifest of every rank's files, then ``COMMITTED``."""
        if self.leg is not None:
            info = {**info, "leg": self.leg}  # the manifest names the leg it is filed under
        commit(self, make_manifest(position, files, world_size=world_size, attempt=attempt,
                                   info=info, run=self.run))

    def retire(self, keep_last: int) -> None:
        retire(self, keep_last)

    def collect_garbage(self) -> list[str]:
        return collect_garbage(self)

    def newest_verified(self, world_size: int | None) -> str | None:
        try:
            return newest_verified(self, world_size)
        except (StoreError, CheckpointError) as e:
            raise CheckpointError(f"cannot resume from {self.uri()}: {e}") from e

    def open(self, name: str, rank: int) -> VerifiedCheckpoint:
        """Committed checkpoint ``name`` where it lies, read through its authenticated
        manifest: each chunk fetched in a ranged read and checked before it is used."""
        if not self.store.exists(self.key(name, COMMITTED)):
            raise CheckpointMissing(
                f"{self.uri(name)} is not a committed checkpoint (no {COMMITTED})")
        manifest = read_manifest(self, name)
        return VerifiedCheckpoint(StoreSource(self, name), manifest, self.uri(name))

    def final(self, name: str) -> VerifiedCheckpoint:
        """Committed checkpoint ``name`` where it lies, its listing checked: each chunk
        fetched in a ranged read and checked before it is used."""
        position = Position.parse(name)
        if position is None:
            raise CheckpointMissing(f"{self.uri(name)} is not a checkpoint's name")
        checkpoint = self.open(name, 0)
        check_objects(self, name, checkpoint.manifest, _listing(self).get(position, {}))
        return checkpoint


class _StoreObject:
    def __init__(self, root: RemoteRoot, name: str, rel: str) -> None:
        self._store, self._key = root.store, root.key(name, rel)
        self._where = root.uri(name)

    def read_into(self, offset: int, out: memoryview) -> int:
        try:
            return self._store.get_range(self._key, offset, out)
        except StoreError as e:
            raise CheckpointError(f"checkpoint {self._where} cannot be read: {e}") from e

    def prefetch(self, offset: int, length: int) -> None:
        """Ranges are fetched several at once already (StoreSource.parallel)."""

    def close(self) -> None:
        """Nothing held between reads."""


@dataclass(frozen=True)
class StoreSource:
    """Checkpoint ``name`` of ``root`` as a :class:`~resumequal.checkpoint.reading.Source`:
    ranged reads of its objects, ``parallel`` at once. A missing object or a short one is
    found at its first read (its size was checked against the listing by whoever chose
    the checkpoint)."""

    root: RemoteRoot
    name: str
    parallel: int = _RANGES_AT_ONCE

    def open(self, rel: str, size: int) -> _StoreObject:
        return _StoreObject(self.root, self.name, rel)


def own_files(staging: Path, rank: int) -> list[str]:
    """The files of a staging folder that ``rank`` wrote, relative to it.

    Its DCP shards ``dcp/__<rank>_*.distcp`` and ``rank-<rank>.json``; rank 0 also owns
    what no rank's name claims (DCP's ``.metadata``, written by the coordinator). A link
    or anything but a regular file there is refused (OSError).
    """
    mine = []
    for rel in regular.regular_sizes(staging.parent, staging.name):
        name = rel.rpartition("/")[2]
        if name.startswith(".") and name.endswith((".tmp", TMP_SUFFIX)):
            continue
        m = _SHARD.match(name) or _RANK_STATE.match(name)
        owner = int(m.group(1)) if m is not None else 0
        if owner == rank:
            mine.append(rel)
    return mine


def upload(root: RemoteRoot, name: str, staging: Path, rank: int,
           sent: dict[str, FileEntry] | None = None) -> dict[str, FileEntry]:
    """Upload this rank's files of ``staging`` under checkpoint ``name``; their entries,
    with those of the files ``sent`` already (streamed while DCP wrote them).

    Each file is read once (DCP's ``.metadata`` or a rank state: small) and its entry taken
    from the very bytes uploaded. Files go up side by side, so the small ones cost no
    round trips after one another.
    """

    def one(rel: str) -> tuple[str, FileEntry]:
        data = regular.read_file(staging.parent, f"{staging.name}/{rel}")
        root.store.put_bytes(root.key(name, rel), data)
        return rel, entry_of(data)

    entries = dict(sent or {})
    files = [rel for rel in own_files(staging, rank) if rel not in entries]
    if len(files) <= 1:
        entries.update(one(rel) for rel in files)
    else:
        with ThreadPoolExecutor(max_workers=min(_FILES_AT_ONCE, len(files))) as pool:
            entries.update(pool.map(one, files))
    return entries


def clear(root: RemoteRoot, name: str) -> None:
    """Remove checkpoint ``name``, committed or not: the marker first, so a kill halfway
    leaves an uncommitted prefix (garbage) rather than a committed torn one."""
    root.store.delete(root.key(name, COMMITTED))
    root.store.delete_prefix(root.key(name))


def commit(root: RemoteRoot, manifest: Manifest) -> None:
    """Upload the manifest and its MAC side by side, then, once both are stored, the
    marker that makes the checkpoint exist."""
    data, mac = signed(manifest)
    with ThreadPoolExecutor(max_workers=1) as pool:
        mac_sent = pool.submit(root.store.put_bytes, root.key(manifest.name, MANIFEST_MAC),
                               mac)
        root.store.put_bytes(root.key(manifest.name, MANIFEST), data)
        mac_sent.result()
    root.store.put_bytes(root.key(manifest.name, COMMITTED), b"")


def _by_checkpoint(objects: list[ObjectInfo], prefix: str) -> dict[Position, dict[str, int]]:
    """Listed objects grouped per checkpoint name: position -> relative key -> size."""
    out: dict[Position, dict[str, int]] = defaultdict(dict)
    for obj in objects:
        name, _, rel = obj.key[len(prefix) + 1 :].partition("/")
        pos = Position.parse(name)
        if pos is not None and rel:
            out[pos][rel] = obj.size
    return out


def _listing(root: RemoteRoot) -> dict[Position, dict[str, int]]:
    return _by_checkpoint(root.store.list(root.prefix), root.prefix)


def committed(root: RemoteRoot) -> list[Position]:
    """Committed checkpoints (prefixes holding ``COMMITTED``), oldest first."""
    return sorted(pos for pos, objs in _listing(root).items() if COMMITTED in objs)


def collect_garbage(root: RemoteRoot) -> list[str]:
    """Delete every checkpoint prefix without a ``COMMITTED`` marker; their names.

    Also the first request of a leg to the store, so a missing bucket, wrong credentials
    or an unreachable endpoint stop the leg here, before any training.
    """
    removed = []
    for pos, objs in sorted(_listing(root).items()):
        if COMMITTED not in objs:
            root.store.delete_prefix(root.key(pos.name))
            removed.append(pos.name)
            log.warning("removed uncommitted checkpoint %s", root.uri(pos.name))
    shutil.rmtree(root.local / layout.STAGING_DIR, ignore_errors=True)
    return removed


def retire(root: RemoteRoot, keep_last: int) -> None:
    """Keep the newest ``keep_last`` committed checkpoints."""
    for pos in committed(root)[:-keep_last]:
        clear(root, pos.name)
        log.info("retention: removed %s", root.uri(pos.name))


def read_manifest(root: RemoteRoot, name: str) -> Manifest:
    """The authenticated manifest of checkpoint ``name``; CheckpointError naming it."""
    where = root.uri(name)
    data = root.store.get_bytes(root.key(name, MANIFEST), MANIFEST_BYTES)
    try:
        mac: bytes | None = root.store.get_bytes(root.key(name, MANIFEST_MAC), MAC_BYTES)
    except StoreNotFound:
        mac = None
    manifest = authenticate(data, mac, where, leg=root.leg, run=root.run)
    if manifest.name != name:
        raise CheckpointError(
            f"checkpoint {where} is refused: its manifest is the one of {manifest.name}"
        )
    return manifest


def newest_verified(root: RemoteRoot, world_size: int | None) -> str | None:
    """The newest committed checkpoint, its manifest checked against the listing.

    Every object the manifest names is there with its size, and nothing else is; the
    contents are checked against the manifest's BLAKE3 digests as they are read.
    """
    listing = _listing(root)
    positions = sorted(pos for pos, objs in listing.items() if COMMITTED in objs)
    if not positions:
        return None
    newest = positions[-1]
    name = newest.name
    manifest = read_manifest(root, name)
    check_objects(root, name, manifest, listing[newest])
    if world_size is not None and manifest.world_size != world_size:
        raise CheckpointError(
            f"{root.uri(name)} was written by {manifest.world_size} ranks; this leg has "
            f"{world_size}"
        )
    return name


def check_objects(root: RemoteRoot, name: str, manifest: Manifest,
                  listed: dict[str, int]) -> None:
    """Every object the manifest names is in ``listed`` (object -> size) with its size,
    and nothing else is; their contents are checked as they are read."""
    present = {rel: size for rel, size in listed.items() if rel not in _UNLISTED}
    check_sizes(root.uri(name), manifest, present, "objects")
