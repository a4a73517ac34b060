"""The cluster's processes: started detached, found again by a tag, all stopped at the end.

Every process of a local cluster — etcd, the API server, the controllers, the node agent,
the S3 server and every pod the node agent runs, with whatever those start — carries
``RESUMEQUAL_CLUSTER=<cluster id>`` in its environment, inherited by its children. So
``cluster down`` (or a test session's teardown) finds all of them through /proc, whoever
their parent is by then, and nothing of a cluster outlives it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from resumequal.local.processes import alive, tagged

from .errors import ClusterError

log = logging.getLogger(__name__)

TAG = "RESUMEQUAL_CLUSTER"
__all__ = [
    "TAG",
    "ClusterError",
    "http_ok",
    "log_tail",
    "start",
    "stop_all",
    "stopped_after",
    "wait_until",
]


def start(name: str, argv: Sequence[str], *, cluster: str, logs: Path,
          env: Mapping[str, str] | None = None, cwd: Path | None = None,
          nice: int = 0) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session of its own, its output in ``logs/<name>.log``."""
    logs.mkdir(parents=True, exist_ok=True)
    full = {**os.environ, **(env or {}), TAG: cluster}
    log.info("starting %s: %s", name, " ".join(argv))
    with open(logs / f"{name}.log", "ab") as out:
        try:
            return subprocess.Popen(
                list(argv), env=full, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=(lambda: os.nice(nice)) if nice else None)
        except OSError as e:
            raise ClusterError(f"{name}: cannot start {argv[0]}: {e}") from e


def log_tail(logs: Path, name: str, lines: int = 30) -> str:
    """The end of a component's log, for an error message."""
    try:
        text = (logs / f"{name}.log").read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def wait_until(what: str, ready: Callable[[], bool], timeout: float, *,
               proc: subprocess.Popen[bytes] | None = None, logs: Path | None = None,
               name: str = "", interval: float = 0.2) -> None:
    """Poll ``ready`` until it holds; fail naming ``what`` (with the log's tail) when the
    process ends first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not ready():
        tail = f"\n{log_tail(logs, name)}" if logs and name else ""
        if proc is not None and proc.poll() is not None:
            raise ClusterError(f"{what}: the process exited {proc.returncode}{tail}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{what}: not ready within {timeout:.0f} s{tail}")
        time.sleep(interval)


def http_ok(url: str, *, context: ssl.SSLContext | None = None) -> bool:
    """Whether GET ``url`` answers 200 (any error: not yet)."""
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError, ValueError):
        return False


def stop_all(cluster: str, *, grace: float = 10.0) -> list[int]:
    """SIGTERM every process of the cluster, SIGKILL what is left after ``grace``;
    returns the pids found. Ends only when none is left."""
    found = sorted(set(tagged(cluster, TAG)) - {os.getpid()})
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in found):
        time.sleep(0.1)
    for _ in range(50):
        left = [p for p in set(tagged(cluster, TAG)) | set(found)
                if p != os.getpid() and alive(p)]
        if not left:
            return found
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    raise ClusterError(f"processes of cluster {cluster} survive SIGKILL: {left}")


@contextlib.contextmanager
def stopped_after(what: str, *, grace: float = 1.0) -> Iterator[str]:
    """A fresh tag for the processes started inside (a test session's server); at the end
    every one of them is stopped (SIGKILL after ``grace``) and none may be left."""
    tag = f"tests-{uuid.uuid4().hex[:10]}"
    try:
        yield tag
    finally:
        stop_all(tag, grace=grace)
        left = sorted(set(tagged(tag, TAG)) - {os.getpid()})
        if left:
            raise ClusterError(f"{what} processes outlive the session: {left}")
