"""``S3Store``: objects under ``s3://bucket/prefix`` on AWS S3, MinIO or Ceph RGW.

Credentials come only from the standard AWS chain — ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` (+ ``AWS_SESSION_TOKEN``), a shared profile (``AWS_PROFILE``),
web identity (``AWS_WEB_IDENTITY_TOKEN_FILE`` + ``AWS_ROLE_ARN``, as IRSA sets them), the
container or instance role — never from the settings (:mod:`resumequal.store.s3settings`),
which may be written into specs and reports. botocore retries throttling, 5xx and
connection errors; what still fails is raised as one of :mod:`resumequal.store.errors`,
naming the bucket or key and never a credential or a response body. With
``S3Config.retry_seconds`` (a worker's), a request that still fails for want of the
endpoint is made again for that long (:mod:`resumequal.store.patience`).

S3 has no rename: a write of one object is atomic (readers see the old or the new
object), but a group of objects is committed by writing a marker last.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import time
from collections.abc import Iterator
from typing import Any, ClassVar, Self

# boto3 ships no type information (no py.typed); its objects are Any here. boto3 itself
# (a tenth of a second) loads with the first client, never for a process that only imports
# this module, as every worker does through the store registry; botocore's exceptions are
# light.
from botocore.exceptions import (  # type: ignore[import-untyped]
    BotoCoreError,
    ClientError,
    ConnectionError,
    CredentialRetrievalError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
)
from typing_extensions import Buffer

from resumequal.errors import StoreError
from resumequal.redact import redact
from resumequal.store.base import (
    CHUNK,
    BucketStore,
    LocalPath,
    deletable,
    download_verified,
)
from resumequal.store.errors import (
    StoreAccessDenied,
    StoreConfigError,
    StoreIntegrityError,
    StoreNotFound,
    StoreUnavailable,
    too_large,
)
from resumequal.store.multipart import PartWriter, copy_file, download, get_range
from resumequal.store.patience import PatientClient
from resumequal.store.registry import register
from resumequal.store.s3settings import S3Config, S3Settings, endpoint_problem, s3_config
from resumequal.store.settings import StoreSettings

log = logging.getLogger(__name__)

MiB = 1 << 20

_DENIED = frozenset(
    {
        "AccessDenied",
        "403",
        "Forbidden",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AllAccessDisabled",
        "AccountProblem",
    }
)
_MISSING = frozenset({"NoSuchKey", "404", "NotFound"})
_CONDITION_FAILED = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})
_THROTTLED = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout"})
# The body that arrived does not match the checksum sent with it (its CRC32, or a signed
# body's sha256): the server stored nothing of it.
_BODY_CHANGED = frozenset({"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch"})


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _status(e: ClientError) -> int:
    return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)




_URI = "resumequal.uri"
_FAILED = "resumequal.failed"


def _warn_on_retries(client: Any, attempts: int) -> None:
    """A WARNING for each retry botocore makes, ``retrying (2/5) GetObject s3://b/k:
    ReadTimeoutError``: its retries are otherwise silent for minutes. The reason is an
    exception's class or an error code and status, never a message or a body (which may
    name the endpoint's userinfo or echo a request)."""
    events = client.meta.events

    def note_uri(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        key = params.get("Key") or params.get("Prefix") or ""
        context[_URI] = f"s3://{params.get('Bucket', '')}/{key}"

    def note_failure(request_dict: dict[str, Any], attempts: int, response: Any = None,
                     caught_exception: Exception | None = None, **_: Any) -> None:
        reason = _retry_reason(response, caught_exception)
        if reason:
            request_dict["context"][_FAILED] = (attempts, reason)

    def announce(request: Any, operation_name: str, **_: Any) -> None:
        # A request made again after a failure noted above is a retry.
        failed = request.context.pop(_FAILED, None)
        if failed is not None:
            done, reason = failed
            log.warning("retrying (%d/%d) %s %s: %s", done + 1, attempts, operation_name,
                        request.context.get(_URI, "s3://"), reason)

    events.register("provide-client-params.s3", note_uri)
    events.register("needs-retry.s3", note_failure)
    events.register("request-created.s3", announce)


def _retry_reason(response: Any, caught: Exception | None) -> str | None:
    """Why an attempt failed, in words safe to log; None when it did not."""
    if caught is not None:
        return type(caught).__name__
    if response is None:
        return None
    http, parsed = response
    status = int(getattr(http, "status_code", 0) or 0)
    if status < 400:
        return None
    code = str((parsed or {}).get("Error", {}).get("Code", ""))
    return f"{code} (HTTP {status})" if code else f"HTTP {status}"


@register
class S3Store(BucketStore):
    """A :class:`~resumequal.store.base.Store` over ``s3://bucket[/prefix]``."""

    scheme: ClassVar[str] = "s3"
    example: ClassVar[str] = "s3://bucket/prefix"
    settings: ClassVar[type[S3Settings]] = S3Settings

    @classmethod
    def open(cls, uri: str, settings: StoreSettings | None, retry_seconds: float) -> S3Store:
        spec = settings if isinstance(settings, S3Settings) else None
        return cls(uri, s3_config(spec, retry_seconds))

    def __init__(self, uri: str, config: S3Config | None = None) -> None:
        super().__init__(uri)
        self.config = config or S3Config()
        c = self.config
        import boto3.session  # type: ignore[import-untyped]
        from botocore.config import Config as BotoConfig  # type: ignore[import-untyped]

        # A session of our own: boto3's default session is shared and not thread-safe.
        session = boto3.session.Session()

        def client(sign: bool) -> Any:
            return session.client(
                "s3",
                endpoint_url=c.endpoint_url,
                region_name=c.region,
                config=BotoConfig(
                    # A patient client (a worker's) makes every attempt itself
                    # (resumequal.store.patience): botocore's jitter would draw from the
                    # random generator the worker's training state holds.
                    retries={"total_max_attempts": 1 if c.retry_seconds > 0 else c.max_attempts,
                             "mode": c.retry_mode},
                    connect_timeout=c.connect_timeout_seconds,
                    read_timeout=c.read_timeout_seconds,
                    # Unset, botocore signs bodies over http and not over https.
                    s3={"addressing_style": c.addressing_style,
                        **({} if sign else {"payload_signing_enabled": False})},
                    max_pool_connections=max(10, c.max_concurrency),
                ),
            )

        for var in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
            # botocore takes these when the settings name no endpoint, and raises a bare
            # ValueError at the client for one it cannot use: said here, by name.
            problem = (None if c.endpoint_url is not None or var not in os.environ
                       else endpoint_problem(os.environ[var], ours=False))
            if problem is not None:
                raise StoreConfigError(f"{var} {problem}")
        self._client: Any = client(c.sign_payloads)
        # Parts carry the checksum botocore computes by default, as boto3's uploads do.
        self._checksums = (
            self._client.meta.config.request_checksum_calculation == "when_supported")
        if not self._checksums and not c.sign_payloads:
            # Nothing would check a body on its way: bodies are signed after all.
            self._client = client(True)
        _warn_on_retries(self._client, c.max_attempts)
        if c.retry_seconds > 0:
            # A worker's requests ride out an outage (resumequal.store.patience).
            self._client = PatientClient(self._client, c.retry_seconds, self.endpoint)
        # Objects up to the threshold (or one part, if that is larger) go in one request.
        self._first_part = max(c.multipart_threshold_mb, c.multipart_chunk_mb) * MiB

    def _at(self, uri: str) -> Self:
        return type(self)(uri, self.config)

    @property
    def endpoint(self) -> str:
        """The endpoint, for messages: userinfo (from ``AWS_ENDPOINT_URL_S3``) redacted."""
        return redact(str(self._client.meta.endpoint_url))

    def _key(self, key: str) -> str:
        return self._where.name(key)

    def _bucket_missing(self) -> bool:
        """Whether the bucket is gone: a HEAD 404 does not say if the key or the bucket is."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError as e:
            return _code(e) in ("404", "NoSuchBucket", "NotFound")
        except BotoCoreError:
            return False
        return False

    def _no_bucket(self, op: str, uri: str) -> StoreNotFound:
        return StoreNotFound(
            f"bucket {self.bucket!r} does not exist (at {self.endpoint}); cannot {op} {uri}"
        )

    def _translate(self, e: Exception, op: str, uri: str) -> StoreError:
        attempts = self.config.max_attempts
        if isinstance(e, ClientError):
            code, status = _code(e), _status(e)
            if code == "NoSuchBucket" or (code in _MISSING and self._bucket_missing()):
                return self._no_bucket(op, uri)
            if code in _MISSING:
                return StoreNotFound(f"{uri} does not exist")
            if code in _DENIED or status == 403:
                return StoreAccessDenied(
                    f"wrong credentials or no permission for {uri} ({op}: {code or status})"
                )
            if code in _BODY_CHANGED:
                return StoreIntegrityError(
                    f"{self.endpoint} refused the bytes sent to {op} {uri}: they do not match "
                    f"the checksum sent with them, so they changed on their way ({code})"
                )
            if status >= 500 or code in _THROTTLED:
                return StoreUnavailable(
                    f"{self.endpoint} kept failing to {op} {uri} ({code or status}) "
                    f"after {attempts} attempts"
                )
            return StoreError(f"cannot {op} {uri}: {code or status}")
        if isinstance(e, ConnectionError | HTTPClientError | IncompleteReadError):
            return StoreUnavailable(
                f"cannot reach {self.endpoint} to {op} {uri} after {attempts} attempts "
                f"({type(e).__name__})"
            )
        if isinstance(e, NoCredentialsError | PartialCredentialsError | CredentialRetrievalError):
            return StoreAccessDenied(
                f"no usable credentials in the AWS chain (env, profile, web identity) to {op} "
                f"{uri} ({type(e).__name__})"
            )
        return StoreError(f"cannot {op} {uri}: {type(e).__name__}")

    @contextlib.contextmanager
    def _call(self, op: str, key: str = "") -> Iterator[None]:
        try:
            yield
        except (BotoCoreError, ClientError) as e:
            raise self._translate(e, op, self.uri(key)) from e

    def put_bytes(self, key: str, data: bytes, *, sync: bool = True) -> None:
        # An acknowledged PUT is durable: ``sync`` changes nothing here.
        with self._call("write", key):
            self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def writer(self, key: str) -> PartWriter:
        c = self.config
        return PartWriter(
            self._client, self.bucket, self._key(key), first_part=self._first_part,
            part_size=c.multipart_chunk_mb * MiB, concurrency=c.max_concurrency,
            checksums=self._checksums,
            errors=lambda: self._call("upload", key))

    def put_file(self, key: str, local_path: LocalPath) -> str:
        path = os.fspath(local_path)
        start = time.perf_counter()
        # Hashed as the parts go out: one read of the file, not a second one for sha256.
        # The source is opened outside the store's error mapping: a missing local file is
        # the caller's FileNotFoundError, not a missing object.
        digest = copy_file(self.writer(key), path, CHUNK)
        elapsed = time.perf_counter() - start
        log.debug("uploaded %s in %.2fs, sha256 %s", self.uri(key), elapsed, digest)
        return digest

    def get_bytes(self, key: str, max_bytes: int | None = None) -> bytes:
        with self._call("read", key):
            response = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            body = response["Body"]
            if max_bytes is None:
                return bytes(body.read())
            # The declared length first, and the read bounded all the same.
            declared = int(response.get("ContentLength") or 0)
            data = b"" if declared > max_bytes else bytes(body.read(max_bytes + 1))
            body.close()
        if declared > max_bytes or len(data) > max_bytes:
            raise too_large(self.uri(key), max_bytes)
        return data

    def get_file(self, key: str, local_path: LocalPath, expect_sha256: str | None = None) -> str:
        full, c = self._key(key), self.config

        def fetch(tmp: str) -> str:
            with self._call("download", key):
                return download(self._client, self.bucket, full, tmp,
                                first_part=self._first_part,
                                part_size=c.multipart_chunk_mb * MiB,
                                concurrency=c.max_concurrency, attempts=c.max_attempts)

        return download_verified(self.uri(key), local_path, expect_sha256, fetch)

    def get_range(self, key: str, offset: int, out: Buffer) -> int:
        view = memoryview(out).cast("B")
        if not view:
            return 0
        with self._call("read", key):
            return get_range(self._client, self.bucket, self._key(key), offset, view,
                             self.config.max_attempts)

    def put_new(self, key: str, data: bytes) -> bool:
        # A conditional create (If-None-Match: *): of two writers racing, one gets 412 (or
        # 409 while the other's write is in flight). An endpoint without conditional
        # writes answers 501: there, look then write.
        with self._call("write", key):
            try:
                self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data,
                                        IfNoneMatch="*")
                return True
            except ClientError as e:
                if _code(e) in _CONDITION_FAILED or _status(e) in (409, 412):
                    return False
                if _code(e) != "NotImplemented" and _status(e) != 501:
                    raise
        if self.exists(key):
            return False
        self.put_bytes(key, data)
        return True

    def exists(self, key: str) -> bool:
        with self._call("look up", key):
            try:
                self._client.head_object(Bucket=self.bucket, Key=self._key(key))
            except ClientError as e:
                if _code(e) not in _MISSING:
                    raise
                if self._bucket_missing():
                    raise self._no_bucket("look up", self.uri(key)) from e
                return False
        return True

    def _names(self, prefix: str, key: str) -> builtins.list[tuple[str, int]]:
        with self._call("list", key):
            return [(str(obj["Key"]), int(obj["Size"]))
                    for page in self._pages(prefix) for obj in page.get("Contents", [])]

    def _pages(self, prefix: str) -> Iterator[dict[str, Any]]:
        """ListObjectsV2's pages of ``prefix``, each one request (each retried as one)."""
        token: dict[str, str] = {}
        while True:
            page = self._client.list_objects_v2(Bucket=self.bucket, Prefix=prefix, **token)
            yield page
            if not page.get("IsTruncated") or not page.get("NextContinuationToken"):
                return
            token = {"ContinuationToken": str(page["NextContinuationToken"])}

    def delete(self, key: str) -> None:
        with self._call("delete", key):
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def delete_prefix(self, prefix: str) -> int:
        base = deletable(prefix)
        keys = [o.key for o in self.list(base)]
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            batch = keys[start : start + 1000]
            with self._call("delete", base.rstrip("/")):
                response = self._client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": self._key(k)} for k in batch], "Quiet": True},
                )
            errors = response.get("Errors", [])
            if errors:
                first = errors[0]
                code = str(first.get("Code", ""))
                uri = f"s3://{self.bucket}/{first.get('Key', '')}"
                message = f"cannot delete {uri} and {len(errors) - 1} more ({code})"
                if code in _DENIED:
                    raise StoreAccessDenied(f"wrong credentials or no permission: {message}")
                raise StoreError(message)
        return len(keys)
