"""Nothing of a checkpoint is deserialised before its manifest is authenticated.

A store writer without the checkpoint key plants pickles that run a payload (DCP's
``.metadata`` and a rank state) behind a manifest whose BLAKE3 digests it recomputed: the
worker's resume and the comparator refuse the checkpoint, naming it, and the payload
never runs. So are checkpoints under a wrong key, without a key, without a MAC, or with
a manifest edited after signing. A folder root and an object-store root (a FileStore
here, no sockets; SeaweedFS in tests/integration/test_checkpoint_auth.py) alike.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from resumequal.checkpoint import (
    CheckpointRoot,
    FolderRoot,
    Position,
    RemoteRoot,
    layout,
    verify,
)
from resumequal.checkpoint.remote import COMMITTED
from resumequal.compare.drift import checkpoint_drift
from resumequal.compare.files import final_checkpoint
from resumequal.compare.validity import check_final_checkpoints
from resumequal.errors import CheckpointError
from resumequal.local.backend import LocalBackend
from resumequal.run.location import RunLocation
from resumequal.run.signing import KEY_ENV, key_from_env, new_key
from resumequal.spec import parse_spec
from resumequal.store import FileStore
from tests.checkpoint_attacks import payload, planted_files, tamper
from tests.unit.checkpoint_managers import rank0_manager
from tests.unit.rank_states import Plain

pytestmark = pytest.mark.usefixtures("single_process_group")

STEPS = 8
NAME = Position(STEPS).name


def _template(_: Plain) -> dict[str, Any]:
    return {"x": torch.zeros(3)}


def _save(root: CheckpointRoot) -> None:
    assert rank0_manager(root, keep_last=2).save(
        Position(STEPS), {"x": torch.arange(3.0)}, Plain(step=STEPS),
        info={"leg": "control"}) == NAME


class Place:
    """A saved checkpoint ``NAME`` on one kind of root, and how to change its files."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.store_dir = tmp_path / "store"
        if kind == "folder":
            self.root: CheckpointRoot = FolderRoot(self.store_dir / "control" / "checkpoints")
            self.store = None
        else:
            self.store = FileStore(str(self.store_dir))
            self.root = RemoteRoot(self.store, "control/checkpoints", tmp_path / "scratch")
        _save(self.root)

    def key(self, rel: str) -> str:
        return f"control/checkpoints/{NAME}/{rel}"

    def read(self, rel: str) -> bytes:
        if self.store is None:
            return (self.store_dir / "control" / "checkpoints" / NAME / rel).read_bytes()
        return self.store.get_bytes(self.key(rel))

    def write(self, rel: str, data: bytes) -> None:
        if self.store is None:
            (self.store_dir / "control" / "checkpoints" / NAME / rel).write_bytes(data)
        else:
            self.store.put_bytes(self.key(rel), data)

    def delete(self, rel: str) -> None:
        if self.store is None:
            (self.store_dir / "control" / "checkpoints" / NAME / rel).unlink()
        else:
            self.store.delete(self.key(rel))

    def plant(self, marker: Path, mac: str = "attacker") -> None:
        tamper(self.read, self.write, self.delete, marker, mac)
        if self.store is not None:
            self.write(COMMITTED, b"")

    def resume(self) -> CheckpointError:
        """What a resuming worker meets: the fresh manager's ``newest`` (then ``load``)."""
        mgr = rank0_manager(self.root, keep_last=2)
        with pytest.raises(CheckpointError) as info:
            mgr.collect_garbage()
            name = mgr.newest()
            assert name is not None
            mgr.load(name, _template, Plain)
        return info.value

    def compare(self, tmp_path: Path) -> str:
        """What the comparator meets: the final checkpoints opened, then the drift (which
        reads DCP's metadata and every model and optimizer tensor through them)."""
        spec = parse_spec({"training": {"steps": STEPS},
                           "checkpoint": {"store": str(self.store_dir)}})
        try:
            if self.store is None:
                final = final_checkpoint(spec, RunLocation.open(str(tmp_path / "run")),
                                         "control")
            else:  # as on S3: a file:// store of a run holds folder checkpoints
                final = RemoteRoot(self.store, "control/checkpoints", tmp_path / "cmp").final(
                    NAME)
            check, pair = check_final_checkpoints({"control": final, "preempted": final},
                                                  STEPS)
            assert check.ok and pair is not None, check.detail
            checkpoint_drift(pair.control, pair.preempted)
        except CheckpointError as e:
            return str(e)
        raise AssertionError("the comparator read a tampered checkpoint")


