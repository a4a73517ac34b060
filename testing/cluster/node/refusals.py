"""What the API server's refusal of a write says about the pod the agent wrote for (pure:
the unit tests read it without starting anything)."""

from __future__ import annotations

import json

from kubernetes.client import ApiException


def recreated(e: ApiException) -> bool:
    """The API refused a write for the uid it named: the pod was recreated under its name."""
    if e.status != 422:
        return False
    try:
        causes = json.loads(e.body or "{}").get("details", {}).get("causes") or []
    except (ValueError, AttributeError):
        return False
    return any(isinstance(c, dict) and c.get("field") == "metadata.uid" for c in causes)
