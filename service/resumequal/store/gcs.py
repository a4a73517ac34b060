"""``GCSStore``: objects under ``gs://bucket/prefix`` on Google Cloud Storage (its JSON API)
or an emulator of it (fake-gcs-server).

Credentials come only from Application Default Credentials — ``GOOGLE_APPLICATION_CREDENTIALS``,
gcloud's, workload identity, the metadata server — never from the settings
(:mod:`resumequal.store.gcssettings`), which may be written into specs and reports; an
emulator (``endpointUrl`` or ``STORAGE_EMULATOR_HOST``) is reached without any. What fails
is raised as one of :mod:`resumequal.store.errors`, naming the bucket or key and never a
credential or a response body.

The client's own retries are off: they draw their jitter from Python's global random
generator, which a worker's training state holds. Every request is made again here
instead (:func:`resumequal.store.patience.keep_trying`): ``maxAttempts`` times, or for a
worker's ``retry_seconds``, when it failed for want of the endpoint (a connection refused
or dropped, a timeout, a 5xx, 429).

One object is one upload (atomic: readers see the old or the new object); a stream is
spooled to a local temporary file and uploaded when it is closed, so that a failed
upload can be made again from its start. Cloud Storage has no rename: a group of objects
is committed by writing a marker last, as on S3.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import logging
import tempfile
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any, BinaryIO, ClassVar, Self, TypeVar
from urllib.parse import quote

from typing_extensions import Buffer

from resumequal.errors import StoreError
from resumequal.redact import redact
from resumequal.store.base import (
    BucketStore,
    LocalFileWriter,
    LocalPath,
    check_key,
    download_verified,
    sha256_file,
)
from resumequal.store.errors import (
    StoreAccessDenied,
    StoreIntegrityError,
    StoreNotFound,
    StoreUnavailable,
    too_large,
)
from resumequal.store.gcssettings import GCSSettings, gcs_settings
from resumequal.store.patience import Tries, keep_trying
from resumequal.store.registry import register

if TYPE_CHECKING:
    from resumequal.store.settings import StoreSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

PUBLIC_ENDPOINT = "https://storage.googleapis.com"
_SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)
# Requests at once per store: the parallel writers of one process (a claim raced by many
# threads) without urllib3 discarding connections.
_POOL = 32
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_CLIENT_PACKAGES = frozenset({"google", "requests", "urllib3"})


def _status(e: BaseException) -> int:
    return int(getattr(e, "code", 0) or 0)


def transient(e: BaseException) -> str | None:
    """Why ``e`` says the endpoint could not serve the request (words safe to log: a class
    name and a status, never a message or a body), or None when it answered it."""
    # The SDK loads with the first client; an error reaches here only after one.
    import requests.exceptions
    from google.api_core.exceptions import GoogleAPICallError
    from google.auth.exceptions import TransportError

    if isinstance(e, GoogleAPICallError):
        status = _status(e)
        return f"{type(e).__name__} (HTTP {status})" if status in _TRANSIENT_STATUS else None
    if isinstance(e, requests.exceptions.ConnectionError | requests.exceptions.Timeout
                  | requests.exceptions.ChunkedEncodingError | TransportError):
        return type(e).__name__
    return None


class _HashingFile:
    """A binary file written through, its sha256 taken on the way."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self.hash = hashlib.sha256()

    def write(self, data: Buffer) -> int:
        self.hash.update(data)
        return self._file.write(data)


class _SpooledWriter(LocalFileWriter):
    """An :class:`~resumequal.store.base.ObjectWriter` that spools to a local temporary
    file and uploads it as one object at ``close``."""

    def __init__(self, store: GCSStore, key: str) -> None:
        # Closed at close or abort.
        super().__init__(store.uri(key), tempfile.TemporaryFile())  # noqa: SIM115
        self._store, self._key = store, key

    def _commit(self, file: BinaryIO) -> None:
        with file:
            file.flush()
            self._store._upload(self._key, file)


