"""No byte of a checkpoint is unpickled in a way that could run code, even once it has
passed its check: a holder of the run's key (or a bug) that signs a manifest over planted
pickles still runs nothing. DCP's ``.metadata`` goes through an unpickler that finds DCP's
metadata classes alone; an optimizer's param-group items (DCP's ``BYTE_IO``) through
``torch.load(weights_only=True)``; a tensor record's numbers are bounded."""

from __future__ import annotations

import enum
import io
import pathlib
import pickle
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from resumequal.checkpoint import FolderRoot, Position
from resumequal.checkpoint.layout import DCP_DIR, MANIFEST
from resumequal.checkpoint.manifest import Manifest, entry_of, write_manifest_file
from resumequal.checkpoint.records import tensor_in_place
from resumequal.errors import CheckpointError
from tests.checkpoint_attacks import Payload, payload
from tests.unit.checkpoint_managers import rank0_manager
from tests.unit.rank_states import Plain

pytestmark = pytest.mark.usefixtures("single_process_group")

STEPS = 8
NAME = Position(STEPS).name
GROUPS = "groups"


def _template(_: Plain) -> dict[str, Any]:
    return {"x": torch.zeros(3), GROUPS: {"lr": 0.0}}


def _saved(tmp_path: Path) -> FolderRoot:
    root = FolderRoot(tmp_path / "checkpoints")
    assert rank0_manager(root).save(Position(STEPS), {"x": torch.arange(3.0),
                                                      GROUPS: {"lr": 0.1}},
                                    Plain(step=STEPS)) == NAME
    return root


def _resign(folder: Path, changed: dict[str, bytes]) -> None:
    """Write ``changed`` files and sign a manifest over them with the run's own key."""
    manifest = Manifest.model_validate_json((folder / MANIFEST).read_bytes())
    files = dict(manifest.files)
    for rel, data in changed.items():
        (folder / rel).write_bytes(data)
        files[rel] = entry_of(data)
    write_manifest_file(folder, manifest.model_copy(update={"files": files}))


def _load(root: FolderRoot) -> dict[str, Any]:
    mgr = rank0_manager(root)
    assert mgr.newest() == NAME
    return mgr.load(NAME, _template, Plain).tensors


def test_a_checkpoint_with_param_groups_loads(tmp_path: Path) -> None:
    loaded = _load(_saved(tmp_path))
    assert loaded[GROUPS] == {"lr": 0.1} and torch.equal(loaded["x"], torch.arange(3.0))


def test_signed_metadata_that_would_run_code_is_refused_and_never_runs(tmp_path: Path) -> None:
    root = _saved(tmp_path)
    marker = tmp_path / "payload-ran"
    _resign(root.root / NAME, {f"{DCP_DIR}/.metadata": payload(marker)})
    with pytest.raises(CheckpointError, match=r"io\.open is not part of DCP's metadata"):
        _load(root)
    assert not marker.exists()


class _OldEnumPickler(pickle.Pickler):
    """Pickles enum members as Python up to 3.11.4 does: ``getattr(EnumClass, "NAME")``."""

    def __init__(self, file: io.BytesIO, attribute: tuple[Any, str] | None = None) -> None:
        super().__init__(file)
        self.attribute = attribute

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, enum.Enum):
            cls, name = self.attribute or (type(obj), obj.name)
            return getattr, (cls, name)
        return NotImplemented


def _old_pickle(obj: Any, attribute: tuple[Any, str] | None = None) -> bytes:
    out = io.BytesIO()
    _OldEnumPickler(out, attribute).dump(obj)
    return out.getvalue()


def test_metadata_written_by_a_python_that_pickles_enums_by_getattr_loads(
    tmp_path: Path
) -> None:
    root = _saved(tmp_path)
    folder = root.root / NAME
    metadata = pickle.loads((folder / DCP_DIR / ".metadata").read_bytes())
    old = _old_pickle(metadata)
    assert b"getattr" in old
    _resign(folder, {f"{DCP_DIR}/.metadata": old})
    loaded = _load(root)
    assert torch.equal(loaded["x"], torch.arange(3.0))


@pytest.mark.parametrize("attribute", [(pathlib.PosixPath, "read_text"),
                                       (torch.Size, "__class__")])
def test_getattr_in_metadata_answers_enum_members_only(
    tmp_path: Path, attribute: tuple[Any, str]
) -> None:
    root = _saved(tmp_path)
    folder = root.root / NAME
    metadata = pickle.loads((folder / DCP_DIR / ".metadata").read_bytes())
    _resign(folder, {f"{DCP_DIR}/.metadata": _old_pickle(metadata, attribute)})
    with pytest.raises(CheckpointError, match="is not an enum member of DCP's metadata"):
        _load(root)


def test_a_signed_param_group_item_that_would_run_code_is_refused_and_never_runs(
    tmp_path: Path
) -> None:
    root = _saved(tmp_path)
    folder = root.root / NAME
    marker = tmp_path / "payload-ran"
    planted = io.BytesIO()
    torch.save(Payload(marker), planted)
    # The item now points at the planted record, appended to its shard; DCP's metadata says
    # so (written by a key holder, with an unrestricted pickle of its own).
    metadata = pickle.loads((folder / DCP_DIR / ".metadata").read_bytes())
    index, info = next((i, s) for i, s in metadata.storage_data.items() if GROUPS in i.fqn)
    shard = folder / DCP_DIR / info.relative_path
    data = shard.read_bytes()
    info.offset, info.length = len(data), len(planted.getvalue())
    metadata.storage_data[index] = info
    _resign(folder, {f"{DCP_DIR}/{info.relative_path}": data + planted.getvalue(),
                     f"{DCP_DIR}/.metadata": pickle.dumps(metadata)})
    with pytest.raises(CheckpointError, match=rf"{GROUPS}\.lr is refused: UnpicklingError"):
        _load(root)
    assert not marker.exists()


def _record(size: bytes) -> memoryview:
    """A tensor record of three floats whose pickled size is ``size`` (opcodes)."""
    saved = io.BytesIO()
    torch.save(torch.arange(3.0), saved)
    out = io.BytesIO()
    with zipfile.ZipFile(saved) as z, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as w:
        for name in z.namelist():
            body = z.read(name)
            if name.endswith("data.pkl"):
                assert body.count(b"K\x03\x85") == 1  # BININT1 3, TUPLE1: the size (3,)
                body = body.replace(b"K\x03\x85", size + b"\x85")
            w.writestr(name, body)
    return memoryview(out.getvalue())


@pytest.mark.parametrize("number", [2**63, 2**64, 2**200])
def test_a_tensor_record_with_a_size_beyond_int64_is_not_read_in_place(number: int) -> None:
    digits = number.to_bytes((number.bit_length() + 8) // 8, "little")
    long1 = b"\x8a" + bytes([len(digits)]) + digits  # LONG1
    assert tensor_in_place(_record(long1)) is None
    assert torch.equal(tensor_in_place(_record(b"K\x03")), torch.arange(3.0))  # type: ignore[arg-type]


def test_the_metadata_unpickler_reads_what_dcp_writes(tmp_path: Path) -> None:
    from resumequal.checkpoint.unpickling import load_metadata

    root = _saved(tmp_path)
    data = (root.root / NAME / DCP_DIR / ".metadata").read_bytes()
    assert load_metadata(data, "here") == pickle.loads(data)
