"""JSON merge patch (RFC 7386, what the operator sends) and JSON patch (RFC 6902, applied
by the ``jsonpatch`` library as the API server applies it with evanphx/json-patch).

Strategic merge patch is not emulated: it is answered 415, which is what a real server
answers for custom resources (built-in kinds accept it there; nothing under test sends it).
"""

from __future__ import annotations

from typing import Any

import jsonpatch
import jsonpointer

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


def apply_patch(target: dict[str, Any], patch: Any, content_type: str) -> dict[str, Any]:
    """Apply a patch of the given content type; 415 for types the kind does not accept.

    A JSON patch that cannot be decoded is 400, one that cannot be applied (a failed
    ``test`` included) 422 (k8s.io/apiserver/pkg/endpoints/handlers/patch.go)."""
    media = content_type.split(";")[0].strip().lower()
    if media == MERGE:
        if not isinstance(patch, dict):
            raise ApiError.bad_request("a merge patch must be a JSON object")
        result = merge_patch(target, patch)
    elif media == JSON_PATCH:
        try:
            ops = jsonpatch.JsonPatch(patch)
        except (jsonpatch.InvalidJsonPatch, TypeError, AttributeError) as e:
            raise ApiError.bad_request(f"invalid JSON patch: {e}") from e
        try:
            result = ops.apply(clone(target))
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
            raise ApiError.invalid(f"jsonpatch: {e}") from e
    else:
        raise ApiError(415, "UnsupportedMediaType",
                       f"the body of the request was in an unknown format - accepted media "
                       f"types include: {JSON_PATCH}, {MERGE}")
    if not isinstance(result, dict):
        raise ApiError.bad_request("the patched document is not an object")
    return result
