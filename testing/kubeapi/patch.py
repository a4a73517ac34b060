"""JSON merge patch (RFC 7386): what the operator sends, and what ``kubectl apply`` sends a
custom resource (kubectl/pkg/cmd/apply/patcher.go).

JSON patch and strategic merge patch are not emulated: both are answered 415 (a real server
answers 415 for strategic merge on custom resources; nothing under test sends either).
"""

from __future__ import annotations

from typing import Any

from .errors import ApiError
from .objects import clone

MERGE = "application/merge-patch+json"


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
    """Apply a merge patch; 415 for any other patch type."""
    if content_type.split(";")[0].strip().lower() != MERGE:
        raise ApiError(415, "UnsupportedMediaType",
                       "the body of the request was in an unknown format - accepted media "
                       f"types include: {MERGE}")
    if not isinstance(patch, dict):
        raise ApiError.bad_request("a merge patch must be a JSON object")
    return dict(merge_patch(target, patch))
