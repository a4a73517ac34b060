"""Regular files only, below a folder others may write: every open and create of a folder
store's files, and of a folder's checkpoints.

Whoever can write a folder store (the run folder, a shared mount) can plant a symbolic
link, a FIFO or a device where a run opens a file. A link would have the run read, or
overwrite, a file of the attacker's choosing; a FIFO would block an open for ever. So:

- a path is opened from a trusted folder (the store's root) one component at a time, each
  with ``O_NOFOLLOW`` (and ``O_DIRECTORY`` for folders): a link anywhere below the root
  is refused, never followed;
- a file is opened ``O_NONBLOCK`` (a FIFO's open returns at once) and ``fstat`` must say
  it is a regular file before a byte of it is read;
- a file is written under a fresh random name created ``O_CREAT|O_EXCL|O_NOFOLLOW`` (a
  planted name is never written through), then renamed into place, which replaces a link
  at the final name rather than following it.

What is refused raises :class:`NotRegular`, an ``OSError``: callers map it as they map
other OS errors (a store error naming the object, a checkpoint refused by name).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

__all__ = ["NotRegular", "create_file", "make_dirs", "open_dir", "open_file", "open_path",
           "read_fd", "read_file", "regular_sizes", "remove_tree", "rename", "stat_below",
           "unlink", "write_file"]

from resumequal.store.base import TMP_SUFFIX, LocalPath

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class NotRegular(OSError):
    """A path below a trusted folder is a link, a FIFO, a device or a socket."""

    def __init__(self, path: LocalPath, what: str) -> None:
        super().__init__(errno.ELOOP if "link" in what else errno.EINVAL,
                         f"{os.fspath(path)} {what}; refused")


def _parts(rel: LocalPath) -> list[str]:
    parts = [p for p in Path(rel).parts if p not in ("", ".")]
    if not parts or Path(rel).is_absolute() or ".." in parts:
        raise ValueError(f"{os.fspath(rel)!r}: not a relative path below a folder")
    return parts


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    if stat.S_ISFIFO(mode):
        return "is a FIFO, not a regular file"
    if stat.S_ISDIR(mode):
        return "is a folder, not a regular file"
    return "is not a regular file (a device or a socket)"


def _step(fd: int, name: str, shown: Path, create: bool) -> int:
    """The folder ``name`` inside folder ``fd``, opened without following a link."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=fd)
        return _step(fd, name, shown, create=False)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        what = _kind(info.st_mode) if not stat.S_ISREG(info.st_mode) else "is not a folder"
        raise NotRegular(shown, what.replace("not a regular file", "not a folder")) from e


def open_dir(root: LocalPath, rel: LocalPath = "", *, create: bool = False) -> int:
    """A descriptor of the folder ``root/rel``, no component below ``root`` a link
    (``create``: missing folders are made, ``root`` too). FileNotFoundError when one is
    missing."""
    if create:
        os.makedirs(root, exist_ok=True)  # the root is trusted: whoever chose it made it
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    shown = Path(root)
    try:
        for part in ([] if os.fspath(rel) in ("", ".") else _parts(rel)):
            shown = shown / part
            fd, parent = _step(fd, part, shown, create), fd
            os.close(parent)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_dirs(root: LocalPath, rel: LocalPath) -> None:
    """Make the folder ``root/rel`` and its parents, refusing a link below ``root``."""
    os.close(open_dir(root, rel, create=True))


@contextlib.contextmanager
def _parent(root: LocalPath, rel: LocalPath, create: bool = False) -> Iterator[tuple[int, str]]:
    parts = _parts(rel)
    fd = open_dir(root, os.path.join(*parts[:-1]) if len(parts) > 1 else "", create=create)
    try:
        yield fd, parts[-1]
    finally:
        os.close(fd)


def open_file(root: LocalPath, rel: LocalPath) -> int:
    """A read-only descriptor of the regular file ``root/rel``: no link below ``root``, not
    blocking on a FIFO, checked with ``fstat`` before anything is read."""
    shown = Path(root, rel)
    with _parent(root, rel) as (dir_fd, name):
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dir_fd)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise NotRegular(shown, "is a symbolic link") from e
    return _checked(fd, shown)


