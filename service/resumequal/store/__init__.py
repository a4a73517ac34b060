"""The store: object layout and I/O against ``file://`` and ``s3://`` stores.

Everything a run keeps — checkpoints, traces, beacons, verdicts, reports — is an object
under one root URI, addressed by a relative string key. This package owns how keys map to
files or S3 objects, atomic writes, transfers, sha256 checks, append-only line logs
(:mod:`resumequal.store.log`) and the translation of OS and botocore failures into
:mod:`resumequal.store.errors`. It must not know about torch, training or the checkpoint
format: callers decide what the keys mean.

What differs between media is asked of the store, never of its URI scheme: whether other
machines reach it (``shared``), and whether its objects are files in a folder on this
machine (``local_folder``), which allows a rename commit. A new kind of store is one
module here holding one class that declares its scheme and registers itself
(:mod:`resumequal.store.registry`); :func:`open_store` and the spec find it there.

Importing the package loads no store SDK: the spec imports its S3 settings
(:mod:`resumequal.store.s3settings`), and :class:`~resumequal.store.s3.S3Store` (with
botocore) loads when the registry first looks a scheme up.

    store = open_store("s3://bucket/runs", S3Config(endpoint_url="http://minio:9000"))
    digest = store.put_file("ns/run/uid/control/checkpoints/step-00000004/dcp/0.distcp", path)
"""

from __future__ import annotations

from urllib.parse import urlparse

from resumequal.errors import StoreError
from resumequal.store.base import ObjectInfo, Store, sha256_file
from resumequal.store.errors import (
    StoreAccessDenied,
    StoreIntegrityError,
    StoreNotFound,
    StoreObjectTooLarge,
    StoreUnavailable,
)
from resumequal.store.file import FileStore
from resumequal.store.registry import register, schemes, store_class, supported
from resumequal.store.s3settings import (
    ADDRESSING_STYLE_ENV,
    SIGN_PAYLOADS_ENV,
    S3Config,
    s3_config,
)

__all__ = [
    "ADDRESSING_STYLE_ENV",
    "SIGN_PAYLOADS_ENV",
    "FileStore",
    "ObjectInfo",
    "S3Config",
    "Store",
    "StoreAccessDenied",
    "StoreError",
    "StoreIntegrityError",
    "StoreNotFound",
    "StoreObjectTooLarge",
    "StoreUnavailable",
    "open_store",
    "register",
    "s3_config",
    "schemes",
    "sha256_file",
]


def open_store(uri: str, s3: S3Config | None = None) -> Store:
    """The store at ``uri``: a path, or a URI of a registered scheme (``file:///abs/path``,
    ``s3://bucket[/prefix]``, ...).

    ``s3`` configures how an ``s3://`` store is reached and is ignored by the others.
    """
    scheme = urlparse(uri).scheme if "://" in uri else FileStore.scheme
    found = store_class(scheme)
    if found is None:
        raise StoreError(
            f"store {uri!r}: scheme {scheme!r} is not supported; use a path or "
            f"{supported()} (MinIO and Ceph RGW through S3Config.endpoint_url)"
        )
    return found.open(uri, s3)
