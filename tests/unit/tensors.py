"""Small tensor helpers shared by the checkpoint tests."""

from __future__ import annotations

from typing import Any

import torch


def clone_tree(obj: Any) -> Any:
    """A deep copy of nested dicts/lists/tuples whose tensors are detached clones."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: clone_tree(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(clone_tree(v) for v in obj)
    return obj
