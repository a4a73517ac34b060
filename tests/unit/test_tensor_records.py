"""A DCP tensor record read in place (``records.tensor_in_place``) is exactly what
``torch.load`` makes of it, views the given bytes without copying them, executes nothing
of the pickle, and gives way to ``torch.load`` for anything but the plain form."""

from __future__ import annotations

import io
import pickle
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from resumequal.checkpoint import CheckpointManager, FolderRoot, Position
from resumequal.checkpoint.records import tensor_in_place
from resumequal.checkpoint.writing import no_zip_crc
from tests.unit.rank_states import Plain


def _cases() -> Iterator[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    yield "float32 2-d", torch.randn(3, 5, generator=gen)
    yield "float64", torch.randn(7, generator=gen, dtype=torch.float64)
    yield "float16", torch.randn(4, 4, generator=gen).half()
    yield "bfloat16 0-d", torch.tensor(1.5, dtype=torch.bfloat16)
    yield "int64 offset view", torch.arange(20)[3:11]
    yield "int32", torch.arange(-5, 5, dtype=torch.int32)
    yield "int16", torch.arange(9, dtype=torch.int16)
    yield "int8", torch.arange(-3, 3, dtype=torch.int8)
    yield "uint8", torch.arange(200, 256, dtype=torch.uint8)
    yield "bool", torch.tensor([True, False, True])
    yield "complex64", torch.randn(3, generator=gen, dtype=torch.complex64)
    yield "complex128", torch.randn(2, generator=gen, dtype=torch.complex128)
    yield "transposed", torch.arange(12.0).reshape(3, 4).t()
    yield "strided view", torch.arange(30.0).reshape(5, 6)[1::2, ::3]
    yield "empty", torch.zeros(0)
    yield "empty 3-d", torch.zeros(2, 0, 3)
    yield "large", torch.randn(1 << 20, generator=gen)


def _saved(value: Any, crc: bool = True) -> memoryview:
    out = io.BytesIO()
    if crc:
        torch.save(value, out)
    else:
        with no_zip_crc():
            torch.save(value, out)
    return memoryview(bytearray(out.getvalue()))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype == torch.bool:  # compared as the bytes they hold
        a, b = a.view(torch.uint8), b.view(torch.uint8) if b.dtype == torch.bool else b
    return (a.dtype == b.dtype and a.size() == b.size() and a.stride() == b.stride()
            and a.storage_offset() == b.storage_offset() and torch.equal(a, b))


@pytest.mark.parametrize("crc", [True, False], ids=["crc", "no-crc"])
@pytest.mark.parametrize(("what", "tensor"), list(_cases()), ids=[w for w, _ in _cases()])
def test_a_plain_record_is_what_torch_load_makes_of_it_over_the_same_bytes(
        what: str, tensor: torch.Tensor, crc: bool) -> None:
    data = _saved(tensor, crc)
    got = tensor_in_place(data)
    assert got is not None, what
    assert _same(got, torch.load(io.BytesIO(bytes(data)), weights_only=True)), what
    if got.numel():  # a view of the given bytes, not a copy of them
        base = torch.frombuffer(data, dtype=torch.uint8).data_ptr()
        assert base <= got.untyped_storage().data_ptr() < base + len(data)


@pytest.mark.parametrize(("what", "value"), [
    ("a parameter", torch.nn.Parameter(torch.randn(3))),
    ("requires grad", torch.randn(3).requires_grad_()),
    ("float8", torch.randn(4).to(torch.float8_e4m3fn)),
    ("a dict of tensors", {"a": torch.randn(2)}),
    ("a list", [torch.randn(2)]),
    ("a number", 3.5),
])
def test_anything_but_one_plain_tensor_is_left_to_torch_load(what: str, value: Any) -> None:
    assert tensor_in_place(_saved(value)) is None, what


def _zip_with(pickled: bytes, data: bytes, compress: int = zipfile.ZIP_STORED) -> memoryview:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("archive/data.pkl", pickled)
        z.writestr("archive/byteorder", b"little")
        z.writestr(zipfile.ZipInfo("archive/data/0"), data, compress_type=compress)
    return memoryview(bytearray(out.getvalue()))


def test_a_pickle_that_calls_anything_else_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = (b"cbuiltins\nexec\n(Vopen(" + repr(str(marker)).encode()
            + b", 'w').close()\ntR.")
    for data in (_zip_with(evil, b""), _zip_with(pickle.dumps(("storage", 1)), b"")):
        assert tensor_in_place(data) is None
    assert not marker.exists()


def test_a_record_that_is_compressed_short_or_not_a_zip_is_left_to_torch_load() -> None:
    good = _saved(torch.arange(4.0))
    pickled = zipfile.ZipFile(io.BytesIO(bytes(good))).read("archive/data.pkl")
    raw = torch.arange(4.0).numpy().tobytes()
    assert tensor_in_place(_zip_with(pickled, raw)) is not None
    assert tensor_in_place(_zip_with(pickled, raw, zipfile.ZIP_DEFLATED)) is None
    assert tensor_in_place(_zip_with(pickled, raw[:-4])) is None  # fewer bytes than numel
    assert tensor_in_place(memoryview(bytearray(b"not a zip at all"))) is None
    assert tensor_in_place(good[:len(good) // 2]) is None  # cut short


def test_a_layout_beyond_its_storage_is_left_to_torch_load() -> None:
    pickled = zipfile.ZipFile(io.BytesIO(bytes(_saved(torch.arange(4.0))))).read(
        "archive/data.pkl")
    # The same rebuild over a storage of 4 elements, at offset 3 with 4 elements: too far.
    beyond = pickled.replace(b"K\x00K\x04\x85", b"K\x03K\x04\x85")
    assert beyond != pickled
    raw = torch.arange(4.0).numpy().tobytes()
    assert tensor_in_place(_zip_with(beyond, raw)) is None


@pytest.mark.usefixtures("single_process_group")
def test_a_restore_of_plain_tensors_never_calls_torch_load_for_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"w": torch.randn(64, 32), "b": torch.arange(7), "h": torch.randn(5).half(),
             "f8": torch.randn(6).to(torch.float8_e5m2)}
    root = FolderRoot(tmp_path)
    name = Position(2).name
    CheckpointManager(root, rank=0, world_size=1, attempt=0, keep_last=1).save(
        Position(2), state, Plain(step=2))
    loads: list[object] = []
    real_load = torch.load

    def counting_load(*args: Any, **kwargs: Any) -> Any:
        loads.append(args[0])
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", counting_load)
    template = {k: torch.zeros_like(v) for k, v in state.items()}
    fresh = CheckpointManager(root, rank=0, world_size=1, attempt=1, keep_last=1)
    assert fresh.newest() == name
    fresh.load(name, lambda _: template, Plain)
    assert len(loads) == 1  # the float8 tensor only: its storage has no legacy class
    for key, value in state.items():
        assert torch.equal(template[key].view(torch.uint8), value.view(torch.uint8)), key
