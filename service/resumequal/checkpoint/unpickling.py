"""The pickles of a checkpoint besides its tensor records, read so that no code can run.

DCP pickles its ``.metadata`` and each non-tensor item of a state dict (an optimizer's
param groups: ``BYTE_IO`` items). Both are checked against the authenticated manifest
before they are read, so only a holder of the run's key could plant one; they are read
as if anyone could all the same:

- ``.metadata`` through :class:`MetadataUnpickler`, which finds DCP's metadata classes
  and the few torch and standard-library values they hold (dtypes, layouts, sizes, a
  path) and nothing else: any other global, and every persistent id, is refused.
- a ``BYTE_IO`` item with ``torch.load(weights_only=True)`` (torch's own restricted
  unpickler: containers, numbers, strings, tensors), handed to the planner as the value
  DCP's ``DefaultLoadPlanner.load_bytes`` would have made of it with
  ``weights_only=False``.
"""

from __future__ import annotations

import enum
import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadPlanner, ReadItem

from resumequal.errors import CheckpointError

__all__ = ["MetadataUnpickler", "load_item", "load_metadata"]

_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
# What DCP's metadata pickles name (torch 2.6 to 2.14): its dataclasses, the storage info of
# a file system checkpoint, and how torch pickles a layout (torch.serialization._get_layout,
# a lookup by name) and a path.
_ALLOWED = frozenset({
    (_METADATA_MODULE, "Metadata"),
    (_METADATA_MODULE, "TensorStorageMetadata"),
    (_METADATA_MODULE, "BytesStorageMetadata"),
    (_METADATA_MODULE, "ChunkStorageMetadata"),
    (_METADATA_MODULE, "TensorProperties"),
    (_METADATA_MODULE, "MetadataIndex"),
    (_METADATA_MODULE, "StorageMeta"),
    (_METADATA_MODULE, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
})


def _enum_member(cls: Any, name: Any) -> Any:
    """What ``getattr`` means in an enum's pickle, and nothing more: a member, by name, of an
    enum class the unpickler already allowed."""
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum) and isinstance(name, str)
            and name in cls.__members__):
        raise pickle.UnpicklingError(f"getattr({cls!r}, {name!r}) is not an enum member of "
                                     "DCP's metadata")
    return cls.__members__[name]


class MetadataUnpickler(pickle.Unpickler):
    """Finds DCP's metadata classes, torch's dtypes and the values listed in ``_ALLOWED``;
    UnpicklingError for any other global."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        # Python up to 3.11.4 pickles an enum member as getattr(EnumClass, "NAME")
        # (enum.Enum.__reduce_ex__; later releases call the class with the value): the
        # metadata's _MEM_FORMAT_ENCODING members written by such a Python, e.g. Debian
        # bookworm's 3.11.2, arrive that way. Only member lookups are answered.
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's metadata")
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("DCP's metadata holds no persistent ids")


def load_metadata(data: bytes, where: str) -> Metadata:
    """DCP's metadata from its checked bytes; CheckpointError naming ``where`` for anything
    but DCP's metadata (what else it would have called is never called)."""
    try:
        metadata = MetadataUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError,
            AttributeError, IndexError, RecursionError, OverflowError) as e:
        raise CheckpointError(f"checkpoint {where}: its DCP metadata is refused: "
                              f"{type(e).__name__}: {e}") from e
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"checkpoint {where}: its DCP metadata holds "
                              f"{type(metadata).__name__}, not DCP's metadata")
    return metadata


def load_item(planner: LoadPlanner, item: ReadItem, data: bytes, where: str) -> None:
    """Give ``planner`` the value of the ``BYTE_IO`` item ``item`` from its checked bytes,
    unpickled with ``weights_only``; CheckpointError naming ``where`` when the bytes hold
    what that refuses, or the planner is not DCP's default one (which would unpickle them
    itself, with ``weights_only=False``)."""
    fqn = item.dest_index.fqn
    if not isinstance(planner, DefaultLoadPlanner):
        raise CheckpointError(f"checkpoint {where}: {fqn} would be unpickled by "
                              f"{type(planner).__name__}; only DCP's default planner is given "
                              "values read with weights_only")
    try:
        value = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError) as e:
        raise CheckpointError(f"checkpoint {where}: {fqn} is refused: "
                              f"{type(e).__name__}: {str(e).splitlines()[0]}") from e
    # What DefaultLoadPlanner.load_bytes does with what it unpickled
    # (torch/distributed/checkpoint/default_planner.py).
    if planner.flatten_state_dict:
        set_element(planner.original_state_dict, planner.mappings[fqn], value)
    else:
        planner.state_dict[fqn] = value
