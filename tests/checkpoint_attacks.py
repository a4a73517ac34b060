"""A store writer's attack on a committed checkpoint, for the tests of its authentication.

The attacker can write anything under the run's prefix but does not hold the checkpoint
key: it replaces DCP's ``.metadata`` and a rank state with pickles that run a payload
when loaded, recomputes every size and chunk digest in the manifest, signs it with a key of its
own (or keeps the old MAC, or drops it) and writes ``COMMITTED`` again.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from resumequal.checkpoint.layout import DCP_DIR, MANIFEST, MANIFEST_MAC, rank_state_file
from resumequal.checkpoint.manifest import Manifest, entry_of
from resumequal.run.signing import sign

ATTACKER_KEY = b"not-the-run-key-" * 4


class Payload:
    """Unpickling it creates ``marker``: proof that loading ran the attacker's code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def payload(marker: Path) -> bytes:
    return pickle.dumps(Payload(marker))


def planted_files(marker: Path) -> dict[str, bytes]:
    """The files the attacker replaces: DCP's metadata and rank 0's state."""
    data = payload(marker)
    return {f"{DCP_DIR}/.metadata": data, rank_state_file(0): data}


def forge(
    manifest_bytes: bytes,
    planted: dict[str, bytes],
    mac: str = "attacker",
) -> tuple[bytes, bytes | None]:
    """The tampered manifest (every planted file's size and digests recomputed) and the MAC
    the attacker stores beside it: ``attacker`` (its own key), ``stale`` (the old one is
    left; the caller keeps it) or ``none``."""
    manifest = Manifest.model_validate_json(manifest_bytes)
    files = dict(manifest.files)
    for rel, data in planted.items():
        files[rel] = entry_of(data)
    forged = manifest.model_copy(update={"files": files}).model_dump_json(indent=1).encode()
    if mac == "attacker":
        return forged, sign(forged, ATTACKER_KEY).encode()
    return forged, None


def tamper(read: Callable[[str], bytes], write: Callable[[str, bytes], None],
           delete: Callable[[str], None], marker: Path, mac: str = "attacker") -> None:
    """Plant the payload in one checkpoint through ``read``/``write``/``delete`` of its
    files (relative names); the caller writes ``COMMITTED`` again where there is one."""
    planted = planted_files(marker)
    for rel, data in planted.items():
        write(rel, data)
    forged, new_mac = forge(read(MANIFEST), planted, mac)
    write(MANIFEST, forged)
    if new_mac is not None:
        write(MANIFEST_MAC, new_mac)
    elif mac == "none":
        delete(MANIFEST_MAC)

