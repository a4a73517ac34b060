"""The ``Store`` protocol, object keys, the sha256 checks every store shares, and what the
object stores (a bucket and a prefix) share.

A store is a flat namespace of objects under one root URI. Keys are relative, ``/``
separated strings (``ns/run/uid/control/checkpoints/step-00000004/manifest.json``); there
are no folders, only keys that share a prefix. A prefix always names a folder: ``a/b``
and ``a/b/`` both mean every key under ``a/b/``, never ``a/bc`` — so deleting
``step-00000005`` cannot take ``step-00000005+1`` with it.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import os
import uuid
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import BinaryIO, ClassVar, Protocol, Self
from urllib.parse import urlparse

from typing_extensions import Buffer

from resumequal.errors import StoreError
from resumequal.store.errors import StoreIntegrityError

CHUNK = 1 << 20
# Suffix of the temporary files writes and downloads go through; never listed as a key.
TMP_SUFFIX = ".rqtmp"

LocalPath = str | os.PathLike[str]


@dataclass(frozen=True, order=True)
class ObjectInfo:
    """One object: its key relative to the store's root, and its size in bytes."""

    key: str
    size: int


class ObjectWriter(Protocol):
    """One object written as a stream: hashed as it is written, visible only once closed.

    ``close`` makes the object exist (as a whole, atomically) and returns the sha256 (hex)
    of every byte written; ``abort`` (or an error) leaves no object and no partial one.
    """

    def write(self, data: Buffer) -> int:
        """Append ``data`` (copied before this returns); its length."""
        ...

    def tell(self) -> int:
        """Bytes written so far."""
        ...

    def close(self) -> str:
        """Make the object exist; the sha256 (hex) of its bytes."""
        ...

    def abort(self) -> None:
        """Drop what was written; the object is left as it was. Never raises."""
        ...


class Store(Protocol):
    """Objects under one root URI (a local folder or ``s3://bucket/prefix``)."""

    def uri(self, key: str = "") -> str:
        """The full URI of ``key`` (the root itself for ``""``), for messages and reports."""
        ...

    def put_bytes(self, key: str, data: bytes, *, sync: bool = True) -> None:
        """Write ``data`` as ``key``, replacing what was there; readers see old or new.

        ``sync=False``: the object must outlive the writer (a SIGKILL) but not the machine,
        as a trace segment: a folder then skips the fsyncs that cost milliseconds a write.
        """
        ...

    def put_new(self, key: str, data: bytes) -> bool:
        """Write ``data`` as ``key`` only if there is no such object; True if written.

        Exclusive: an exclusive create in a folder, a conditional put (If-None-Match) on
        S3. Only where an endpoint has no conditional writes (it answers 501) may two
        writers racing both write.
        """
        ...

    def put_file(self, key: str, local_path: LocalPath) -> str:
        """Upload a local file as ``key``; returns the sha256 (hex) of what was uploaded.

        A file that already is ``key`` (a folder store's own file) is left as it is.
        """
        ...

    def writer(self, key: str) -> ObjectWriter:
        """A stream that writes ``key`` (replacing it once closed), for content produced
        piece by piece: no local copy first, and the sha256 taken on the way."""
        ...

    def get_bytes(self, key: str, max_bytes: int | None = None) -> bytes:
        """The content of ``key``; :class:`StoreNotFound` naming the key if it is missing,
        :class:`StoreObjectTooLarge` (having read at most ``max_bytes + 1`` bytes) if it
        holds more than ``max_bytes``."""
        ...

    def get_range(self, key: str, offset: int, out: Buffer) -> int:
        """Read bytes of ``key`` from ``offset`` into ``out`` (at most ``len(out)``); how
        many, fewer only where the object ends. :class:`StoreNotFound` naming the key if
        it is missing."""
        ...

    def get_file(self, key: str, local_path: LocalPath, expect_sha256: str | None = None) -> str:
        """Download ``key`` to ``local_path`` (parents created); returns its sha256.

        With ``expect_sha256``, a mismatch raises :class:`StoreIntegrityError` naming the
        key and leaves nothing at ``local_path``.
        """
        ...

    def exists(self, key: str) -> bool:
        """Whether ``key`` is an object (a folder prefix is not)."""
        ...

    def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        """Every object under the folder ``prefix``, recursively, sorted by key."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key``; removing a missing key is not an error."""
        ...

    def delete_prefix(self, prefix: str) -> int:
        """Remove every object under the folder ``prefix``; returns how many there were."""
        ...

    def delete_all(self) -> int:
        """Remove every object under the root (the root itself too, where it is a folder);
        returns how many there were."""
        ...

    def child(self, name: str) -> Store:
        """The store rooted at the folder ``name`` under this one, reached the same way."""
        ...

    def local_folder(self) -> str | None:
        """The folder on this machine holding the objects as files, or None when they are
        reachable only through the store (an object store: no rename, no append)."""
        ...

    def shared(self) -> bool:
        """Whether processes on other machines reach these objects through the same URI
        (an object store), rather than only processes on this machine (a folder)."""
        ...


