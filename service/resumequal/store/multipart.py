"""S3 transfers in parallel parts, each hashed as its bytes pass: no second read for sha256.

- :class:`PartWriter` uploads an object as it is written: the bytes are hashed on the
  way in, cut into parts and sent, several at once, while the writer produces more. An
  object no larger than one part is one PUT; a larger one a multipart upload, completed
  at ``close`` (only then does the object exist) and aborted on any failure.
- :func:`download` fetches an object in ranged GETs, several at once, writes each part at
  its offset of a local file and hashes the parts in order as they arrive.

Both follow what boto3's s3transfer does on the wire (named beside each behaviour), with
fewer copies: a part is one request body and one read, not a stream of 256 KiB chunks.
Errors are botocore's; :class:`resumequal.store.s3.S3Store` translates them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import re
import socket
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any

from botocore.exceptions import (  # type: ignore[import-untyped]
    ClientError,
    IncompleteReadError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from typing_extensions import Buffer

from resumequal.redact import redact
from resumequal.store.base import ObjectWriter
from resumequal.store.errors import StoreProtocolError

log = logging.getLogger(__name__)

# The default checksum botocore adds to every part when request_checksum_calculation is
# "when_supported" (its default): s3transfer names it on the multipart upload too
# (s3transfer/utils.py set_default_checksum_algorithm), and passes each part's checksum
# back at completion (s3transfer/upload.py UploadPartTask).
_CHECKSUM = "CRC32"
# botocore retries a request, not the reading of its body: a part whose body breaks off is
# fetched again, as s3transfer/utils.py S3_RETRYABLE_DOWNLOAD_ERRORS does.
_BODY_ERRORS = (socket.timeout, OSError, ReadTimeoutError, IncompleteReadError,
                ResponseStreamingError)


class PartWriter:
    """An :class:`~resumequal.store.base.ObjectWriter` for one S3 object.

    At most ``concurrency`` parts are in flight; a ``write`` that fills a part beyond
    that waits for one to finish, so memory stays under ``(concurrency + 1)`` parts.
    """

    def __init__(self, client: Any, bucket: str, key: str, *, first_part: int,
                 part_size: int, concurrency: int, checksums: bool,
                 errors: Callable[[], AbstractContextManager[None]]) -> None:
        """``errors``: the context that turns botocore's errors into the store's."""
        self._client, self._bucket, self._key = client, bucket, key
        self._errors = errors
        self._part_size, self._concurrency = part_size, concurrency
        self._checksums = checksums
        self._hash = hashlib.sha256()
        self._size = 0
        # Part buffers are reused: a fresh one costs a page fault per 4 KiB on first use.
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        self._made = 1
        # The first buffer holds what goes in one PUT; the object becomes a multipart
        # upload (this buffer its first part) only when more comes.
        self._buf = bytearray(first_part)
        self._fill = 0
        self._upload_id: str | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._parts: list[Future[dict[str, Any]]] = []
        self._done = False

    def write(self, data: Buffer) -> int:
        if self._done:
            raise ValueError(f"s3://{self._bucket}/{self._key}: write after close or abort")
        view = memoryview(data).cast("B")
        length = len(view)
        self._hash.update(view)
        self._size += length
        while view:
            if self._fill == len(self._buf):
                with self._errors():
                    self._send_part()
            n = min(len(view), len(self._buf) - self._fill)
            self._buf[self._fill : self._fill + n] = view[:n]
            self._fill += n
            view = view[n:]
        return length

    def tell(self) -> int:
        return self._size

    def _next_buffer(self) -> bytearray:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        if self._made <= self._concurrency:
            self._made += 1
            return bytearray(self._part_size)
        # Every buffer is in flight: each part gives its buffer back, failed or not.
        return self._free.get()

    def _send_part(self) -> None:
        """Send the full buffer as the next part; continue into another buffer."""
        if self._upload_id is None:
            extra = {"ChecksumAlgorithm": _CHECKSUM} if self._checksums else {}
            self._upload_id = str(self._client.create_multipart_upload(
                Bucket=self._bucket, Key=self._key, **extra)["UploadId"])
            self._pool = ThreadPoolExecutor(max_workers=self._concurrency,
                                            thread_name_prefix="rq-s3-upload")
        for part in self._parts:  # a failed part fails the write at once
            if part.done():
                part.result()
        buf, fill = self._buf, self._fill
        number = len(self._parts) + 1
        assert self._pool is not None
        self._parts.append(self._pool.submit(self._upload_part, number, buf, fill))
        self._buf, self._fill = self._next_buffer(), 0

    def _upload_part(self, number: int, buf: bytearray, fill: int) -> dict[str, Any]:
        try:
            body = buf if fill == len(buf) else bytes(memoryview(buf)[:fill])
            extra = {"ChecksumAlgorithm": _CHECKSUM} if self._checksums else {}
            response = self._client.upload_part(
                Bucket=self._bucket, Key=self._key, UploadId=self._upload_id,
                PartNumber=number, Body=body, **extra)
        finally:
            self._free.put(buf)
        part = {"PartNumber": number, "ETag": response["ETag"]}
        if f"Checksum{_CHECKSUM}" in response:
            part[f"Checksum{_CHECKSUM}"] = response[f"Checksum{_CHECKSUM}"]
        return part

    def close(self) -> str:
        if self._done:
            raise ValueError(f"s3://{self._bucket}/{self._key}: closed or aborted already")
        try:
            with self._errors():
                self._complete()
        except BaseException:
            self.abort()
            raise
        self._finish()
        return self._hash.hexdigest()

    def _complete(self) -> None:
        if self._upload_id is None:
            self._client.put_object(Bucket=self._bucket, Key=self._key,
                                    Body=bytes(memoryview(self._buf)[: self._fill]))
            return
        if self._fill:
            self._send_part()
        parts = [p.result() for p in self._parts]
        self._client.complete_multipart_upload(
            Bucket=self._bucket, Key=self._key, UploadId=self._upload_id,
            MultipartUpload={"Parts": parts})

    def abort(self) -> None:
        if self._done:
            return
        self._finish()
        if self._upload_id is not None:
            # Parts of an aborted upload are freed by S3; a kill before this leaves them
            # to the bucket's AbortIncompleteMultipartUpload lifecycle rule.
            try:
                self._client.abort_multipart_upload(
                    Bucket=self._bucket, Key=self._key, UploadId=self._upload_id)
            except Exception as e:  # best effort: the write failed already
                log.warning("could not abort the multipart upload of s3://%s/%s: %s",
                            self._bucket, self._key, type(e).__name__)

    def _finish(self) -> None:
        self._done = True
        self._buf = bytearray()
        if self._pool is not None:
            for part in self._parts:
                part.cancel()
            self._pool.shutdown(wait=True)
            self._pool = None


_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")


def _ranged_answer(client: Any, bucket: str, key: str, start: int, end: int,
                   response: dict[str, Any]) -> tuple[int, int]:
    """How many bytes a ranged GET of bytes ``start..end`` (inclusive) answered, and the
    object's size: a 206 whose ``Content-Range`` starts at ``start``, ends at ``end`` or
    the object's end, and agrees with ``Content-Length``. StoreProtocolError saying what
    the endpoint did otherwise (nothing of its body is read)."""
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    said = str(response.get("ContentRange") or "")
    found = _CONTENT_RANGE.match(said)
    asked = f"a GET of bytes {start}-{end} of s3://{bucket}/{key}"
    endpoint = redact(str(getattr(getattr(client, "meta", None), "endpoint_url", "the endpoint")))
    if status != 206 or found is None:
        answer = (f"HTTP {status} with Content-Range {said[:80]!r}" if said else
                  f"HTTP {status} without a Content-Range: it ignores Range and sends whole "
                  "objects")
        raise StoreProtocolError(f"{endpoint} answered {asked} with {answer}; an S3 "
                                 "endpoint answers 206 with the range asked for")
    first, last, size = (int(g) for g in found.groups())
    declared = response.get("ContentLength")
    if (first != start or last < first or last > end or last >= size
            or (last != end and last != size - 1)
            or (declared is not None and int(declared) != last - first + 1)):
        raise StoreProtocolError(f"{endpoint} answered {asked} with Content-Range "
                                 f"{said[:80]!r} (Content-Length {declared}): not the "
                                 "range asked for")
    return last - first + 1, size


def _get_part(client: Any, bucket: str, key: str, start: int, end: int,
              etag: str | None, attempts: int) -> tuple[bytes, dict[str, Any]]:
    """Bytes ``start..end`` (inclusive) of the object (fewer where it ends), retried when
    the body breaks off; at most what was asked is read, whatever the endpoint sends.

    ``etag``: the object must still be the one the first part came from; a replaced
    object fails with PreconditionFailed (as s3transfer/download.py sends IfMatch).
    """
    extra = {"IfMatch": etag} if etag else {}
    for attempt in range(1, attempts + 1):
        response = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}",
                                     **extra)
        body = response["Body"]
        try:
            length, _ = _ranged_answer(client, bucket, key, start, end, response)
            data = body.read(length)
            if len(data) != length:
                raise IncompleteReadError(actual_bytes=len(data), expected_bytes=length)
            return data, response
        except _BODY_ERRORS as e:
            if attempt == attempts:
                raise
            log.warning("retrying (%d/%d) GetObject s3://%s/%s bytes %d-%d: body broke off (%s)",
                        attempt + 1, attempts, bucket, key, start, end, type(e).__name__)
        finally:
            body.close()  # what the endpoint sent beyond the range is never read
    raise AssertionError("unreachable")


def get_range(client: Any, bucket: str, key: str, offset: int, out: memoryview,
              attempts: int) -> int:
    """Bytes of the object from ``offset`` into ``out``, in one ranged GET (retried when
    the body breaks off); how many, fewer only where the object ends."""
    try:
        data, _ = _get_part(client, bucket, key, offset, offset + len(out) - 1, None,
                            attempts)
    except ClientError as e:
        if str(e.response.get("Error", {}).get("Code", "")) != "InvalidRange":
            raise
        return 0  # ``offset`` is at or past the object's end
    n = len(data)
    out[:n] = memoryview(data)
    return n


def download(client: Any, bucket: str, key: str, path: str, *, first_part: int,
             part_size: int, concurrency: int, attempts: int) -> str:
    """Write the object to the file ``path`` (created or truncated); its sha256 (hex).

    The first ranged GET tells the size and the ETag (s3transfer/download.py
    GetObjectFirstChunkOnDoneCallback); the other parts follow ``concurrency`` at a time,
    each written at its offset by the thread that fetched it, and hashed here in order
    from the bytes received while later parts are still arriving. At most
    ``concurrency`` parts are held.
    """
    h = hashlib.sha256()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            first, response = _get_part(client, bucket, key, 0, first_part - 1, None, attempts)
        except ClientError as e:
            # A range of an empty object is unsatisfiable (s3transfer/download.py treats
            # InvalidRange as an empty object the same way).
            if str(e.response.get("Error", {}).get("Code", "")) != "InvalidRange":
                raise
            return h.hexdigest()
        size = _ranged_answer(client, bucket, key, 0, first_part - 1, response)[1]
        etag = response.get("ETag")

        def fetch(start: int) -> bytes:
            end = min(start + part_size, size) - 1
            data, _ = _get_part(client, bucket, key, start, end, etag, attempts)
            if len(data) != end - start + 1:
                raise IncompleteReadError(actual_bytes=len(data),
                                          expected_bytes=end - start + 1)
            os.pwrite(fd, data, start)
            return data

        starts = iter(range(first_part, size, part_size))
        window: deque[Future[bytes]] = deque()
        with ThreadPoolExecutor(max_workers=concurrency,
                                thread_name_prefix="rq-s3-download") as pool:
            try:
                for start in starts:
                    window.append(pool.submit(fetch, start))
                    if len(window) == concurrency:
                        break
                os.pwrite(fd, first, 0)
                h.update(first)
                del first
                while window:
                    data = window.popleft().result()
                    h.update(data)  # hashlib lets the fetching threads run meanwhile
                    del data
                    start = next(starts, -1)
                    if start >= 0:
                        window.append(pool.submit(fetch, start))
            except BaseException:
                for part in window:
                    part.cancel()
                raise
        return h.hexdigest()
    finally:
        os.close(fd)


def copy_file(writer: ObjectWriter, path: str, chunk: int) -> str:
    """Stream the local file ``path`` through ``writer`` and close it; the sha256."""
    with open(path, "rb") as f:
        buf = bytearray(chunk)
        view = memoryview(buf)
        try:
            while n := f.readinto(buf):
                writer.write(view[:n])
        except BaseException:
            writer.abort()
            raise
    digest: str = writer.close()
    return digest


__all__ = ["PartWriter", "copy_file", "download", "get_range"]
