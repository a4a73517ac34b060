"""How an ``s3://`` store is reached: the spec's ``checkpoint.s3`` section
(:class:`S3Settings`), the client settings it becomes (:class:`S3Config`, :func:`s3_config`)
and the environment variables that carry them to a worker without a spec.

Settings only: no SDK and no store, as the spec imports this module for its
``checkpoint.s3`` field and importing the spec must not load botocore. Of resumequal it
imports only the error base. No credentials here: :mod:`resumequal.store.s3` says where
they come from.
"""

from __future__ import annotations

import ipaddress
import os
import re
from typing import Annotated, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from resumequal.errors import StoreError
from resumequal.store.settings import (
    MAX_SECONDS,
    MAX_URL,
    StoreSettings,
    connect_timeout_field,
    max_attempts_field,
    read_timeout_field,
)

# S3 rejects a multipart part under 5 MiB (except the last) and over 5 GiB.
_MIN_PART_MB = 5
_MAX_PART_MB = 5 * 1024


# What botocore takes for a client's endpoint (botocore/utils.py is_valid_endpoint_url and
# is_valid_ipv6_endpoint_url, checked by botocore/endpoint.py before a client is made,
# which raises ValueError otherwise): no tab or line break anywhere, a host name of labels
# of letters, digits and inner hyphens (an IPv4 address is one), or a bracketed IPv6
# address. Written out here: the spec loads this module and must not load botocore;
# tests/unit/test_store.py holds the two to the same answers.
_UNSAFE_URL_CHARS = frozenset("\t\r\n")
_HOST_NAME = re.compile(r"^((?!-)[A-Z\d-]{1,63}(?<!-)\.)*((?!-)[A-Z\d-]{1,63}(?<!-))$",
                        re.IGNORECASE)


def endpoint_problem(value: str, *, ours: bool = True) -> str | None:
    """Why ``value`` is no endpoint an S3 client can be made with (never echoing it: it may
    hold a credential), or None. The one check of the spec, the S3 settings and the
    environment's ``AWS_ENDPOINT_URL_S3``; ``ours`` adds what a spec may not hold
    (user:password, a query), which botocore takes from the environment (and messages
    redact)."""
    if _UNSAFE_URL_CHARS.intersection(value) or any(c.isspace() for c in value):
        return "holds whitespace or a line break"
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (raises for a port that is no number or out of range)
    except ValueError:
        return "is not a URL (an unclosed [, a port out of range or not a number)"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be http(s)://host[:port]"
    if ours and (parts.username is not None or parts.password is not None):
        return ("holds user:password: an endpoint is http(s)://host[:port] without "
                "user:password; credentials come from the AWS chain (env, profile, web "
                "identity), never from the endpoint URL")
    if ours and (parts.query or parts.fragment):
        return "has a query or a fragment; an endpoint is http(s)://host[:port][/path]"
    host = parts.hostname
    if parts.netloc.rpartition("@")[2].startswith("["):
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            return "has a bracketed host that is no IPv6 address"
        return None
    if len(host) > 255 or not _HOST_NAME.match(host.removesuffix(".")):
        return "has a host that is no host name (letters, digits, '-' and '.' only)"
    return None


def check_endpoint(value: str | None) -> str | None:
    """``value`` without a trailing ``/`` if it is an endpoint (:func:`endpoint_problem`);
    ValueError saying why, never echoing it, otherwise."""
    if value is None:
        return None
    problem = endpoint_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value.rstrip("/")


# An endpoint field of a store's settings, checked as above.
Endpoint = Annotated[str | None, AfterValidator(check_endpoint)]


class S3Settings(StoreSettings):
    """How workers and the comparator reach an ``s3://`` checkpoint store (AWS S3, MinIO,
    Ceph RGW). No credentials here: they come from the standard AWS chain (env, profile,
    web identity, instance role), since specs are written into run files and reports."""

    scheme: ClassVar[str] = "s3"

    endpoint_url: Endpoint = Field(
        default=None, max_length=MAX_URL,
        description="http(s)://host:port of MinIO / RGW; None for AWS S3.",
    )
    region: str | None = Field(default=None, max_length=64,
                               description="Signing region; None: AWS_REGION.")
    addressing_style: Literal["path", "virtual", "auto"] = Field(
        default="auto", description="'path' for MinIO and RGW without wildcard DNS."
    )
    max_attempts: int = max_attempts_field("botocore")
    connect_timeout_seconds: float = connect_timeout_field()
    read_timeout_seconds: float = read_timeout_field(
        8.0, ". An endpoint that accepts connections and never answers fails a request after "
        "maxAttempts x readTimeoutSeconds plus backoff (at most 15 s): under a minute by "
        "default. Raise it for a gateway slow to complete large uploads.")
    sign_payloads: bool = Field(
        default=False,
        description="Sign request bodies (SigV4's payload sha256) over http too, for a "
        "store that refuses UNSIGNED-PAYLOAD. Off: bodies go unsigned with a CRC32 the "
        "store checks, as botocore sends them over https; a checkpoint's own sha256 is in "
        "its authenticated manifest, so nothing is hashed twice.",
    )

    def endpoint(self) -> str | None:
        return self.endpoint_url

    def environment(self) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.endpoint_url:
            # S3's own variable: AWS_ENDPOINT_URL would also send STS (web identity) there.
            env["AWS_ENDPOINT_URL_S3"] = self.endpoint_url
        if self.region:
            env.update(AWS_REGION=self.region, AWS_DEFAULT_REGION=self.region)
        if self.addressing_style != "auto":
            # botocore has no variable of its own for these (s3_config reads them back).
            env[ADDRESSING_STYLE_ENV] = self.addressing_style
        if self.sign_payloads:
            env[SIGN_PAYLOADS_ENV] = "1"
        return env


