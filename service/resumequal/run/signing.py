"""The checkpoint key: an HMAC-SHA256 key that authenticates manifests, never stored.

A checkpoint's manifest lists every file with its sha256; the manifest's MAC, made with
this key, sits beside it. Whoever can write to the store can recompute the sha256s but
not the MAC, so a checkpoint whose MAC verifies was written by a process holding the key.

Everything else a run writes and reads back (trace segments, checkpoint manifests, spec
files, beacons, kill orders, markers, result files) is bound to the run: a
:class:`RunSeal` MACs each object with the run's id and the object's name inside the
location, so an object copied from another run, another leg or another rank fails to
authenticate even under the same key. On a cluster each run's key is made from the
operator's master key (:func:`derive_run_key`), so the operator can seal and check what it
writes and reads without holding any Secret's content. The run's id reaches workers and
the comparator as ``RESUMEQUAL_RUN_ID`` (a fresh one per ``resumequal run``; the
QualificationRun's uid on a cluster).

The key reaches workers and the comparator only through the environment variable
``RESUMEQUAL_CHECKPOINT_KEY``: ``resumequal run`` makes a fresh one per run (unless one
is set already) and hands it to its legs and its comparison; on a cluster the operator
keeps it in a Secret per QualificationRun that the leg pods and the comparator Job read.
It is never logged nor written to the store. Free of torch: the operator shares it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from resumequal.errors import CheckpointError

KEY_ENV = "RESUMEQUAL_CHECKPOINT_KEY"
RUN_ID_ENV = "RESUMEQUAL_RUN_ID"
# A run id: a generated hex id or a Kubernetes uid, then "/<child>" per sub-run (a seed of
# a seed matrix). What it may hold is bounded: it goes into every MAC and every message.
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}(/[A-Za-z0-9][A-Za-z0-9._-]{0,63}){0,4}$")
# What a sealed object's MAC covers before its bytes, so that no MAC of one kind of object
# (or of a manifest, made over bare bytes) is valid for another.
_SEAL_CONTEXT = b"resumequal seal 1\0"
# What a derived run key's MAC covers before the run's id (see derive_run_key).
_DERIVE_CONTEXT = b"resumequal run key 1\0"
# The field of a sealed JSON object (a beacon, a marker, a spec file) that holds its MAC.
MAC_FIELD = "mac"
# Bytes of randomness in a generated key (hex-encoded: twice as many characters).
KEY_BYTES = 32
# A key is exactly this: 64 hex characters, the text of 32 bytes. Its randomness cannot be
# measured from the key itself; its form can, and a passphrase, a word or a pattern typed
# to fill 64 characters is not of it.
KEY_CHARS = 2 * KEY_BYTES
_HEX_KEY = re.compile(rf"^[0-9a-fA-F]{{{KEY_CHARS}}}$")
# A key that a person typed, or a placeholder, repeats itself: a generated one of 64 hex
# characters uses nine or more of them (fewer: probability 7e-16) and none more than 28
# times (more: 3e-17). Tighter bounds refuse real keys: at a quarter (16 times) one
# generated key in 40 000 was refused.
MIN_DISTINCT_CHARS = 9
MAX_SHARE_OF_ONE_CHAR = 0.45


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
    return check_key(raw, f"the checkpoint key in {KEY_ENV}")


def check_key(raw: str, what: str) -> bytes:
    """``raw`` as key bytes if it has a generated key's form (64 hex characters, 32 bytes);
    CheckpointError naming ``what`` (never its value) otherwise, or when it repeats itself
    as no random key does."""
    how = f"a key is {KEY_CHARS} hex characters, {KEY_BYTES} random bytes (resumequal makes one)"
    if len(raw) != KEY_CHARS:
        raise CheckpointError(f"{what} has {len(raw)} characters; {how}")
    if not _HEX_KEY.match(raw):
        raise CheckpointError(f"{what} is not hex; {how}")
    commonest = max(raw.lower().count(c) for c in set(raw.lower()))
    distinct = len(set(raw.lower()))
    if distinct < MIN_DISTINCT_CHARS or commonest > MAX_SHARE_OF_ONE_CHAR * len(raw):
        raise CheckpointError(
            f"{what} is not random: {distinct} distinct characters, one of them "
            f"{commonest} times in {len(raw)}; {how}"
        )
    return raw.encode()


def derive_run_key(master: bytes, run_id: str) -> str:
    """The key of run ``run_id`` (a QualificationRun's uid) made from the operator's master
    key, as the run's Secret and ``RESUMEQUAL_CHECKPOINT_KEY`` hold it (hex). One-way: a
    run's pods hold their run's key, never the master or another run's."""
    message = _DERIVE_CONTEXT + check_run_id(run_id, "run uid").encode()
    return hmac.new(master, message, hashlib.sha256).hexdigest()


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

    def seal_json(self, name: str, body: Mapping[str, Any]) -> bytes:
        """``body`` as stored under ``name``: a JSON object with its MAC in ``mac``, taken
        over the object's canonical form, so a reader that parses it can check it."""
        if MAC_FIELD in body:
            raise ValueError(f"a sealed object cannot have a field {MAC_FIELD!r} of its own")
        mac = self.mac(name, canonical_json(body))
        return json.dumps({**body, MAC_FIELD: mac}, indent=1, allow_nan=False).encode()

    def open_json(self, name: str, value: Any) -> dict[str, Any] | None:
        """``value`` (a JSON object as parsed from ``name``) without its MAC when that MAC
        holds for this run and ``name``; None otherwise (no MAC, another run's or
        another object's, or any field changed)."""
        if not isinstance(value, dict):
            return None
        body = dict(value)
        mac = body.pop(MAC_FIELD, None)
        if not isinstance(mac, str) or not mac.isascii():
            return None
        try:
            data = canonical_json(body)
        except (ValueError, RecursionError):  # NaN, Infinity, or nested deeper than
            return None                       # a writer of ours nests: none of ours
        return body if self.authentic(name, data, mac.encode()) else None

    def digest_mac(self, name: str, sha256_hex: str) -> str:
        """The MAC of result file ``name`` whose content has the sha256 ``sha256_hex``: the
        ``<name>.mac`` beside a result file people read as it is (``verdict.json``)."""
        return self.mac(name, b"sha256:" + sha256_hex.encode())


def canonical_json(body: Mapping[str, Any]) -> bytes:
    """The one serialisation of a JSON object that its MAC covers: sorted keys, no spaces,
    ASCII, no NaN (a parsed object gives the bytes its writer MACed)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode()
