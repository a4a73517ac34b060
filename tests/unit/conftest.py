"""The unit tier: pure logic, so every test here is refused a socket and a process (an
attempt fails the test, naming it) and runs under a short timeout. What needs either
belongs in tests/integration (or tests/operator, tests/chart)."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from resumequal.spec import QualificationSpec
from tests.process_group import single_rank_group

UNIT_TIMEOUT_S = 30  # per test, unless it says otherwise (the fuzz tests do)

# platform.platform() asks `uname -p` once per process and caches it: ask before the guard.
platform.platform()


class TouchedTheOutside(AssertionError):
    """A unit test opened a socket or started a process."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A conftest's hook sees every collected item: only this folder's are unit tests.
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(UNIT_TIMEOUT_S))


@pytest.fixture(autouse=True)
def _no_sockets_or_processes(monkeypatch: pytest.MonkeyPatch,
                             request: pytest.FixtureRequest) -> None:
    def refuse(what: str) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            raise TouchedTheOutside(f"{request.node.nodeid} {what}: that is no unit test")
        return refused

    monkeypatch.setattr(socket.socket, "connect", refuse("connected a socket"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("connected a socket"))
    monkeypatch.setattr(socket.socket, "bind", refuse("bound a socket"))
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("started a process"))
    monkeypatch.setattr(os, "fork", refuse("forked"))


@pytest.fixture(scope="module")
def single_process_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A single-process gloo group (rank 0 of 1) over a FileStore; no network."""
    with single_rank_group(tmp_path_factory.mktemp("pg")):
        yield


@pytest.fixture
def trial_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The workload's trial build (a process of its own) stood in for: every workload
    builds. The names of the workloads it was asked to build."""
    from resumequal.local import runner, trial

    built: list[str] = []

    def trial_build(spec: QualificationSpec, python: str = "") -> float:
        built.append(spec.workload.name)
        return 0.0

    monkeypatch.setattr(trial, "trial_build", trial_build)
    monkeypatch.setattr(runner, "trial_build", trial_build)
    return built


@pytest.fixture(params=["xxh3_128", "wsum128"])
def each_digest_algorithm(request: pytest.FixtureRequest) -> Iterator[str]:
    """The test once per digest algorithm, this process digesting with it; xxh3_128 again
    afterwards."""
    from resumequal.trace import digest

    digest.use(request.param)
    try:
        yield request.param
    finally:
        digest.use(digest.DIGEST_ALGORITHM)