class S3Config(BaseModel):
    """How to reach the object store. Holds no credentials (see :mod:`resumequal.store.s3`)."""

    # Inputs stay out of validation messages: a misplaced secret must not be echoed.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    endpoint_url: Endpoint = None
    """``http(s)://host:port`` of MinIO, Ceph RGW or another S3 API; ``None`` for AWS."""
    region: str | None = None
    """Signing region; ``None`` takes ``AWS_REGION`` / the profile. MinIO accepts any."""
    addressing_style: Literal["path", "virtual", "auto"] = "auto"
    """``path`` (``host/bucket/key``) is what MinIO and RGW without wildcard DNS need."""
    max_attempts: int = Field(5, ge=1, le=20)
    """Attempts per request, the first included. Standard mode backs off exponentially
    (random, up to 1, 2, 4, 8 s), so 5 attempts ride out ~15 s of endpoint trouble. A
    client with ``retry_seconds`` (a worker's) makes one: it makes its own attempts."""
    sign_payloads: bool = False
    """Sign every request body (SigV4's ``x-amz-content-sha256``) over http as well, for a
    store that refuses ``UNSIGNED-PAYLOAD``. Off, a body goes unsigned wherever botocore
    sends a checksum with it (its default, CRC32, which the store checks), as botocore
    itself does over https: over plain http it would otherwise hash every byte with
    sha256 once more after the sha256 a checkpoint's manifest already keeps (0.28 s of a
    300 MB save's 1 s of CPU). Where checksums are off (``AWS_REQUEST_CHECKSUM_CALCULATION=
    when_required``) bodies are signed either way."""
    retry_mode: Literal["standard", "adaptive"] = "standard"
    """``adaptive`` also rate-limits the client after throttling; useful when many ranks
    write one bucket at once."""
    multipart_threshold_mb: int = Field(16, ge=1)
    """Objects over this size (MiB), and over one part, are uploaded and downloaded in
    parallel parts; smaller ones in one request."""
    multipart_chunk_mb: int = Field(16, ge=_MIN_PART_MB, le=_MAX_PART_MB)
    """Part size (MiB). S3 wants 5 MiB to 5 GiB; 16 MiB keeps at most
    ``max_concurrency`` x 16 MiB in flight and a 100 GiB shard under the 10 000-part limit."""
    max_concurrency: int = Field(10, ge=1, le=64)
    """Parts transferred at once per file (boto3's default)."""
    connect_timeout_seconds: float = Field(3.0, gt=0)
    """Seconds to open a connection; each timeout is one failed attempt."""
    read_timeout_seconds: float = Field(8.0, gt=0)
    """Seconds without a byte from the server before an attempt fails. With the defaults an
    endpoint that accepts connections and never answers fails a request after 5 x 8 s plus
    the backoff between attempts (at most 15 s): under a minute, a warning per retry."""
    retry_seconds: float = Field(0.0, ge=0, le=MAX_SECONDS)
    """How long a request is made again, with backoff (0.5 s doubling to 5 s), once
    botocore's attempts have failed for want of the endpoint (a connection refused or
    dropped, a timeout, a 5xx, throttling); 0: botocore's attempts alone. A worker's is its
    spec's ``timeouts.backendErrorSeconds``, the time the runner and the operator give
    their own store errors: an outage shorter than that is ridden out, a longer one ends
    the request naming the endpoint, the object and the time."""


# botocore reads endpoint, region and credentials from the environment, but has no
# variable for the addressing style; workers that start from a bare run location (no spec
# yet) take it from here, and the operator sets it on every pod.
ADDRESSING_STYLE_ENV = "RESUMEQUAL_S3_ADDRESSING_STYLE"
# And whether to sign request bodies (S3Config.sign_payloads): "1" signs them.
SIGN_PAYLOADS_ENV = "RESUMEQUAL_S3_SIGN_PAYLOADS"


def s3_config(spec: S3Settings | None, retry_seconds: float = 0.0) -> S3Config:
    """Client settings from a spec's ``checkpoint.s3``; without one, AWS defaults plus
    ``RESUMEQUAL_S3_ADDRESSING_STYLE`` and ``RESUMEQUAL_S3_SIGN_PAYLOADS`` from the
    environment. ``retry_seconds``: see :attr:`S3Config.retry_seconds`."""
    if spec is not None:
        return S3Config(**spec.model_dump(by_alias=False), retry_seconds=retry_seconds)
    style = os.environ.get(ADDRESSING_STYLE_ENV, "").strip() or "auto"
    if style not in ("path", "virtual", "auto"):
        raise StoreError(f"{ADDRESSING_STYLE_ENV}={style!r}: expected path, virtual or auto")
    sign = os.environ.get(SIGN_PAYLOADS_ENV, "").strip() or "0"
    if sign not in ("0", "1"):
        raise StoreError(f"{SIGN_PAYLOADS_ENV}={sign!r}: expected 0 or 1")
    return S3Config(addressing_style=style, sign_payloads=sign == "1",  # type: ignore[arg-type]
                    retry_seconds=retry_seconds)


__all__ = ["ADDRESSING_STYLE_ENV", "SIGN_PAYLOADS_ENV", "Endpoint", "S3Config", "S3Settings",
           "check_endpoint", "endpoint_problem", "s3_config"]
