"""A tensor record of a DCP file, read in place: the tensor over the checked bytes
themselves, without ``torch.load``'s copy of them into a storage of its own.

DCP writes each tensor item as one ``torch.save``: a zip whose ``<archive>/data.pkl`` says
how to rebuild the tensor (``torch._utils._rebuild_tensor_v2`` of a storage, its offset,
size and stride) and whose ``<archive>/data/<key>`` holds the storage's bytes, stored
uncompressed. :func:`tensor_in_place` reads the zip's directory and the pickle's *opcodes*
(``pickletools.genops``: nothing is executed or imported) and views the storage's bytes as
that tensor. Anything but that one plain form (another rebuild, a tensor subclass, tensor
metadata, another byte order, a compressed record) gives None and the caller loads the
record with ``torch.load`` as DCP does. The bytes given here were checked against the
manifest before (:mod:`resumequal.checkpoint.reading`); the tensor aliases them, so it is
used (copied into its destination) before they are released.
"""

from __future__ import annotations

import io
import os
import pickletools
import struct
import sys
import zipfile
from typing import NamedTuple

import torch
from typing_extensions import Buffer

__all__ = ["Memory", "tensor_in_place"]

# The legacy storage class a tensor's pickle names, by dtype (torch/storage.py).
_STORAGE_DTYPES: dict[str, torch.dtype] = {
    "DoubleStorage": torch.float64, "FloatStorage": torch.float32,
    "HalfStorage": torch.float16, "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64, "IntStorage": torch.int32, "ShortStorage": torch.int16,
    "CharStorage": torch.int8, "ByteStorage": torch.uint8, "BoolStorage": torch.bool,
    "ComplexDoubleStorage": torch.complex128, "ComplexFloatStorage": torch.complex64,
}
# A zip's local file header (APPNOTE.TXT 4.3.7; zipfile's structFileHeader).
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
_LOCAL_MAGIC = b"PK\003\004"


