"""A ranged GET is taken only as the S3 API answers it: a 206 whose Content-Range is the
range asked for (or its part up to the object's end), and no more of the body is read
than was asked, whatever the endpoint sends. Anything else is refused saying what the
endpoint did, never read whole into memory nor taken for a changed object.

A stand-in client (no sockets in this tier); tests/integration/test_s3_checkpoint_reads.py
has an endpoint that ignores Range.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from resumequal.store.errors import StoreProtocolError
from resumequal.store.multipart import get_range

OBJECT = bytes(range(100))


@dataclass
class _Body:
    data: bytes
    asked: list[int] = field(default_factory=list)
    closed: bool = False

    def read(self, amount: int | None = None) -> bytes:
        self.asked.append(-1 if amount is None else amount)
        return self.data if amount is None else self.data[:amount]

    def close(self) -> None:
        self.closed = True


@dataclass
class _Client:
    """Answers every GetObject with ``status``, ``content_range`` and ``body``."""

    status: int
    content_range: str | None
    body: bytes
    bodies: list[_Body] = field(default_factory=list)

    class meta:  # botocore names it so
        endpoint_url = "http://user:rq-SECRET@gateway:9000"

    def get_object(self, **kwargs: Any) -> dict[str, Any]:
        body = _Body(self.body)
        self.bodies.append(body)
        answer: dict[str, Any] = {"ResponseMetadata": {"HTTPStatusCode": self.status},
                                  "Body": body, "ContentLength": len(self.body)}
        if self.content_range is not None:
            answer["ContentRange"] = self.content_range
        return answer


def _read(client: _Client, offset: int, length: int) -> bytes:
    out = bytearray(length)
    n = get_range(client, "b", "k", offset, memoryview(out), attempts=1)
    return bytes(out[:n])


def test_a_206_of_the_range_asked_for_is_read_and_no_more() -> None:
    client = _Client(206, "bytes 10-19/100", OBJECT[10:20])
    assert _read(client, 10, 10) == OBJECT[10:20]
    assert client.bodies[0].asked == [10] and client.bodies[0].closed
    # At the object's end the answer is shorter: as asked, up to the end.
    client = _Client(206, "bytes 90-99/100", OBJECT[90:])
    assert _read(client, 90, 20) == OBJECT[90:]


def test_an_endpoint_that_ignores_range_is_named_and_its_body_never_read() -> None:
    client = _Client(200, None, OBJECT)
    with pytest.raises(StoreProtocolError, match=(
            r"http://\*\*\*@gateway:9000 answered a GET of bytes 10-19 of s3://b/k with "
            r"HTTP 200 without a Content-Range: it ignores Range")) as info:
        _read(client, 10, 10)
    assert client.bodies[0].asked == [] and client.bodies[0].closed
    assert "rq-SECRET" not in str(info.value)


@pytest.mark.parametrize(("content_range", "body"), [
    ("bytes 0-99/100", OBJECT),  # the whole object as a 206
    ("bytes 11-20/100", OBJECT[11:21]),  # another range
    ("bytes 10-29/100", OBJECT[10:30]),  # more than asked
    ("bytes 10-14/100", OBJECT[10:15]),  # less, though the object goes on
    ("bytes 10-19/15", OBJECT[10:20]),  # past the size it gives
    ("bytes */100", b""), ("10-19", OBJECT[10:20]),
])
def test_a_206_of_another_range_is_refused_saying_what_was_answered(
    content_range: str, body: bytes
) -> None:
    client = _Client(206, content_range, body)
    with pytest.raises(StoreProtocolError, match=(
            r"answered a GET of bytes 10-19 of s3://b/k with .*Content-Range")):
        _read(client, 10, 10)
    assert client.bodies[0].asked == []


def test_a_206_whose_body_runs_on_is_read_only_as_far_as_asked() -> None:
    # Content-Range and Content-Length agree; the stream itself carries more.
    client = _Client(206, "bytes 10-19/100", OBJECT[10:20])
    client.body = OBJECT[10:]
    with pytest.raises(StoreProtocolError, match=r"Content-Length 90\)"):
        _read(client, 10, 10)
    client.get_object = _lying_length(client)  # type: ignore[method-assign]
    assert _read(client, 10, 10) == OBJECT[10:20]
    assert client.bodies[-1].asked == [10]


def _lying_length(client: _Client) -> Any:
    answer = client.get_object

    def get_object(**kwargs: Any) -> dict[str, Any]:
        response = answer(**kwargs)
        response["ContentLength"] = 10
        return response

    return get_object
