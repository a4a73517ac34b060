"""How counts read in messages and reports ("1 rank", "2 ranks"), and how long a message
may be where it is shown."""

from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun, singular for exactly one: ``count(1, "rank") == "1 rank"``."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


# What a reason or message may take of a status field, a condition or an Event, in UTF-8
# bytes: the API server refuses Event messages over 1024 bytes, and a status (an etcd
# object of at most 1.5 MiB) holds several messages.
MESSAGE_BYTES = 1024


def clip(text: str, limit: int = MESSAGE_BYTES) -> str:
    """``text`` if it fits ``limit`` UTF-8 bytes, else its start and a marker saying how
    long it was, together within ``limit``."""
    data = text.encode()
    if len(data) <= limit:
        return text
    marker = f" … [truncated: {len(data)} bytes]"
    head = data[:max(0, limit - len(marker.encode()))].decode(errors="ignore")
    return head + marker
