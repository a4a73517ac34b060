"""The health port against idle and slow clients: a timeout per connection, and a bound on
the connections (threads) served at once."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from resumequal_operator.runtime.health import HealthServer
from tests.waiting import eventually

IDLE = 300


@pytest.fixture
def server() -> Iterator[HealthServer]:
    health = HealthServer(CollectorRegistry(), lambda: None, lambda: None, port=0,
                          host="127.0.0.1", timeout_seconds=1.0, max_connections=8)
    health.start()
    try:
        yield health
    finally:
        health.stop()


def _healthz(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
        return int(r.status)


def test_idle_sockets_do_not_hold_a_thread_each(server: HealthServer) -> None:
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5)
            for _ in range(IDLE)]
    try:
        time.sleep(0.5)  # every connection accepted (or refused) by now
        assert threading.active_count() - before <= 8
        # Once the served ones time out, probes are answered again.
        assert eventually(lambda: _probe(server.port) == 200, timeout=10,
                          what="/healthz answered with 300 idle sockets open")
    finally:
        for s in idle:
            s.close()


def _probe(port: int) -> int:
    try:
        return _healthz(port)
    except OSError:
        return 0


def test_an_idle_connection_is_closed_after_the_timeout(server: HealthServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\n")  # and never the end of the headers
        start = time.monotonic()
        while s.recv(1024):  # whatever it answers, then the end of the connection
            pass
        closed_after = time.monotonic() - start
    assert 0.5 < closed_after < 5, closed_after
    assert _healthz(server.port) == 200
