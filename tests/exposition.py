"""Prometheus text expositions read with ``prometheus_client.parser``: a sample's value by
its name and labels, so tests assert values, never substrings."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def samples(text: str) -> list[Sample]:
    """Every sample of an exposition (a parse error fails the test)."""
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(text: str, name: str, **labels: str) -> float | None:
    """The value of the one sample ``name`` whose labels include ``labels``; None when no
    sample matches, AssertionError when several do."""
    found = [s.value for s in samples(text)
             if s.name == name and labels.items() <= s.labels.items()]
    if len(found) > 1:
        raise AssertionError(f"{len(found)} samples of {name} match {labels}")
    return found[0] if found else None


def scrape(port: int) -> str:
    """``/metrics`` of a server on loopback."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()  # type: ignore[no-any-return]
