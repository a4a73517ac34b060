"""``python bench/moto_ranges.py -H 127.0.0.1 -p PORT``: moto's S3 server, ranged GETs
served from the requested bytes alone.

moto answers a ranged GET by reading the whole object and slicing it
(moto/s3/responses.py ``_handle_range_header`` on ``FakeKey.value``, itself a copy of the
whole): a GET of 4 MiB of a 600 MB object costs 1.2 GB of copies there, where S3 reads
4 MiB. Here a GET that carries a Range gets a view of the object that reads only the
slice asked for, so the bench's restores measure the protocol rather than that cost. Every
other request is served as moto serves it.
"""

from __future__ import annotations

import threading
from typing import Any

from moto.s3.models import FakeKey
from moto.s3.responses import S3Response
from moto.server import main


class _Lazy:
    """An object's bytes, read from its buffer only where sliced."""

    def __init__(self, key: Any) -> None:
        self._key = key

    def __len__(self) -> int:
        return int(self._key.size)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __getitem__(self, part: slice) -> bytes:
        start, stop, _ = part.indices(len(self))
        with self._key.lock:
            buffer = self._key._value_buffer
            buffer.seek(start)
            return bytes(buffer.read(max(0, stop - start)))


_ranged = threading.local()


def _ranged_get_object() -> None:
    value: property = vars(FakeKey)["value"]
    get_object = S3Response.get_object

    def lazy_value(key: FakeKey) -> Any:
        if getattr(_ranged, "on", False):
            return _Lazy(key)
        assert value.fget is not None
        return value.fget(key)

    def ranged(self: S3Response) -> Any:
        _ranged.on = bool(self.headers.get("range")) and not self._get_int_param("partNumber")
        try:
            return get_object(self)
        finally:
            _ranged.on = False

    FakeKey.value = property(lazy_value, value.fset)  # type: ignore[method-assign,assignment,unused-ignore]
    S3Response.get_object = ranged  # type: ignore[method-assign]


if __name__ == "__main__":
    _ranged_get_object()
    main()
