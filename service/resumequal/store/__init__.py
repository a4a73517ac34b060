"""The store: object layout and I/O against ``file://``, ``s3://`` and ``gs://`` stores.

Everything a run keeps — checkpoints, traces, beacons, verdicts, reports — is an object
under one root URI, addressed by a relative string key. This package owns how keys map to
files or objects, atomic writes, transfers, sha256 checks, append-only line logs
(:mod:`resumequal.store.log`), each store's settings (:mod:`resumequal.store.settings`)
and the translation of OS and SDK failures into :mod:`resumequal.store.errors`. It must
not know about torch, training or the checkpoint format: callers decide what the keys
mean.

What differs between media is asked of the store, never of its URI scheme: whether other
machines reach it (``shared``), and whether its objects are files in a folder on this
machine (``local_folder``), which allows a rename commit. A new kind of store is one
module here holding one class that declares its scheme and its settings and registers
itself (:mod:`resumequal.store.registry`), and a settings module beside it; :func:`open_store`
and the spec find it there.

Importing the package loads no store SDK: the spec imports the settings models
(:mod:`resumequal.store.s3settings`, :mod:`resumequal.store.gcssettings`), and the stores
(with botocore, the Cloud Storage client) load when the registry first looks a scheme up.

    store = open_store("s3://bucket/runs", S3Settings(endpoint_url="http://minio:9000"))
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
from resumequal.store.gcssettings import GCSSettings
from resumequal.store.registry import register, schemes, store_class, supported
from resumequal.store.s3settings import S3Config, S3Settings
from resumequal.store.settings import StoreSettings

__all__ = [
    "FileStore",
    "GCSSettings",
    "ObjectInfo",
    "S3Config",
    "S3Settings",
    "Store",
    "StoreAccessDenied",
    "StoreError",
    "StoreIntegrityError",
    "StoreNotFound",
    "StoreObjectTooLarge",
    "StoreSettings",
    "StoreUnavailable",
    "open_store",
    "register",
    "schemes",
    "sha256_file",
]


def open_store(uri: str, settings: StoreSettings | None = None,
               retry_seconds: float = 0.0) -> Store:
    """The store at ``uri``: a path, or a URI of a registered scheme (``file:///abs/path``,
    ``s3://bucket[/prefix]``, ``gs://bucket[/prefix]``, ...).

    ``settings`` configure how a store of their scheme is reached and are ignored by the
    others (a run's settings are its checkpoint store's, its location may be a folder).
    ``retry_seconds``: how long a request the endpoint cannot serve is made again (a
    worker's ``timeouts.backendErrorSeconds``); 0: the settings' attempts alone.
    """
    scheme = urlparse(uri).scheme if "://" in uri else FileStore.scheme
    found = store_class(scheme)
    if found is None:
        raise StoreError(
            f"store {uri!r}: scheme {scheme!r} is not supported; use a path or "
            f"{supported()} (MinIO and Ceph RGW through S3Settings.endpoint_url)"
        )
    own = settings if found.settings is not None and isinstance(settings, found.settings) \
        else None
    return found.open(uri, own, retry_seconds)
