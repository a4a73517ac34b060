"""JSON merge patch (RFC 7386) and JSON patch (RFC 6902), what the operator sends.

Strategic merge patch is not emulated: it is answered 415, which is what a real server
answers for custom resources (built-in kinds accept it there; nothing under test sends it).
"""

from __future__ import annotations

from typing import Any

from .errors import ApiError
from .objects import clone

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return clone(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError.bad_request(f"JSON pointer must start with '/': {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for part in parts[:-1]:
        node = _child(node, part, path)
    return node


def _child(node: Any, part: str, path: str) -> Any:
    try:
        if isinstance(node, list):
            return node[int(part)]
        return node[part]
    except (KeyError, IndexError, ValueError, TypeError) as e:
        raise ApiError.invalid(f"jsonpatch: path {path!r} does not exist") from e


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 operations add, remove, replace, move, copy, test on a deep copy of ``target``."""
    if not isinstance(operations, list):
        raise ApiError.bad_request("a JSON patch must be a list of operations")
    doc = clone(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError.bad_request(f"malformed JSON patch operation: {op!r}")
        name, path = op["op"], op["path"]
        if name in ("move", "copy"):
            from_parts = _pointer(op.get("from", ""))
            value = clone(_resolve(doc, from_parts, op.get("from", "")))
            if name == "move":
                doc = _remove(doc, from_parts, op["from"])
            doc = _add(doc, _pointer(path), value, path)
        elif name == "add":
            doc = _add(doc, _pointer(path), clone(op.get("value")), path)
        elif name == "remove":
            doc = _remove(doc, _pointer(path), path)
        elif name == "replace":
            parts = _pointer(path)
            _resolve(doc, parts, path)
            if not parts:
                doc = clone(op.get("value"))
            else:
                parent = _parent(doc, parts, path)
                key: Any = int(parts[-1]) if isinstance(parent, list) else parts[-1]
                parent[key] = clone(op.get("value"))
        elif name == "test":
            if _resolve(doc, _pointer(path), path) != op.get("value"):
                raise ApiError.invalid(f"jsonpatch: test operation failed at {path!r}")
        else:
            raise ApiError.bad_request(f"unknown JSON patch operation {name!r}")
    return doc


def _resolve(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for part in parts:
        node = _child(node, part, path)
    return node


def _add(doc: Any, parts: list[str], value: Any, path: str) -> Any:
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, list):
        if last == "-":
            parent.append(value)
        else:
            try:
                index = int(last)
            except ValueError as e:
                raise ApiError.invalid(f"jsonpatch: bad array index in {path!r}") from e
            if not 0 <= index <= len(parent):
                raise ApiError.invalid(f"jsonpatch: index out of range in {path!r}")
            parent.insert(index, value)
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise ApiError.invalid(f"jsonpatch: cannot add at {path!r}")
    return doc


def _remove(doc: Any, parts: list[str], path: str) -> Any:
    if not parts:
        raise ApiError.invalid("jsonpatch: cannot remove the whole document")
    parent = _parent(doc, parts, path)
    _child(parent, parts[-1], path)
    if isinstance(parent, list):
        parent.pop(int(parts[-1]))
    else:
        del parent[parts[-1]]
    return doc


def apply_patch(target: dict[str, Any], patch: Any, content_type: str) -> dict[str, Any]:
    """Apply a patch of the given content type; 415 for types the kind does not accept."""
    media = content_type.split(";")[0].strip().lower()
    if media == MERGE:
        if not isinstance(patch, dict):
            raise ApiError.bad_request("a merge patch must be a JSON object")
        result = merge_patch(target, patch)
    elif media == JSON_PATCH:
        result = json_patch(target, patch)
    else:
        raise ApiError(415, "UnsupportedMediaType",
                       f"the body of the request was in an unknown format - accepted media "
                       f"types include: {JSON_PATCH}, {MERGE}")
    if not isinstance(result, dict):
        raise ApiError.bad_request("the patched document is not an object")
    return result