def open_path(path: LocalPath, *, follow: bool = True) -> int:
    """A read-only descriptor of the regular file at ``path`` (a key file, a log): not
    blocking on a FIFO, checked with ``fstat``; ``follow=False`` refuses a link there."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno != errno.ELOOP or follow:
            raise
        raise NotRegular(path, "is a symbolic link") from e
    return _checked(fd, Path(path))


def _checked(fd: int, shown: Path) -> int:
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):  # as open() says of a folder: no such file
            raise IsADirectoryError(errno.EISDIR, "is a folder", os.fspath(shown))
        if not stat.S_ISREG(info.st_mode):
            raise NotRegular(shown, _kind(info.st_mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int, max_bytes: int | None = None) -> bytes:
    """What is left of ``fd`` (at most ``max_bytes + 1`` bytes with a bound), closed after."""
    with os.fdopen(fd, "rb", buffering=0) as f:
        return f.read() if max_bytes is None else f.read(max_bytes + 1)


def read_file(root: LocalPath, rel: LocalPath, max_bytes: int | None = None) -> bytes:
    """The regular file ``root/rel`` (see :func:`open_file`), at most ``max_bytes + 1``
    bytes of it with a bound (the caller says what more means)."""
    return read_fd(open_file(root, rel), max_bytes)


def stat_below(root: LocalPath, rel: LocalPath) -> os.stat_result | None:
    """``lstat`` of ``root/rel``, its folders below ``root`` no links; None when a part of
    it is missing (or a folder on the way is a link or no folder)."""
    try:
        with _parent(root, rel) as (dir_fd, name):
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError, NotRegular):
        return None


def write_file(root: LocalPath, rel: LocalPath, data: bytes | memoryview, *,
               sync: bool = True, mode: int = 0o644, create: bool = True) -> None:
    """Put ``data`` at ``root/rel`` (folders made as needed, unless not ``create``):
    written under a fresh random name created ``O_EXCL|O_NOFOLLOW``, then renamed into
    place; with ``sync``, the file and the rename made durable."""
    with _parent(root, rel, create=create) as (dir_fd, name):
        tmp = f".{name}.{secrets.token_hex(8)}{TMP_SUFFIX}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb", buffering=0) as f:
                view = memoryview(data).cast("B")
                while view:
                    view = view[f.write(view) or 0:]
                if sync:
                    os.fsync(f.fileno())
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        if sync:
            os.fsync(dir_fd)


def create_file(root: LocalPath, rel: LocalPath, *, mode: int = 0o644) -> int:
    """A descriptor of the new file ``root/rel``, created ``O_EXCL|O_NOFOLLOW`` (folders
    made as needed): FileExistsError when anything, a link included, has that name."""
    with _parent(root, rel, create=True) as (dir_fd, name):
        return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                       | os.O_CLOEXEC, mode, dir_fd=dir_fd)


def rename(root: LocalPath, src: LocalPath, dst: LocalPath) -> None:
    """Rename ``root/src`` to ``root/dst``, their folders below ``root`` no links."""
    with _parent(root, src) as (src_fd, src_name), _parent(root, dst) as (dst_fd, dst_name):
        os.rename(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)


def unlink(root: LocalPath, rel: LocalPath) -> None:
    """Remove ``root/rel`` (a link itself, never what it points to); missing is fine."""
    with contextlib.suppress(FileNotFoundError), _parent(root, rel) as (dir_fd, name):
        os.unlink(name, dir_fd=dir_fd)


def regular_sizes(root: LocalPath, rel: LocalPath = "") -> dict[str, int]:
    """Every file below the folder ``root/rel`` (relative to it, ``/``-separated) with its
    size; NotRegular naming the first link, FIFO, device or socket found there.

    A name gone between the listing and its stat is not there: ranks on one node share a
    staging folder, and another rank's temporary file is renamed while this one lists."""
    top = open_dir(root, rel)
    shown = Path(root, rel)
    found: dict[str, int] = {}
    try:
        for path, dirs, files, dir_fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            for name in (*files, *dirs):
                try:
                    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                entry = os.path.normpath(os.path.join(path, name))
                if stat.S_ISDIR(info.st_mode):
                    continue
                if not stat.S_ISREG(info.st_mode):
                    raise NotRegular(shown / entry, _kind(info.st_mode))
                found[Path(entry).as_posix()] = info.st_size
    finally:
        os.close(top)
    return dict(sorted(found.items()))


def remove_tree(root: LocalPath, rel: LocalPath) -> None:
    """Remove the folder ``root/rel`` and all below it (a link there: the link alone);
    missing is fine. Nothing outside ``root`` is touched."""
    with contextlib.suppress(FileNotFoundError), _parent(root, rel) as (dir_fd, name):
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