@register
class GCSStore(BucketStore):
    """A :class:`~resumequal.store.base.Store` over ``gs://bucket[/prefix]``."""

    scheme: ClassVar[str] = "gs"
    example: ClassVar[str] = "gs://bucket/prefix"
    settings: ClassVar[type[GCSSettings]] = GCSSettings

    @classmethod
    def open(cls, uri: str, settings: StoreSettings | None, retry_seconds: float) -> GCSStore:
        own = settings if isinstance(settings, GCSSettings) else None
        return cls(uri, gcs_settings(own), retry_seconds)

    def __init__(self, uri: str, settings: GCSSettings | None = None,
                 retry_seconds: float = 0.0, *, _client: Any = None) -> None:
        super().__init__(uri)
        self.config = settings or GCSSettings()
        self.retry_seconds = retry_seconds
        self.endpoint = redact(self.config.endpoint_url or PUBLIC_ENDPOINT)
        self._timeout = (self.config.connect_timeout_seconds,
                         self.config.read_timeout_seconds)
        if _client is None:
            with self._call("reach", ""):
                _client = self._client_for(self.config)
        self._client = _client
        self._bucket = _client.bucket(self.bucket)
        self._uploads = (f"{self.config.endpoint_url or PUBLIC_ENDPOINT}/upload/storage/v1/b/"
                         f"{quote(self.bucket, safe='')}/o")

    @staticmethod
    def _client_for(settings: GCSSettings) -> Any:
        """A Cloud Storage client: anonymous to an emulator, else with Application Default
        Credentials; a connection pool for parallel requests."""
        import google.auth
        import requests.adapters
        from google.auth.credentials import AnonymousCredentials
        from google.auth.transport.requests import AuthorizedSession
        from google.cloud import storage

        if settings.endpoint_url:
            credentials: Any = AnonymousCredentials()
        else:
            credentials, _ = google.auth.default(scopes=_SCOPES)
        session = AuthorizedSession(credentials)
        for scheme in ("http://", "https://"):
            session.mount(scheme, requests.adapters.HTTPAdapter(pool_maxsize=_POOL))
        options = {"api_endpoint": settings.endpoint_url} if settings.endpoint_url else None
        # No project: objects are reached by bucket, and no bucket is made here.
        client = storage.Client(project=None, credentials=credentials, _http=session,
                                client_options=options)
        # Its bucket metadata cache (for tracing) fetches each bucket in a thread of its own
        # with the library's retries, whose jitter draws from the global generator: off.
        client._bucket_metadata_cache = None
        return client

    def _at(self, uri: str) -> Self:
        return type(self)(uri, self.config, self.retry_seconds, _client=self._client)

    def _blob(self, key: str) -> Any:
        return self._bucket.blob(self._where.name(key))

    # -- errors and retries -------------------------------------------------------------------

    def _tries(self, doing: str, key: str) -> Tries:
        return Tries(self.endpoint, doing, self.uri(key), seconds=self.retry_seconds,
                     attempts=self.config.max_attempts)

    def _request(self, doing: str, key: str, call: Callable[[], T]) -> T:
        """``call()``, made again while the endpoint cannot serve it."""
        return keep_trying(call, transient, self._tries(doing, key))

    def _bucket_missing(self) -> bool:
        """Whether the bucket is gone: a 404 does not say if the object or the bucket is."""
        try:
            return not bool(self._request("look up", "", lambda: self._bucket.exists(
                timeout=self._timeout, retry=None)))
        except Exception:
            return False

    def _no_bucket(self, op: str, uri: str) -> StoreNotFound:
        return StoreNotFound(
            f"bucket {self.bucket!r} does not exist (at {self.endpoint}); cannot {op} {uri}"
        )

    def _translate(self, e: Exception, op: str, uri: str) -> StoreError:
        from google.api_core.exceptions import Forbidden, GoogleAPICallError, NotFound, Unauthorized
        from google.auth.exceptions import DefaultCredentialsError, RefreshError
        from google.cloud.storage.exceptions import DataCorruption

        if isinstance(e, StoreError):
            return e
        if isinstance(e, NotFound):
            return self._no_bucket(op, uri) if self._bucket_missing() \
                else StoreNotFound(f"{uri} does not exist")
        if isinstance(e, Forbidden | Unauthorized):
            return StoreAccessDenied(
                f"wrong credentials or no permission for {uri} ({op}: HTTP {_status(e)})")
        if isinstance(e, DefaultCredentialsError | RefreshError):
            return StoreAccessDenied(
                f"no usable Application Default Credentials to {op} {uri} ({type(e).__name__})")
        if isinstance(e, DataCorruption):
            return StoreIntegrityError(
                f"the bytes of {uri} do not match the checksum {self.endpoint} keeps for "
                f"them ({op}): they changed on their way")
        reason = transient(e)
        if reason is not None:
            return StoreUnavailable(f"cannot reach {self.endpoint} to {op} {uri} after "
                                    f"{self.config.max_attempts} attempts ({reason})")
        if isinstance(e, GoogleAPICallError):
            return StoreError(f"cannot {op} {uri}: HTTP {_status(e)}")
        return StoreError(f"cannot {op} {uri}: {type(e).__name__}")

    @contextlib.contextmanager
    def _call(self, op: str, key: str) -> Iterator[None]:
        try:
            yield
        except StoreError:
            raise
        except Exception as e:
            # The client's errors and its transport's; a local file's is the caller's.
            if type(e).__module__.split(".")[0] not in _CLIENT_PACKAGES:
                raise
            raise self._translate(e, op, self.uri(key)) from e

    # -- writes ---------------------------------------------------------------------------------

    def _media_upload(self, key: str, body: bytes | IO[bytes], *, new: bool = False) -> None:
        """One object in one request (the JSON API's uploadType=media). Not the client's
        uploads: a multipart one draws its boundary from the global random generator, a
        resumable one takes two requests."""
        from google.api_core.exceptions import from_http_response

        params = {"uploadType": "media", "name": self._where.name(key),
                  **({"ifGenerationMatch": "0"} if new else {})}
        response = self._client._http.request(
            "POST", self._uploads, params=params, data=body, timeout=self._timeout,
            headers={"Content-Type": "application/octet-stream"})
        if response.status_code >= 300:
            raise from_http_response(response)

    def put_bytes(self, key: str, data: bytes, *, sync: bool = True) -> None:
        # An acknowledged upload is durable: ``sync`` changes nothing here.
        with self._call("write", key):
            self._request("write", key, lambda: self._media_upload(key, data))

    def put_new(self, key: str, data: bytes) -> bool:
        # A conditional create (ifGenerationMatch=0): of two writers racing, one gets 412.
        from google.api_core.exceptions import PreconditionFailed

        with self._call("write", key):
            try:
                self._request("write", key, lambda: self._media_upload(key, data, new=True))
            except PreconditionFailed:
                return False
        return True

    def _upload(self, key: str, source: IO[bytes]) -> None:
        """Upload the open file ``source`` as ``key``, from its start again on each try."""
        def upload() -> None:
            source.seek(0)
            self._media_upload(key, source)

        with self._call("upload", key):
            self._request("upload", key, upload)

    def put_file(self, key: str, local_path: LocalPath) -> str:
        # The source is opened outside the store's error mapping: a missing local file is
        # the caller's FileNotFoundError, not a missing object.
        with open(local_path, "rb") as src:
            digest = sha256_file(local_path)
            self._upload(key, src)
        log.debug("uploaded %s, sha256 %s", self.uri(key), digest)
        return digest

    def writer(self, key: str) -> _SpooledWriter:
        return _SpooledWriter(self, check_key(key))

    # -- reads ----------------------------------------------------------------------------------

    def _read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        blob = self._blob(key)
        # A range's checksum is not the object's: only a whole read is checked.
        checksum = "auto" if start is None and end is None else None
        return bytes(self._request("read", key, lambda: blob.download_as_bytes(
            start=start, end=end, checksum=checksum, timeout=self._timeout, retry=None)))

    def get_bytes(self, key: str, max_bytes: int | None = None) -> bytes:
        with self._call("read", key):
            if max_bytes is None:
                return self._read(key)
            data = self._ranged(key, 0, max_bytes + 1)
        if len(data) > max_bytes:
            raise too_large(self.uri(key), max_bytes)
        return data

    def _ranged(self, key: str, offset: int, length: int) -> bytes:
        """At most ``length`` bytes from ``offset``; none at or past the object's end."""
        from google.api_core.exceptions import RequestRangeNotSatisfiable

        try:
            return self._read(key, offset, offset + length - 1)
        except RequestRangeNotSatisfiable:
            return b""

    def get_range(self, key: str, offset: int, out: Buffer) -> int:
        view = memoryview(out).cast("B")
        if not view:
            return 0
        with self._call("read", key):
            data = self._ranged(key, offset, len(view))
        view[: len(data)] = data
        return len(data)

    def get_file(self, key: str, local_path: LocalPath, expect_sha256: str | None = None) -> str:
        blob = self._blob(key)

        def fetch(tmp: str) -> str:
            def download() -> str:
                with open(tmp, "wb") as f:  # truncated for each try
                    sink = _HashingFile(f)
                    blob.download_to_file(sink, timeout=self._timeout, retry=None)
                return sink.hash.hexdigest()

            with self._call("download", key):
                return self._request("download", key, download)

        return download_verified(self.uri(key), local_path, expect_sha256, fetch)

    def exists(self, key: str) -> bool:
        blob = self._blob(key)
        with self._call("look up", key):
            found = bool(self._request("look up", key, lambda: blob.exists(
                timeout=self._timeout, retry=None)))
        if not found and self._bucket_missing():
            raise self._no_bucket("look up", self.uri(key))
        return found

    def _names(self, prefix: str, key: str) -> builtins.list[tuple[str, int]]:
        def listing() -> builtins.list[tuple[str, int]]:
            return [(str(blob.name), int(blob.size or 0))
                    for blob in self._client.list_blobs(self.bucket, prefix=prefix,
                                                        timeout=self._timeout, retry=None)]

        with self._call("list", key):
            return self._request("list", key, listing)

    # -- deletes --------------------------------------------------------------------------------

    def delete(self, key: str) -> None:
        from google.api_core.exceptions import NotFound

        blob = self._blob(key)
        with self._call("delete", key):
            try:
                self._request("delete", key, lambda: blob.delete(
                    timeout=self._timeout, retry=None))
            except NotFound:
                if self._bucket_missing():
                    raise self._no_bucket("delete", self.uri(key)) from None


__all__ = ["PUBLIC_ENDPOINT", "GCSStore", "transient"]
