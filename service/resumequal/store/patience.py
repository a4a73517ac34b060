"""Requests that ride out an outage: tried again, with backoff, for a budget of seconds
(:func:`keep_trying`, and :class:`PatientClient`, an S3 client whose every call does).

botocore's attempts (``S3Config.max_attempts``) ride out a few seconds of trouble; a
gateway that refuses connections fails all five in half a second. A worker's request
that fails for want of the endpoint — a connection refused or dropped, a timeout, a 5xx,
throttling — is made again, after ``FIRST_BACKOFF`` seconds, then twice as long each time
up to ``MAX_BACKOFF`` (each wait jittered), until ``S3Config.retry_seconds`` (a leg's
``timeouts.backendErrorSeconds``) have passed since the call began; then
:class:`~resumequal.store.errors.StoreUnavailable` names the endpoint, the object and how
long it kept failing. A request the endpoint answered (a 404, a 403, a 412) is never made
again here. Every wait is logged, naming the object and the reason, never a body.

Such a client makes every attempt itself: botocore's own retries are off for it. They draw
their jitter from Python's global random generator, which a worker's training state holds
(a checkpoint saves it, the trace compares it): one retry of theirs would make two legs
differ where the stack did not. The jitter here comes from a generator of its own. The
Cloud Storage store makes every request through :func:`keep_trying` for the same reason,
its client's retries off.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from botocore.exceptions import (  # type: ignore[import-untyped]
    ClientError,
    ConnectionError,
    HTTPClientError,
)

from resumequal.store.errors import StoreUnavailable

log = logging.getLogger(__name__)

__all__ = ["MAX_BACKOFF", "PatientClient", "Tries", "keep_trying", "transient"]

T = TypeVar("T")

FIRST_BACKOFF = 0.05
# The longest wait between two tries: an endpoint back is used within this.
MAX_BACKOFF = 5.0
# Each wait is this share of its backoff or more, drawn apart from the global generator.
_JITTER_FLOOR = 0.5
_JITTER = random.Random()
_THROTTLED = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout"})
# What the words of a message call each operation (as the store's own errors do).
_DOING = {"put_object": "write", "get_object": "read", "head_object": "look up",
          "head_bucket": "look up", "list_objects_v2": "list", "delete_object": "delete",
          "delete_objects": "delete", "create_multipart_upload": "upload",
          "upload_part": "upload", "complete_multipart_upload": "upload",
          "abort_multipart_upload": "abort the upload of"}


def transient(error: BaseException) -> str | None:
    """Why ``error`` says the endpoint could not serve the request (words safe to log), or
    None when it answered it (a refusal, a missing key)."""
    if isinstance(error, ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if status >= 500 or code in _THROTTLED:
            return f"{code} (HTTP {status})" if code else f"HTTP {status}"
        return None
    if isinstance(error, ConnectionError | HTTPClientError):
        return type(error).__name__
    return None


class PatientClient:
    """A botocore S3 client (``client``) whose every call is made again while
    :func:`transient` says it failed, for ``seconds`` after the call began. ``endpoint``
    names the endpoint in messages (credentials redacted)."""

    def __init__(self, client: Any, seconds: float, endpoint: str) -> None:
        self._client = client
        self._seconds = seconds
        self._endpoint = endpoint

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name.startswith("_") or name in ("meta", "exceptions") or not callable(attr):
            return attr
        return functools.partial(self._patiently, name, attr)

    def _patiently(self, name: str, call: Callable[..., Any], **params: Any) -> Any:
        key = params.get("Key") or params.get("Prefix") or ""
        uri = f"s3://{params.get('Bucket', '')}/{key}"
        return keep_trying(functools.partial(call, **params), transient, Tries(
            self._endpoint, _DOING.get(name, name), uri, seconds=self._seconds), name)


@dataclass(frozen=True)
class Tries:
    """How long one request is made again, and what it is, for messages: ``doing`` (a
    verb: "read") ``uri`` at ``endpoint`` (credentials redacted). ``seconds`` > 0: for that
    long after the first try, then StoreUnavailable; else ``attempts`` tries at most."""

    endpoint: str
    doing: str
    uri: str
    seconds: float = 0.0
    attempts: int = 1


def keep_trying(call: Callable[[], T], reason: Callable[[BaseException], str | None],
                tries: Tries, name: str = "") -> T:
    """``call()``, made again (with backoff) while ``reason`` says why it failed for want of
    the endpoint; an error it gives no reason for is raised at once. Past ``tries``, the
    last error is raised (or, for a budget of seconds, StoreUnavailable from it)."""
    started = time.monotonic()
    wait = FIRST_BACKOFF
    done = 0
    while True:
        try:
            return call()
        except Exception as e:
            why = reason(e)
            if why is None:
                raise
            done += 1
            spent = time.monotonic() - started
            if tries.seconds <= 0:
                if done >= tries.attempts:
                    raise
                pause = wait * _JITTER.uniform(_JITTER_FLOOR, 1.0)
                log.warning("retrying (%d/%d) %s %s: %s", done + 1, tries.attempts,
                            name or tries.doing, tries.uri, why)
            elif spent >= tries.seconds:
                raise StoreUnavailable(
                    f"{tries.endpoint} kept failing to {tries.doing} {tries.uri} for "
                    f"{spent:.0f} s ({why}); given up after the store's retry budget of "
                    f"{tries.seconds:g} s (timeouts.backendErrorSeconds)") from e
            else:
                # The last try falls at the budget's end.
                pause = min(wait * _JITTER.uniform(_JITTER_FLOOR, 1.0), tries.seconds - spent)
                log.warning("%s %s failed for %.0f s (%s); trying again in %.2f s, for up to "
                            "%g s", name or tries.doing, tries.uri, spent, why, pause,
                            tries.seconds)
            time.sleep(pause)
            wait = min(2 * wait, MAX_BACKOFF)
