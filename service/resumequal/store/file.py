"""``FileStore``: objects as files under a local folder (a path or a ``file://`` URI).

Every write goes to a fresh sibling (a random name, created ``O_EXCL|O_NOFOLLOW``), is
fsynced, renamed over the target and the folder fsynced: a reader, or a restart after a
kill, sees the old file or the new one, never a torn one. Temporary files end in
``.rqtmp`` and are never listed.

Whoever can write the folder can plant links, FIFOs and devices in it: every path is
opened from the root without following a link, and only regular files are objects
(:mod:`resumequal.store.regular`). A link is never read or written through, a FIFO never
opened blocking, and neither is listed.

A ``file://`` URI is taken literally (``file:///data/my store`` is the folder
``/data/my store``; no percent-decoding), as :mod:`resumequal.checkpoint.layout` does.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import logging
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, BinaryIO, ClassVar, cast
from urllib.parse import urlparse

from typing_extensions import Buffer

from resumequal.errors import StoreError
from resumequal.store import regular
from resumequal.store.base import (
    CHUNK,
    TMP_SUFFIX,
    LocalFileWriter,
    LocalPath,
    ObjectInfo,
    check_key,
    deletable,
    download_verified,
    folder,
    sha256_file,
)
from resumequal.store.errors import StoreAccessDenied, StoreNotFound, too_large
from resumequal.store.registry import register

if TYPE_CHECKING:
    from resumequal.store.settings import StoreSettings

log = logging.getLogger(__name__)

def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _root_dir(root: str) -> tuple[str, str]:
    """(the absolute folder, the URI prefix keys are appended to) for a path or file:// URI."""
    if "://" not in root:
        path = os.path.abspath(root)
        return path, path.rstrip("/")
    parsed = urlparse(root)
    if parsed.scheme != "file":
        raise StoreError(f"{root!r}: FileStore takes a path or a file:// URI")
    if parsed.netloc not in ("", "localhost"):
        raise StoreError(
            f"{root!r}: a file:// URI takes an absolute path (file:///data/store), not a host"
        )
    path = os.path.abspath(parsed.path or "/")
    return path, "file://" + path.rstrip("/")


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the entries of folder ``path`` (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_hashing(src: BinaryIO, dst: BinaryIO) -> str:
    h = hashlib.sha256()
    while chunk := src.read(CHUNK):
        h.update(chunk)
        dst.write(chunk)
    return h.hexdigest()


class _FileWriter(LocalFileWriter):
    """An :class:`~resumequal.store.base.ObjectWriter` into a fresh file beside the
    object's (created ``O_EXCL|O_NOFOLLOW``), renamed over it (after an fsync) at ``close``."""

    def __init__(self, store: FileStore, key: str) -> None:
        self._store, self._key = store, key
        parent, _, name = key.rpartition("/")
        self._tmp = f"{parent}/.{name}.{secrets.token_hex(8)}{TMP_SUFFIX}".lstrip("/")
        with store._errors("write", key):
            file = os.fdopen(regular.create_file(store.root, self._tmp), "wb")
        super().__init__(store.uri(key), file)

    def _errors(self) -> AbstractContextManager[None]:
        return self._store._errors("write", self._key)

    def _commit(self, file: BinaryIO) -> None:
        try:
            with self._errors():
                with file:
                    file.flush()
                    os.fsync(file.fileno())
                regular.rename(self._store.root, self._tmp, self._key)
                fsync_dir(os.path.dirname(self._store._path(self._key)))
        finally:
            self._discard()

    def _discard(self) -> None:
        with contextlib.suppress(OSError):
            regular.unlink(self._store.root, self._tmp)


@register
class FileStore:
    """A :class:`~resumequal.store.base.Store` over a local (or mounted) folder."""

    scheme: ClassVar[str] = "file"
    example: ClassVar[str] = "file:///abs/path"
    settings: ClassVar[None] = None

    @classmethod
    def authority_problem(cls, authority: str) -> str | None:
        return "a file:// store is file:///abs/path (no host)" if authority else None

    @classmethod
    def open(cls, uri: str, settings: StoreSettings | None, retry_seconds: float) -> FileStore:
        return cls(uri)

    def __init__(self, root: str) -> None:
        self.root, self._uri_prefix = _root_dir(root)

    def __repr__(self) -> str:
        return f"FileStore({self.uri()!r})"

    def uri(self, key: str = "") -> str:
        if not key:
            return self._uri_prefix or "/"
        return f"{self._uri_prefix}/{check_key(key)}"

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *check_key(key).split("/"))

    @contextlib.contextmanager
    def _errors(self, op: str, key: str) -> Iterator[None]:
        """Turn OS errors about the store's own files into store errors naming the URI."""
        uri = self.uri(key)
        try:
            yield
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            if op in ("read", "download"):
                raise StoreNotFound(f"{uri} does not exist") from e
            raise StoreError(f"cannot {op} {uri}: {e.strerror}") from e
        except regular.NotRegular as e:
            # Only regular files are objects (as list and exists say): a link or a FIFO
            # planted under an object's name is none.
            if op in ("read", "download"):
                raise StoreNotFound(f"{uri} is no object: {e.strerror}") from e
            raise StoreError(f"cannot {op} {uri}: {e.strerror}") from e
        except PermissionError as e:
            raise StoreAccessDenied(f"no permission to {op} {uri}") from e
        except OSError as e:
            raise StoreError(f"cannot {op} {uri}: {e.strerror}") from e

    def put_bytes(self, key: str, data: bytes, *, sync: bool = True) -> None:
        # The file's data is in the page cache once written: a SIGKILL of this process
        # cannot lose it, a machine crash could (what ``sync`` guards against).
        with self._errors("write", key):
            regular.write_file(self.root, check_key(key), data, sync=sync)

    def put_new(self, key: str, data: bytes) -> bool:
        with self._errors("write", key):
            try:
                fd = regular.create_file(self.root, check_key(key))
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        return True

    def put_file(self, key: str, local_path: LocalPath) -> str:
        if os.path.realpath(local_path) == os.path.realpath(self._path(key)):
            return sha256_file(local_path)
        # The source is opened outside the store's error mapping: a missing local file is
        # the caller's FileNotFoundError, not a missing object.
        with open(local_path, "rb") as src:
            writer = self.writer(key)
            try:
                digest = _copy_hashing(src, cast(BinaryIO, writer))
            except BaseException:
                writer.abort()
                raise
            writer.close()
        log.debug("put %s sha256 %s", self.uri(key), digest)
        return digest

    def writer(self, key: str) -> _FileWriter:
        return _FileWriter(self, check_key(key))

    def _open(self, key: str) -> int:
        """A descriptor of object ``key``: a regular file, no link below the root."""
        return regular.open_file(self.root, check_key(key))

    def get_bytes(self, key: str, max_bytes: int | None = None) -> bytes:
        with self._errors("read", key):
            data = regular.read_fd(self._open(key), max_bytes)
        if max_bytes is not None and len(data) > max_bytes:
            raise too_large(self.uri(key), max_bytes)
        return data

    def get_range(self, key: str, offset: int, out: Buffer) -> int:
        view = memoryview(out).cast("B")
        done = 0
        with self._errors("read", key):
            fd = self._open(key)
            try:
                while done < len(view) and (n := os.preadv(fd, [view[done:]], offset + done)):
                    done += n
            finally:
                os.close(fd)
        return done

    def get_file(self, key: str, local_path: LocalPath, expect_sha256: str | None = None) -> str:
        def fetch(tmp: str) -> str:
            with self._errors("download", key), os.fdopen(self._open(key), "rb") as src, \
                    open(tmp, "wb") as dst:
                return _copy_hashing(src, dst)

        return download_verified(self.uri(key), local_path, expect_sha256, fetch)

    def exists(self, key: str) -> bool:
        info = regular.stat_below(self.root, check_key(key))
        return info is not None and stat.S_ISREG(info.st_mode)

    def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        base = folder(prefix)
        found = []
        with self._errors("list", base.rstrip("/")):
            try:
                top = regular.open_dir(self.root, base.rstrip("/"))
            except (FileNotFoundError, NotADirectoryError, regular.NotRegular):
                return []
            try:
                # Only regular files are objects: a link or a FIFO someone planted is none.
                for path, _dirs, files, dir_fd in os.fwalk(".", dir_fd=top):
                    for name in files:
                        if name.endswith(TMP_SUFFIX):
                            continue
                        info = _lstat(name, dir_fd)
                        if info is None or not stat.S_ISREG(info.st_mode):
                            continue
                        rel = os.path.normpath(os.path.join(path, name)).replace(os.sep, "/")
                        found.append(ObjectInfo(base + rel, info.st_size))
            finally:
                os.close(top)
        return sorted(found)

    def delete(self, key: str) -> None:
        with self._errors("delete", key):
            regular.unlink(self.root, check_key(key))

    def delete_prefix(self, prefix: str) -> int:
        base = deletable(prefix)
        count = len(self.list(base))
        with self._errors("delete", base.rstrip("/")):
            regular.remove_tree(self.root, base.rstrip("/"))
        return count

    def delete_all(self) -> int:
        count = len(self.list())
        with self._errors("delete", ""):
            if os.path.isdir(self.root):
                shutil.rmtree(self.root)
        return count

    def child(self, name: str) -> FileStore:
        # A path stays a path and a file:// URI a file:// URI, so URIs read the same.
        return FileStore(self.uri(name))

    def local_folder(self) -> str:
        return self.root

    def shared(self) -> bool:
        # A mounted network folder may be seen elsewhere, but not under a URI we can vouch
        # for: a folder is this machine's.
        return False
