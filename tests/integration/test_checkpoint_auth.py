"""A bucket writer cannot run code in the workers or the comparator (SeaweedFS over HTTP).

A committed checkpoint on S3 gets a pickled payload as DCP's ``.metadata`` and as rank 0's
state, behind a manifest whose sizes and BLAKE3 digests are recomputed, signed with a key that
is not the run's, and ``COMMITTED`` written again. The resuming worker and the
comparator refuse it, naming the checkpoint, and the payload never runs. The same for a
checkpoint without a MAC, and one read without the run's key.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

from resumequal.checkpoint import (
    Position,
    RemoteRoot,
    checkpoint_location,
    remote,
)
from resumequal.checkpoint.remote import COMMITTED
from resumequal.compare.files import final_checkpoint
from resumequal.errors import CheckpointError
from resumequal.run.location import RunLocation
from resumequal.run.signing import KEY_ENV, new_key
from resumequal.spec import QualificationSpec, parse_spec
from tests.checkpoint_attacks import tamper
from tests.process_group import single_rank_group
from tests.unit.checkpoint_managers import rank0_manager
from tests.unit.rank_states import Plain

if TYPE_CHECKING:
    from tests.s3server import SeaweedFS

pytest_plugins = ("tests.s3server",)
pytestmark = [pytest.mark.usefixtures("aws_env")]

STEPS = 8
NAME = Position(STEPS).name


@pytest.fixture
def process_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Rank 0 of 1, as a worker's checkpoint manager has (gloo over a FileStore)."""
    with single_rank_group(tmp_path_factory.mktemp("pg")):
        yield


def _spec(server: SeaweedFS, bucket: str) -> QualificationSpec:
    return parse_spec({"training": {"steps": STEPS}, "checkpoint": {
        "store": f"s3://{bucket}/runs",
        "s3": {"endpoint_url": server.endpoint, "addressing_style": "path"},
    }})


def _root(spec: QualificationSpec, scratch: Path) -> RemoteRoot:
    where = checkpoint_location(spec.checkpoint.store, spec.checkpoint.s3, scratch, "control")
    assert isinstance(where, RemoteRoot)
    return where


def _template(_: Plain) -> dict[str, Any]:
    return {"x": torch.zeros(3)}


@pytest.fixture
def committed(s3_server: SeaweedFS, tmp_path: Path,
              process_group: None) -> tuple[QualificationSpec, RemoteRoot]:
    """The control leg's final checkpoint, committed on S3 by a worker's manager."""
    spec = _spec(s3_server, s3_server.new_bucket())
    root = _root(spec, tmp_path / "worker")
    assert rank0_manager(root, keep_last=2).save(Position(STEPS), {"x": torch.arange(3.0)},
                                                 Plain(step=STEPS)) == NAME
    assert remote.committed(root) == [Position(STEPS)]
    return spec, root


def _plant(root: RemoteRoot, marker: Path, mac: str) -> None:
    def write(rel: str, data: bytes) -> None:
        root.store.put_bytes(root.key(NAME, rel), data)

    tamper(lambda rel: root.store.get_bytes(root.key(NAME, rel)), write,
           lambda rel: root.store.delete(root.key(NAME, rel)), marker, mac)
    write(COMMITTED, b"")


def _worker_refuses(root: RemoteRoot, why: str) -> None:
    mgr = rank0_manager(root, keep_last=2)
    mgr.collect_garbage()
    with pytest.raises(CheckpointError) as info:
        name = mgr.newest()
        assert name is not None
        mgr.load(name, _template, Plain)
    assert f"checkpoint {root.uri(NAME)} " in str(info.value)
    assert why in str(info.value)


def _comparator_refuses(spec: QualificationSpec, tmp_path: Path, why: str) -> None:
    with pytest.raises(CheckpointError) as info:
        final_checkpoint(spec, RunLocation.open(str(tmp_path / "cmp")), "control")
    assert "checkpoint s3://" in str(info.value) and NAME in str(info.value)
    assert why in str(info.value)


@pytest.mark.parametrize(("mac", "why"), [
    ("attacker", "does not match manifest.hmac"),
    ("none", "has no manifest.hmac"),
])
def test_a_planted_metadata_and_rank_state_on_s3_are_refused_and_never_run(
    committed: tuple[QualificationSpec, RemoteRoot], tmp_path: Path, mac: str, why: str
) -> None:
    spec, root = committed
    marker = tmp_path / "payload-ran"
    _plant(root, marker, mac)
    assert remote.committed(root) == [Position(STEPS)]  # valid-looking: COMMITTED is there
    _worker_refuses(_root(spec, tmp_path / "resumed"), why)
    _comparator_refuses(spec, tmp_path, why)
    assert not marker.exists()


def test_without_the_run_key_the_checkpoint_is_not_loaded(
    committed: tuple[QualificationSpec, RemoteRoot], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec, _ = committed
    monkeypatch.setenv(KEY_ENV, new_key())
    _worker_refuses(_root(spec, tmp_path / "resumed"), "does not match manifest.hmac")
    monkeypatch.delenv(KEY_ENV)
    why = f"no checkpoint key: {KEY_ENV} is not set"
    _worker_refuses(_root(spec, tmp_path / "resumed"), why)
    _comparator_refuses(spec, tmp_path, why)


def test_an_authentic_checkpoint_on_s3_loads(
    committed: tuple[QualificationSpec, RemoteRoot], tmp_path: Path
) -> None:
    spec, _ = committed
    mgr = rank0_manager(_root(spec, tmp_path / "resumed"), keep_last=2)
    assert mgr.newest() == NAME
    loaded = mgr.load(NAME, _template, Plain)
    assert loaded.rank_state.model_dump() == {"step": STEPS}
    assert torch.equal(loaded.tensors["x"], torch.arange(3.0))
    final = final_checkpoint(spec, RunLocation.open(str(tmp_path / "cmp")), "control")
    assert final is not None and final.name == NAME
    assert "x" in final.reader().read_metadata().state_dict_metadata  # read where it lies
