"""Plain-value encoding of a library's state dict, so that a checkpoint can hold it as JSON.

Rank state is JSON, never a pickle (see :mod:`resumequal.train.state`), but the state dicts of
data loaders hold more than JSON can: tuples, tensors (a sampler's generator state), NumPy
arrays, dicts with integer keys. :func:`encode` turns such a value into JSON values, tagging
what JSON lacks as a one-key object (``{"$tensor": ...}``, ``{"$tuple": [...]}``);
:func:`decode` turns it back. Anything else — an arbitrary object, a callable — is refused
with a ``TypeError`` naming its path in the state, never pickled.

Tensor and array bytes are stored little-endian, in the machine's order on every platform
torch supports for training; only numeric and boolean dtypes are accepted.
"""

from __future__ import annotations

import base64
import math
from typing import Any, Final

import numpy as np
import torch

__all__ = ["decode", "encode"]

_TENSOR_DTYPES: Final[dict[str, torch.dtype]] = {
    str(d).removeprefix("torch."): d
    for d in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
              torch.float16, torch.bfloat16, torch.float32, torch.float64)
}
_ARRAY_KINDS: Final = "biuf"  # bool, signed, unsigned, float: no objects, strings or voids
_MAX_DEPTH: Final = 64
_TAGS: Final = ("$tuple", "$dict", "$bytes", "$tensor", "$ndarray", "$float")


def encode(value: Any, where: str = "state") -> Any:
    """``value`` as JSON values; ``TypeError`` names the path of anything that cannot be."""
    return _encode(value, where, 0)


def _encode(value: Any, where: str, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise TypeError(f"{where}: nested deeper than {_MAX_DEPTH} levels")
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        # JSON has no NaN or infinities; repr() round-trips every float exactly.
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, np.generic) and value.dtype.kind in _ARRAY_KINDS:
        return _encode(value.item(), where, depth)
    if isinstance(value, list):
        return [_encode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {"$tuple": [_encode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: _encode(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
        return {"$dict": [[_encode(k, f"{where} key {k!r}", depth + 1),
                           _encode(v, f"{where}[{k!r}]", depth + 1)] for k, v in value.items()]}
    if isinstance(value, bytes | bytearray):
        return {"$bytes": _b64(bytes(value))}
    if isinstance(value, torch.Tensor):
        return {"$tensor": _tensor(value, where)}
    if isinstance(value, np.ndarray):
        return {"$ndarray": _array(value, where)}
    raise TypeError(
        f"{where}: a {type(value).__module__}.{type(value).__qualname__} cannot be stored in a "
        "checkpoint (JSON values, tuples, bytes, tensors and NumPy arrays can; nothing is "
        "pickled)"
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _tensor(t: torch.Tensor, where: str) -> dict[str, Any]:
    name = str(t.dtype).removeprefix("torch.")
    if name not in _TENSOR_DTYPES:
        raise TypeError(f"{where}: a tensor of dtype {name} cannot be stored; allowed: "
                        f"{', '.join(_TENSOR_DTYPES)}")
    if t.layout != torch.strided:
        raise TypeError(f"{where}: a {t.layout} tensor cannot be stored; only dense tensors")
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return {"dtype": name, "shape": list(t.shape), "data": _b64(data)}


def _array(a: np.ndarray[Any, Any], where: str) -> dict[str, Any]:
    if a.dtype.kind not in _ARRAY_KINDS:
        raise TypeError(f"{where}: a NumPy array of dtype {a.dtype} cannot be stored; only "
                        "boolean, integer and float arrays")
    data = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
    return {"dtype": a.dtype.name, "shape": list(a.shape), "data": _b64(data)}


def decode(value: Any, where: str = "state") -> Any:
    """The value :func:`encode` was given; ``ValueError`` names the path of a bad tag."""
    return _decode(value, where, 0)


def _decode(value: Any, where: str, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise ValueError(f"{where}: nested deeper than {_MAX_DEPTH} levels")
    if isinstance(value, list):
        return [_decode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value
    tag = next((k for k in value if k.startswith("$")), None)
    if tag is None:
        return {k: _decode(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
    if len(value) != 1 or tag not in _TAGS:
        raise ValueError(f"{where}: {sorted(value)} is not an encoded value (tags: "
                         f"{', '.join(_TAGS)})")
    body = value[tag]
    try:
        if tag == "$tuple":
            return tuple(_decode(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(body))
        if tag == "$dict":
            return {_decode(k, f"{where} key", depth + 1): _decode(v, f"{where}[{k!r}]",
                                                                   depth + 1) for k, v in body}
        if tag == "$float":
            return float(body)
        if tag == "$bytes":
            return base64.b64decode(body, validate=True)
        if tag == "$tensor":
            return _decode_tensor(body)
        return _decode_array(body)
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(f"{where}: a bad {tag} value: {e}") from e


def _decode_tensor(body: dict[str, Any]) -> torch.Tensor:
    dtype = _TENSOR_DTYPES[body["dtype"]]
    shape = [int(n) for n in body["shape"]]
    data = base64.b64decode(body["data"], validate=True)
    if not data:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype)
    return flat.reshape(shape).clone()


def _decode_array(body: dict[str, Any]) -> np.ndarray[Any, Any]:
    dtype = np.dtype(body["dtype"])
    if dtype.kind not in _ARRAY_KINDS:
        raise ValueError(f"dtype {dtype} is not boolean, integer or float")
    data = base64.b64decode(body["data"], validate=True)
    flat = np.frombuffer(data, dtype=dtype.newbyteorder("<"))
    return flat.astype(dtype).reshape([int(n) for n in body["shape"]])