KINDS = ["folder", "object-store"]


def _refused(message: str, why: str) -> None:
    assert re.search(rf"checkpoint \S*{re.escape(NAME)}\b", message), message
    assert why in message, message


def test_the_planted_payload_is_live(tmp_path: Path) -> None:
    """The payload the tests plant does run when unpickled."""
    marker = tmp_path / "ran"
    pickle.loads(payload(marker))
    assert marker.exists()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mac", ["attacker", "stale", "none"])
def test_a_planted_metadata_and_rank_state_are_refused_and_never_run(
    kind: str, mac: str, tmp_path: Path
) -> None:
    place = Place(kind, tmp_path)
    marker = tmp_path / "payload-ran"
    place.plant(marker, mac)
    why = "has no manifest.hmac" if mac == "none" else "does not match manifest.hmac"
    _refused(str(place.resume()), why)
    _refused(place.compare(tmp_path), why)
    assert not marker.exists()


@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_under_another_key_is_refused(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    place = Place(kind, tmp_path)
    monkeypatch.setenv(KEY_ENV, new_key())
    _refused(str(place.resume()), "does not match manifest.hmac")
    _refused(place.compare(tmp_path), "does not match manifest.hmac")


@pytest.mark.parametrize("kind", KINDS)
def test_without_a_key_nothing_is_loaded_and_the_error_says_why(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    place = Place(kind, tmp_path)
    monkeypatch.delenv(KEY_ENV)
    why = f"cannot be authenticated: no checkpoint key: {KEY_ENV} is not set"
    _refused(str(place.resume()), why)
    _refused(place.compare(tmp_path), why)


@pytest.mark.parametrize("kind", KINDS)
def test_a_missing_mac_is_refused(kind: str, tmp_path: Path) -> None:
    place = Place(kind, tmp_path)
    place.delete(layout.MANIFEST_MAC)
    _refused(str(place.resume()), "has no manifest.hmac")
    _refused(place.compare(tmp_path), "has no manifest.hmac")


@pytest.mark.parametrize("kind", KINDS)
def test_a_manifest_edited_after_signing_is_refused(kind: str, tmp_path: Path) -> None:
    place = Place(kind, tmp_path)
    edited = place.read(layout.MANIFEST).replace(b'"attempt": 0', b'"attempt": 1')
    assert edited != place.read(layout.MANIFEST)
    place.write(layout.MANIFEST, edited)
    _refused(str(place.resume()), "does not match manifest.hmac")
    _refused(place.compare(tmp_path), "does not match manifest.hmac")


def test_an_authentic_manifest_under_another_name_is_refused(tmp_path: Path) -> None:
    root = FolderRoot(tmp_path / "ckpt")
    _save(root)
    (tmp_path / "ckpt" / NAME).rename(tmp_path / "ckpt" / Position(12).name)
    with pytest.raises(CheckpointError, match=rf"is refused: its manifest is the one of {NAME}"):
        verify(tmp_path / "ckpt" / Position(12).name)


def test_a_save_without_a_key_is_not_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    root = FolderRoot(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match=f"no checkpoint key: {KEY_ENV} is not set"):
        _save(root)
    assert layout.committed(root.root) == []


@pytest.mark.parametrize(("value", "why"), [
    ("", "is not set"), ("short", "has 5 characters; a key is 64 hex characters, 32 random"),
    ("k" * 64, "is not hex"),
    ("a" * 64, "is not random: 1 distinct characters, one of them 64 times in 64"),
    ("password" * 8, "is not hex"),
    ("0123456789abcdef" * 2, "has 32 characters"),
    # Keys that once passed: a digit pattern, a letter pattern, a typed passphrase, and a
    # generated key with something appended.
    ("0123456789" * 7, "has 70 characters"),
    ("abcdefghi" * 8, "has 72 characters"),
    ("correct horse battery staple and then some more words to fill 64", "is not hex"),
    ("the quick brown fox jumps over the lazy dog, again and again and", "is not hex"),
    ("c27caa0943c795aa0a77aaa845ac8974b6ae4a0aafa47c904a10b3ab379da344!", "65 characters"),
    ("c27caa0943c795aa0a77aaa845ac8974b6ae4a0aafa47c904a10b3ab379da34 ", "is not hex"),
])
def test_an_unusable_key_is_refused(value: str, why: str) -> None:
    with pytest.raises(CheckpointError, match=why):
        key_from_env({KEY_ENV: value})


def test_a_generated_key_is_usable_and_fresh() -> None:
    for _ in range(2000):  # a generated key is never taken for a weak one
        assert key_from_env({KEY_ENV: new_key()})
    assert new_key() != new_key()


def test_a_generated_key_that_repeats_one_digit_often_is_still_usable() -> None:
    # A key secrets.token_hex once made: "a" 17 times in 64 (one key in 40 000 does that).
    drawn = "c27caa0943c795aa0a77aaa845ac8974b6ae4a0aafa47c904a10b3ab379da344"
    assert drawn.count("a") == 17
    assert key_from_env({KEY_ENV: drawn}) == drawn.encode()




def test_a_local_run_makes_a_key_for_its_legs_and_keeps_it_out_of_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    LocalBackend(parse_spec({}), tmp_path / "run")
    key = os.environ[KEY_ENV]
    assert key_from_env() == key.encode() and len(key) == 64
    for path in (tmp_path / "run").rglob("*"):
        assert not path.is_file() or key.encode() not in path.read_bytes(), path


def test_a_local_run_keeps_the_callers_key(tmp_path: Path, checkpoint_key: str) -> None:
    LocalBackend(parse_spec({}), tmp_path / "run")
    assert os.environ[KEY_ENV] == checkpoint_key


@pytest.mark.parametrize("kind", KINDS)
def test_files_planted_after_the_check_are_never_run(kind: str, tmp_path: Path) -> None:
    """Between the check of a checkpoint's manifest and its load, whoever can write to the
    store swaps its files for the payload. A checkpoint's files are read where they lie (a
    folder's files, an object store's objects in ranged reads), each byte checked as it is
    read, so the swap is refused naming the file. The comparator copies (verifying) before
    it reads: the swapped files are refused."""
    place = Place(kind, tmp_path)
    marker = tmp_path / "payload-ran"
    mgr = rank0_manager(place.root, keep_last=2)
    assert mgr.newest() == NAME  # checked (and copied) here
    for rel, data in planted_files(marker).items():
        place.write(rel, data)  # then swapped where the checkpoint lies
    with pytest.raises(CheckpointError) as info:
        mgr.load(NAME, _template, Plain)
    # A folder's file is seen to have another size when opened; an object's bytes fail
    # their BLAKE3 digests (its size was checked against the listing at newest()).
    _refused(str(info.value), f"is refused: {layout.rank_state_file(0)} "
                              + ("has " if kind == "folder" else "fails its BLAKE3 check"))
    assert not marker.exists()
    # The comparator reads where they lie too: the swapped files are refused.
    _refused(place.compare(tmp_path), "bytes, the manifest says")
    assert not marker.exists()
