"""The checkpoint key: an HMAC-SHA256 key that authenticates manifests, never stored.

A checkpoint's manifest lists every file with its sha256; the manifest's MAC, made with
this key, sits beside it. Whoever can write to the store can recompute the sha256s but
not the MAC, so a checkpoint whose MAC verifies was written by a process holding the key.

Everything else the workers write and the comparator judges (trace segments; checkpoint
manifests name the run too) is bound to the run: a :class:`RunSeal` MACs each object with
the run's id and the object's name inside the location, so a segment or checkpoint copied
from another run, another leg or another rank fails to authenticate even under the same
key. The run's id reaches workers and the comparator as ``RESUMEQUAL_RUN_ID`` (a fresh one
per ``resumequal run``; the QualificationRun's uid on a cluster).

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
import re
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from resumequal.errors import CheckpointError

KEY_ENV = "RESUMEQUAL_CHECKPOINT_KEY"
RUN_ID_ENV = "RESUMEQUAL_RUN_ID"
# A run id: a generated hex id or a Kubernetes uid, then "/<child>" per sub-run (a seed of
# a seed matrix). What it may hold is bounded: it goes into every MAC and every message.
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}(/[A-Za-z0-9][A-Za-z0-9._-]{0,63}){0,4}$")
# What a sealed object's MAC covers before its bytes, so that no MAC of one kind of object
# (or of a manifest, made over bare bytes) is valid for another.
_SEAL_CONTEXT = b"resumequal seal 1\0"
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


def new_run_id() -> str:
    """A fresh run id (``resumequal run`` makes one per run)."""
    return uuid.uuid4().hex


def check_run_id(run_id: str, where: str = RUN_ID_ENV) -> str:
    """``run_id`` if it is one; CheckpointError naming ``where`` otherwise."""
    if not _RUN_ID.match(run_id):
        raise CheckpointError(f"{where}: {run_id[:80]!r} is not a run id (letters, digits, "
                              "'.', '_', '-', up to 64 characters)")
    return run_id


def run_id_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """This process's run id (``RESUMEQUAL_RUN_ID``), or None when it was given none."""
    environ = os.environ if environ is None else environ
    raw = environ.get(RUN_ID_ENV, "")
    return check_run_id(raw) if raw else None


@dataclass(frozen=True)
class RunSeal:
    """The run's key bound to its id: MACs of store objects that hold only for this run and
    for the name each was written under (``<leg>/trace/rank-<r>/attempt-<a>/<seq>.jsonl``)."""

    key: bytes
    run: str

    def __repr__(self) -> str:  # the key never reaches a log through a repr
        return f"RunSeal(run={self.run!r})"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RunSeal:
        """The seal of this process's run; CheckpointError when it has no key or no run id."""
        key = key_from_env(environ)
        run = run_id_from_env(environ)
        if run is None:
            raise CheckpointError(
                f"no run id: {RUN_ID_ENV} is not set, so what this run writes cannot be "
                "bound to it (resumequal run and the operator set it)")
        return cls(key, run)

    def child(self, name: str) -> RunSeal:
        """The seal of sub-run ``name`` (``seed-11`` of a seed matrix)."""
        return RunSeal(self.key, check_run_id(f"{self.run}/{name}", f"sub-run {name!r}"))

    def mac(self, name: str, data: bytes) -> str:
        """The MAC of object ``name`` holding ``data`` in this run; hex."""
        message = b"%s%s\0%s\0" % (_SEAL_CONTEXT, self.run.encode(), name.encode())
        return hmac.new(self.key, message + data, hashlib.sha256).hexdigest()

    def authentic(self, name: str, data: bytes, mac: bytes) -> bool:
        """Whether ``mac`` (hex) is this run's MAC of ``data`` as object ``name``."""
        return hmac.compare_digest(self.mac(name, data).encode(), mac.strip())
