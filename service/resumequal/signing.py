"""The checkpoint key: an HMAC-SHA256 key that authenticates manifests, never stored.

A checkpoint's manifest lists every file with its sha256; the manifest's MAC, made with
this key, sits beside it. Whoever can write to the store can recompute the sha256s but
not the MAC, so a checkpoint whose MAC verifies was written by a process holding the key.

The key reaches workers and the comparator only through the environment variable
``RESUMEQUAL_CHECKPOINT_KEY``: ``resumequal run`` makes a fresh one per run (unless one
is set already) and hands it to its legs and its comparison; on a cluster the operator
keeps it in a Secret per QualificationRun that the leg pods and the comparator Job read.
It is never logged nor written to the store. Free of torch: the operator shares it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping

from resumequal.errors import CheckpointError

KEY_ENV = "RESUMEQUAL_CHECKPOINT_KEY"
# Bytes of randomness in a generated key (hex-encoded: twice as many characters).
KEY_BYTES = 32
# A shorter key is refused: it could be guessed. 64 characters hold 256 bits as hex.
MIN_KEY_CHARS = 64
# A key that a person typed, or a placeholder, repeats itself: a generated one of 64 hex
# characters uses ten or more of them and none more than a quarter of the time, except
# with a probability below 1e-9.
MIN_DISTINCT_CHARS = 10
MAX_SHARE_OF_ONE_CHAR = 0.25


def new_key() -> str:
    """A fresh random key, as the text that goes into the environment."""
    return secrets.token_hex(KEY_BYTES)


def key_from_env(environ: Mapping[str, str] | None = None) -> bytes:
    """The checkpoint key of this process; CheckpointError saying why there is none."""
    environ = os.environ if environ is None else environ
    raw = environ.get(KEY_ENV, "")
    if not raw:
        raise CheckpointError(
            f"no checkpoint key: {KEY_ENV} is not set, so checkpoints can be neither signed "
            "nor authenticated (resumequal run sets it for its legs; on a cluster the "
            "operator's Secret does)"
        )
    if len(raw) < MIN_KEY_CHARS:
        raise CheckpointError(
            f"the checkpoint key in {KEY_ENV} has {len(raw)} characters; at least "
            f"{MIN_KEY_CHARS} are required (resumequal makes one: {KEY_BYTES} random bytes "
            "as hex)"
        )
    commonest = max(raw.count(c) for c in set(raw))
    if len(set(raw)) < MIN_DISTINCT_CHARS or commonest > MAX_SHARE_OF_ONE_CHAR * len(raw):
        raise CheckpointError(
            f"the checkpoint key in {KEY_ENV} is not random: {len(set(raw))} distinct "
            f"characters, one of them {commonest} times in {len(raw)}; use a generated key "
            f"({KEY_BYTES} random bytes as hex)"
        )
    return raw.encode()


def sign(data: bytes, key: bytes) -> str:
    """The MAC of ``data``: HMAC-SHA256, hex."""
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def authentic(data: bytes, mac: bytes, key: bytes) -> bool:
    """Whether ``mac`` (as stored, hex) is the MAC of ``data``; constant-time."""
    return hmac.compare_digest(sign(data, key).encode(), mac.strip())
