"""The run location's name: ``<store>/<namespace>/<run>/<uid>``, spelled once.

The operator names a run's location from its resource, and the comparator and ``zoom`` read
the namespace and run back from it. Shared with the operator's CRD models: it imports
nothing of ours (no store, no reports).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

__all__ = ["run_names", "run_uri"]


def run_uri(store_uri: str, namespace: str, name: str, uid: str) -> str:
    """The run location: ``<store>/<namespace>/<name>/<uid>`` (uid: reruns never mix)."""
    for label, part in (("namespace", namespace), ("name", name), ("uid", uid)):
        if not part or "/" in part:
            raise ValueError(f"{label} {part!r} cannot be a path segment")
    return f"{store_uri.rstrip('/')}/{namespace}/{name}/{uid}"


def run_names(uri: str) -> tuple[str, str]:
    """(namespace, run) read back from :func:`run_uri` in an object store (a URI with a
    bucket); ("local", folder name) for a folder."""
    parsed = urlparse(uri)
    if parsed.netloc:
        parts = [p for p in parsed.path.split("/") if p]
        if len(parts) >= 3:
            return parts[-3], parts[-2]
        return "default", parts[-1] if parts else "run"
    return "local", Path(parsed.path).name
