"""Events as client-go's EventRecorder writes them: core/v1, one object per distinct event,
its ``count`` raised when the same event repeats (tools/record/events_cache.go)."""

from __future__ import annotations

import uuid
from typing import Any

from .errors import ApiError
from .objects import now_rfc3339
from .patch import MERGE
from .store import Store

Obj = dict[str, Any]


class Recorder:
    """Records Events about objects on behalf of one component (``source.component``)."""

    def __init__(self, store: Store, component: str) -> None:
        self.store, self.component = store, component
        self._seen: dict[tuple[str, str, str, str], tuple[str, int]] = {}

    def event(self, obj: Obj, type_: str, reason: str, message: str) -> None:
        """Record (or count again) a ``Normal``/``Warning`` event about ``obj``."""
        meta = obj["metadata"]
        key = (meta["uid"], type_, reason, message)
        kind = self.store.registry.lookup("", "v1", "events")
        now = now_rfc3339()
        try:
            if key in self._seen:
                name, count = self._seen[key]
                self.store.patch(kind, meta["namespace"], name,
                                 {"count": count + 1, "lastTimestamp": now}, MERGE)
                self._seen[key] = (name, count + 1)
                return
            name = f"{meta['name']}.{uuid.uuid4().hex[:16]}"
            self.store.create(kind, meta["namespace"], {
                "metadata": {"name": name}, "type": type_, "reason": reason,
                "message": message, "count": 1, "firstTimestamp": now, "lastTimestamp": now,
                "source": {"component": self.component},
                "involvedObject": {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                                   "name": meta["name"], "namespace": meta["namespace"],
                                   "uid": meta["uid"]}})
            self._seen[key] = (name, 1)
        except ApiError as e:  # a recorder drops what it cannot write, as client-go's does
            if e.code not in (404, 409, 422):
                raise
