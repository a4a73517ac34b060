"""Pushing metrics to a Pushgateway stand-in on loopback: the exposition, basic auth from
the URL's credentials, and errors that never echo them."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from resumequal.errors import MetricsError
from resumequal.results.metrics import QualificationMetrics, push
from resumequal.results.verdict import Result
from tests.exposition import value
from tests.unit.report_samples import make_report

NS = "ml-platform"


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


class _Gateway:
    """A tiny Pushgateway stand-in on 127.0.0.1 that records what it receives."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def _receive(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                gateway.requests.append((self.command, self.path, dict(self.headers), body))
                self.send_response(200)
                self.end_headers()

            do_PUT = do_POST = _receive

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Gateway:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def gateway() -> Iterator[_Gateway]:
    with _Gateway() as gw:
        yield gw


def test_push_sends_the_exposition(registry: CollectorRegistry, gateway: _Gateway) -> None:
    QualificationMetrics(registry).record(make_report(Result.PASS), namespace=NS)
    push(registry, gateway.url, "resumequal", grouping_key={"run": "nightly"})
    [(method, path, headers, body)] = gateway.requests
    assert method == "PUT"
    assert path == "/metrics/job/resumequal/run/nightly"
    assert "Authorization" not in headers
    text = body.decode()
    families = {f.name for f in text_string_to_metric_families(text)}
    assert "resumequal_qualification_passed" in families
    assert value(text, "resumequal_runs_total", result="PASS") == 1.0


def test_push_sends_url_credentials_as_basic_auth(
    registry: CollectorRegistry, gateway: _Gateway
) -> None:
    QualificationMetrics(registry)
    url = gateway.url.replace("http://", "http://bot:s%40cret@")
    push(registry, url, "resumequal")
    [(_, _, headers, _)] = gateway.requests
    assert headers["Authorization"] == "Basic Ym90OnNAY3JldA=="  # bot:s@cret


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_push_to_a_closed_port_raises_without_credentials(registry: CollectorRegistry) -> None:
    QualificationMetrics(registry)
    port = _closed_port()
    with pytest.raises(MetricsError) as info:
        push(registry, f"http://bot:hunter2@127.0.0.1:{port}", "resumequal", timeout=5)
    message = str(info.value)
    assert f"http://127.0.0.1:{port}" in message
    assert "hunter2" not in message and "bot" not in message
