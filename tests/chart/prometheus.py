"""A real Prometheus (the Debian package's binary) on loopback, scraping a real resumequal
metrics endpoint, for the tests of the alert rules and the dashboard queries."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml
from prometheus_client import CollectorRegistry, start_http_server

from testing.ports import free_port

JOB = "resumequal-operator"
T = TypeVar("T")


@contextmanager
def metrics_endpoint(registry: CollectorRegistry) -> Iterator[int]:
    """Serve ``registry`` at http://127.0.0.1:<port>/metrics, as the operator does."""
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class Prometheus:
    """Client of one running Prometheus' HTTP API."""

    def __init__(self, port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.proc = proc
        self.log = log

    def _get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=5) as response:
            return json.load(response)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector; AssertionError with Prometheus' error."""
        try:
            body = self._get("/api/v1/query", query=expr)
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{expr}: {e.read().decode(errors='replace')}") from None
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        alerts: list[dict[str, Any]] = self._get("/api/v1/alerts")["data"]["alerts"]
        return alerts

    def wait_for(self, what: str, probe: Callable[[], T | None], timeout: float = 60) -> T:
        """Poll ``probe`` until it returns something truthy; fail after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                found = probe()
            except OSError:  # not listening yet
                found = None
            if found:
                return found
            time.sleep(0.5)
        raise AssertionError(f"no {what} within {timeout} s; log:\n{self.log.read_text()[-3000:]}")


@contextmanager
def running_prometheus(
    workdir: Path, target_port: int, rule_files: list[Path], more_jobs: dict[str, int] | None = None
) -> Iterator[Prometheus]:
    """Prometheus scraping and evaluating every second; its job is named like the chart's
    (``more_jobs``: further jobs by name, each scraping one port)."""
    binary = shutil.which("prometheus")
    assert binary is not None, "prometheus is not installed (make tools)"
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": job,
                # The run's namespace label wins over the target's, as with the chart's
                # ServiceMonitor (honorLabels).
                "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
            }
            for job, port in {JOB: target_port, **(more_jobs or {})}.items()
        ],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = workdir / "prometheus.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield Prometheus(port, proc, log)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
