"""``python -m tests.moto_s3``: moto's S3 server, with conditional writes decided as S3
decides them.

moto's PutObject looks for the key an ``If-None-Match: *`` forbids, then writes
(moto/s3/responses.py ``S3Response.put_object``): another request's write can land between
the two, and of writers racing to create one key several are told they created it. S3
decides a conditional write atomically: of conditional writes racing on one key, one
succeeds and the others get 412 Precondition Failed, or 409 while the winner's write is in
flight (AWS S3 User Guide, "Add preconditions to S3 operations with conditional
requests"). Here one lock makes the look and the write one step for every PutObject that
carries a condition; writes without one are served as moto serves them.

``RESUMEQUAL_TEST_MOTO_PUT_PAUSE`` (seconds) pauses every PutObject between its look and
its write, and ``RESUMEQUAL_TEST_MOTO_UNLOCKED=1`` leaves moto as it is: together they make
moto's race certain, for the test that shows the lock closes it.
``RESUMEQUAL_TEST_MOTO_IGNORE_RANGE=1`` makes it an endpoint that ignores ``Range``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from moto.s3.responses import S3Response
from moto.server import main

PAUSE_ENV = "RESUMEQUAL_TEST_MOTO_PUT_PAUSE"
# "1": GetObject ignores Range and answers 200 with the whole object, as some gateways do.
IGNORE_RANGE_ENV = "RESUMEQUAL_TEST_MOTO_IGNORE_RANGE"
UNLOCKED_ENV = "RESUMEQUAL_TEST_MOTO_UNLOCKED"

_CONDITIONAL = threading.Lock()


def _serialize_conditional_puts() -> None:
    put_object = S3Response.put_object

    def conditional_put_object(self: S3Response) -> Any:
        if self.headers.get("If-None-Match") or self.headers.get("If-Match"):
            with _CONDITIONAL:
                return put_object(self)
        return put_object(self)

    S3Response.put_object = conditional_put_object  # type: ignore[method-assign]


def _pause_between_look_and_write(seconds: float) -> None:
    # The object lock's details are read after the look and before the write.
    details = S3Response._get_lock_details

    def paused(self: S3Response, *args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return details(self, *args, **kwargs)

    S3Response._get_lock_details = paused  # type: ignore[method-assign]


def _ignore_range() -> None:
    def whole(self: S3Response, request: Any, headers: dict[str, Any], content: Any) -> Any:
        return 200, headers, content

    S3Response._handle_range_header = whole  # type: ignore[method-assign]


if __name__ == "__main__":
    if os.environ.get(IGNORE_RANGE_ENV) == "1":
        _ignore_range()
    if os.environ.get(PAUSE_ENV):
        _pause_between_look_and_write(float(os.environ[PAUSE_ENV]))
    if os.environ.get(UNLOCKED_ENV) != "1":
        _serialize_conditional_puts()
    main()