class LocalFileWriter:
    """An :class:`ObjectWriter` whose bytes go to a local file first, hashed and counted on
    the way; a store's subclass makes the object of the file at ``close`` (:meth:`_commit`)
    and drops it on ``abort`` (:meth:`_discard`)."""

    def __init__(self, uri: str, file: BinaryIO) -> None:
        self._uri = uri
        self._file: BinaryIO | None = file
        self._hash = hashlib.sha256()
        self._size = 0

    def _errors(self) -> AbstractContextManager[None]:
        """Where the file's own errors become the store's (none by default)."""
        return contextlib.nullcontext()

    def _commit(self, file: BinaryIO) -> None:
        """Make the object of ``file`` (closing it)."""
        raise NotImplementedError

    def _discard(self) -> None:
        """Drop what the file held (it is closed already); never raises."""

    def write(self, data: Buffer) -> int:
        if self._file is None:
            raise ValueError(f"{self._uri}: write after close or abort")
        view = memoryview(data).cast("B")
        self._hash.update(view)
        with self._errors():
            self._file.write(view)
        self._size += len(view)
        return len(view)

    def tell(self) -> int:
        return self._size

    def close(self) -> str:
        if self._file is None:
            raise ValueError(f"{self._uri}: closed or aborted already")
        file, self._file = self._file, None
        self._commit(file)
        return self._hash.hexdigest()

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._discard()


@dataclass(frozen=True)
class BucketPath:
    """Where an object store's objects live: ``scheme://bucket[/prefix]``."""

    scheme: str
    bucket: str
    prefix: str

    @classmethod
    def parse(cls, uri: str, scheme: str, owner: str) -> BucketPath:
        """The bucket and prefix of ``uri``; StoreError naming ``owner`` (the store's
        class) when it is no ``scheme://bucket[/prefix]``."""
        parsed = urlparse(uri)
        if parsed.scheme != scheme or not parsed.netloc:
            raise StoreError(f"{uri!r}: {owner} takes {scheme}://bucket[/prefix]")
        if parsed.query or parsed.fragment:
            raise StoreError(f"{uri!r}: a store URI has no query or fragment")
        prefix = parsed.path.strip("/")
        if prefix:
            check_key(prefix)
        return cls(scheme, parsed.netloc, prefix)

    def uri(self, key: str = "") -> str:
        """The URI of ``key`` (the root for ``""``)."""
        path = "/".join(p for p in (self.prefix, key and check_key(key)) if p)
        return f"{self.scheme}://{self.bucket}/{path}"

    def name(self, key: str) -> str:
        """The object name of ``key`` in the bucket."""
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key