class Memory(io.RawIOBase):
    """A read-only, seekable file over bytes in memory, without copying them."""

    def __init__(self, data: memoryview) -> None:
        super().__init__()
        self._data = data
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Buffer) -> int:
        out = memoryview(b).cast("B")
        n = max(0, min(len(out), len(self._data) - self._pos))
        out[:n] = self._data[self._pos:self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: len(self._data)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


class _Global(NamedTuple):
    module: str
    name: str


class _Persistent(NamedTuple):
    pid: object


class _Rebuild(NamedTuple):
    args: tuple[object, ...]


_REBUILD = _Global("torch._utils", "_rebuild_tensor_v2")
_HOOKS = _Global("collections", "OrderedDict")
_NO_HOOKS = ("no backward hooks",)
_IMMEDIATE = frozenset({"BININT", "BININT1", "BININT2", "LONG1", "BINUNICODE",
                        "SHORT_BINUNICODE", "BINUNICODE8"})
_TUPLE_N = {"EMPTY_TUPLE": 0, "TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}


class _NotPlain(Exception):
    """The pickle is not the one form read here."""


def _reduce(fn: object, args: object) -> object:
    if fn == _HOOKS and args == ():
        return _NO_HOOKS
    if fn == _REBUILD and isinstance(args, tuple):
        return _Rebuild(args)
    raise _NotPlain


def _step(op: str, arg: object, stack: list[object], marks: list[int],
          memo: dict[object, object]) -> None:
    """One opcode of the plain form: values only, nothing called."""
    if op in _IMMEDIATE:
        stack.append(arg)
    elif op == "GLOBAL" and isinstance(arg, str):
        module, _, name = arg.partition(" ")
        stack.append(_Global(module, name))
    elif op in ("BINPUT", "LONG_BINPUT"):
        memo[arg] = stack[-1]
    elif op == "MEMOIZE":
        memo[len(memo)] = stack[-1]
    elif op in ("BINGET", "LONG_BINGET"):
        stack.append(memo[arg])
    elif op == "MARK":
        marks.append(len(stack))
    elif op == "TUPLE" or op in _TUPLE_N:
        start = marks.pop() if op == "TUPLE" else len(stack) - _TUPLE_N[op]
        if start < 0:
            raise _NotPlain
        items = tuple(stack[start:])
        del stack[start:]
        stack.append(items)
    elif op in ("NEWTRUE", "NEWFALSE"):
        stack.append(op == "NEWTRUE")
    elif op == "BINPERSID":
        stack.append(_Persistent(stack.pop()))
    elif op == "REDUCE":
        args = stack.pop()
        stack.append(_reduce(stack.pop(), args))
    elif op != "PROTO":
        raise _NotPlain


def _rebuild_args(pickled: bytes) -> tuple[object, ...] | None:
    """The arguments of the pickle's ``_rebuild_tensor_v2`` call; None for anything else."""
    stack: list[object] = []
    marks: list[int] = []
    memo: dict[object, object] = {}
    try:
        for op, arg, _ in pickletools.genops(pickled):
            if op.name == "STOP":
                break
            _step(op.name, arg, stack, marks, memo)
        else:
            return None
    except (_NotPlain, ValueError, KeyError, IndexError):
        return None
    if len(stack) != 1 or not isinstance(stack[0], _Rebuild):
        return None
    return stack[0].args


# What torch takes for a size, a stride, an offset or a count (an int64): a larger number,
# which a pickle's LONG1 holds, is no tensor's.
_INT_BOUND = 1 << 63


def _int(value: object) -> int | None:
    return value if type(value) is int and 0 <= value < _INT_BOUND else None


def _ints(value: object) -> tuple[int, ...] | None:
    if isinstance(value, tuple) and all(_int(v) is not None for v in value):
        return value
    return None


class _Layout(NamedTuple):
    key: str
    dtype: torch.dtype
    numel: int
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _layout(args: tuple[object, ...]) -> _Layout | None:
    """What a plain ``_rebuild_tensor_v2(storage, offset, size, stride, False, {})`` says."""
    if len(args) != 6:  # a 7th: tensor metadata, which only torch.load restores
        return None
    storage, offset, size, stride, requires_grad, hooks = args
    if not isinstance(storage, _Persistent) or hooks != _NO_HOOKS or requires_grad is not False:
        return None
    pid = storage.pid
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
        return None
    _, cls, key, _location, numel = pid
    dtype = (_STORAGE_DTYPES.get(cls.name) if isinstance(cls, _Global) and cls.module == "torch"
             else None)
    sizes, strides = _ints(size), _ints(stride)
    count, start = _int(numel), _int(offset)
    if (dtype is None or not isinstance(key, str) or count is None or start is None
            or sizes is None or strides is None or len(sizes) != len(strides)):
        return None
    return _Layout(key, dtype, count, start, sizes, strides)


def _record_bytes(data: memoryview, z: zipfile.ZipFile, name: str) -> memoryview | None:
    """The bytes of record ``name`` where they lie in ``data`` (stored, not compressed)."""
    try:
        info = z.getinfo(name)
    except KeyError:
        return None
    if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:  # encrypted
        return None
    at = info.header_offset
    if at < 0 or at + _LOCAL_HEADER.size > len(data):
        return None
    header = _LOCAL_HEADER.unpack(data[at:at + _LOCAL_HEADER.size])
    if header[0] != _LOCAL_MAGIC:
        return None
    start = at + _LOCAL_HEADER.size + header[10] + header[11]  # name, extra field
    end = start + info.file_size
    return data[start:end] if end <= len(data) else None


def tensor_in_place(data: memoryview) -> torch.Tensor | None:
    """The tensor that ``torch.load`` would make of the ``torch.save`` output ``data``,
    viewing ``data`` itself; None unless it is one plain CPU tensor (then use torch.load)."""
    if sys.byteorder != "little":
        return None
    try:
        with zipfile.ZipFile(Memory(data)) as z:  # reads the central directory only
            pickles = [n for n in z.namelist() if n.endswith("/data.pkl")]
            if len(pickles) != 1:
                return None
            prefix = pickles[0].removesuffix("data.pkl")
            # Read where they lie: a save of ours writes no zip CRC (the digests cover them).
            order = _record_bytes(data, z, f"{prefix}byteorder")
            pickled = _record_bytes(data, z, pickles[0])
            if (order is not None and bytes(order) != b"little") or pickled is None:
                return None
            args = _rebuild_args(bytes(pickled))
            layout = _layout(args) if args is not None else None
            if layout is None:
                return None
            raw = _record_bytes(data, z, f"{prefix}data/{layout.key}")
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error):
        return None
    if raw is None or len(raw) != layout.numel * layout.dtype.itemsize:
        return None
    if layout.numel == 0:
        storage = torch.empty(0, dtype=layout.dtype)
    else:
        storage = torch.frombuffer(raw, dtype=torch.uint8).view(layout.dtype)
    try:
        return storage.as_strided(layout.size, layout.stride, layout.offset)
    except (RuntimeError, TypeError, OverflowError):  # out of the storage's bounds, or of
        return None                                   # an int64: torch.load names it
