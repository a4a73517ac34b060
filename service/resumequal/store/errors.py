"""What the store raises: one subclass of :class:`resumequal.errors.StoreError` per cause.

    StoreError (resumequal.errors)
    ├── StoreNotFound        the bucket, the key or the file does not exist
    ├── StoreAccessDenied    no credentials, wrong credentials, or no permission
    ├── StoreUnavailable     the endpoint cannot be reached or keeps failing, after retries
    ├── StoreIntegrityError  what was read does not hash to what was expected, or what
    │                        the endpoint received to what was sent
    ├── StoreObjectTooLarge  an object is larger than what its reader accepts
    ├── StoreProtocolError   the endpoint answered what no S3 API answers (a ranged GET
    │                        answered whole)
    └── StoreConfigError     the settings a store is reached with cannot be used (an
                             endpoint no client takes)

Messages name the URI, bucket or key; never credentials, and never a raw response body.
The vendor error is chained with ``from e``.
"""

from __future__ import annotations

from resumequal.errors import StoreError


class StoreNotFound(StoreError):
    """The bucket, key or file does not exist; the message names which."""


class StoreAccessDenied(StoreError):
    """Credentials are missing or wrong, or they do not grant the operation."""


class StoreUnavailable(StoreError):
    """The endpoint is unreachable or kept failing after the client's retries."""


class StoreIntegrityError(StoreError):
    """The bytes read do not match the sha256 they were expected to have, or the endpoint
    refused the bytes it received for not matching the checksum sent with them."""


class StoreObjectTooLarge(StoreError):
    """An object holds more bytes than its reader accepts (read no further than that)."""


class StoreProtocolError(StoreError):
    """The endpoint answered against the S3 API; the message says what it did wrong."""


class StoreConfigError(StoreError):
    """The store's settings (an endpoint from the environment) cannot be used: nothing ran."""


def too_large(uri: str, max_bytes: int) -> StoreObjectTooLarge:
    """The error for an object at ``uri`` over ``max_bytes``."""
    return StoreObjectTooLarge(f"{uri}: larger than the {max_bytes} bytes such an object may "
                               "hold; not read")


__all__ = [
    "StoreAccessDenied",
    "StoreConfigError",
    "StoreError",
    "StoreIntegrityError",
    "StoreNotFound",
    "StoreObjectTooLarge",
    "StoreProtocolError",
    "StoreUnavailable",
    "too_large",
]