class BucketStore:
    """The part of a :class:`Store` over ``scheme://bucket[/prefix]`` that is the same
    whatever the service: its URIs, listing by key, deleting the root's objects, and
    being reached alike from every machine. A subclass makes the requests."""

    scheme: ClassVar[str]
    example: ClassVar[str]

    @classmethod
    def authority_problem(cls, authority: str) -> str | None:
        """What is wrong with a URI's authority: a bucket store's names its bucket."""
        return None if authority else f"a {cls.scheme}:// URI names a bucket ({cls.example})"

    def __init__(self, uri: str) -> None:
        self._where = BucketPath.parse(uri, self.scheme, type(self).__name__)
        self.bucket, self.prefix = self._where.bucket, self._where.prefix

    def _at(self, uri: str) -> Self:
        """The store at ``uri``, in the same bucket, reached as this one is."""
        raise NotImplementedError

    def _names(self, prefix: str, key: str) -> Iterable[tuple[str, int]]:
        """Every object whose name starts with ``prefix``, with its size; errors name
        ``key``."""
        raise NotImplementedError

    def delete(self, key: str) -> None:
        """Remove ``key``: the service's own request."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri()!r})"

    def uri(self, key: str = "") -> str:
        return self._where.uri(key)

    def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        base = folder(prefix)
        root = f"{self.prefix}/" if self.prefix else ""
        found = []
        for name, size in self._names(root + base, base.rstrip("/")):
            key = name[len(root) :]
            if key and not key.endswith("/"):  # "folder" markers made by consoles
                found.append(ObjectInfo(key, size))
        return sorted(found)

    def delete_prefix(self, prefix: str) -> int:
        # One request an object: a service that deletes in batches (S3) does better.
        keys = [o.key for o in self.list(deletable(prefix))]
        for key in keys:
            self.delete(key)
        return len(keys)

    def delete_all(self) -> int:
        if not self.prefix:
            raise ValueError(f"{self.uri()}: delete_all would empty the whole bucket")
        return self._at(f"{self.scheme}://{self.bucket}").delete_prefix(self.prefix)

    def child(self, name: str) -> Self:
        return self._at(self.uri(name))

    def local_folder(self) -> None:
        return None

    def shared(self) -> bool:
        return True


def check_key(key: str) -> str:
    """``key`` if it is a well-formed relative key, else ``ValueError`` saying why."""
    parts = key.split("/")
    if not key or any(p in ("", ".", "..") for p in parts):
        raise ValueError(
            f"store key {key!r}: a key is a relative path of non-empty segments without "
            "'.' or '..' (no leading, trailing or double '/')"
        )
    if parts[-1].endswith(TMP_SUFFIX):
        raise ValueError(f"store key {key!r}: the suffix {TMP_SUFFIX!r} is reserved")
    return key


def folder(prefix: str) -> str:
    """The folder form of a prefix: ``""`` for the root, else ``"a/b/"``."""
    stripped = prefix.rstrip("/")
    return "" if not stripped else check_key(stripped) + "/"


def deletable(prefix: str) -> str:
    """The folder form of ``prefix``, which must name a folder: emptying a whole store is
    ``delete_all``'s to do, never ``delete_prefix('')``'s."""
    base = folder(prefix)
    if not base:
        raise ValueError("delete_prefix('') would empty the whole store; name a folder")
    return base


def sha256_file(path: LocalPath) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def tmp_sibling(path: str) -> str:
    """A fresh temporary name next to ``path``, so that a rename onto it is atomic."""
    parent, name = os.path.split(path)
    return os.path.join(parent, f".{name}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}")


def download_verified(
    uri: str,
    local_path: LocalPath,
    expect_sha256: str | None,
    fetch: Callable[[str], str | None],
) -> str:
    """Fetch into a temporary sibling of ``local_path``, check its sha256, rename it in place.

    ``fetch(tmp)`` writes the object to ``tmp`` and returns its sha256 if it hashed while
    writing (else ``None``, and the file is hashed here). On any failure, including a
    mismatch, the temporary file is removed and nothing appears at ``local_path``.
    """
    dest = os.path.abspath(os.fspath(local_path))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = tmp_sibling(dest)
    try:
        digest = fetch(tmp) or sha256_file(tmp)
        if expect_sha256 is not None and digest != expect_sha256.lower():
            # A copy left from an earlier download must not pass for a verified one either.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(dest)
            raise StoreIntegrityError(
                f"{uri}: sha256 {digest[:16]}… does not match the expected "
                f"{expect_sha256[:16]}…; the object was modified or corrupted, and the "
                f"downloaded copy was deleted"
            )
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return digest
