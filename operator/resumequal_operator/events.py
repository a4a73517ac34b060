"""core/v1 Events about a QualificationRun: one per phase change and one per preemption.

An Event is a notice for ``kubectl describe``, not state: failing to write one is logged
and never fails a reconcile.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from resumequal.errors import ClusterError
from resumequal.redact import redact
from resumequal.words import clip
from resumequal_operator.kube import EVENTS, Kube, Obj

log = logging.getLogger(__name__)

COMPONENT = "resumequal-operator"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Writes Events for objects, as ``resumequal-operator`` on ``instance``."""

    def __init__(self, kube: Kube, instance: str) -> None:
        self.kube, self.instance = kube, instance

    def record(self, obj: Obj, reason: str, message: str, *, warning: bool = False) -> None:
        meta = obj["metadata"]
        now = _now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            # Named like client-go's recorder (record/event.go: "<name>.<UnixNano in hex>"),
            # so a list by name, as `kubectl describe` shows it, is in the order they happened.
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}",
                         "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                               "name": meta["name"], "namespace": meta["namespace"],
                               "uid": meta["uid"]},
            "reason": reason,
            "message": clip(redact(message)),
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.kube.create(EVENTS, meta["namespace"], event)
        except ClusterError as e:
            log.warning("event %s for %s/%s not recorded: %s", reason, meta["namespace"],
                        meta["name"], e)
