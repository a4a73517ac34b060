"""``resumequal-operator run``: options, and a real process that stops cleanly on SIGTERM."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from resumequal_operator import service
from resumequal_operator.allowlist import Allowlist
from resumequal_operator.kube import LEASES, QUALIFICATION_RUNS
from resumequal_operator.main import main
from resumequal_operator.service import ServiceOptions, freeze_startup, settings_from
from testing.cluster.testapi import RealAPI
from testing.operator.harness import (
    NAMESPACE,
    condition,
    run_manifest,
    wait_phase,
    write_kubeconfig,
)
from testing.ports import free_port
from tests.waiting import eventually


def test_run_options_and_defaults() -> None:
    result = CliRunner().invoke(main, ["run", "--help"])
    assert result.exit_code == 0
    for option in ("--namespace", "--all-namespaces", "--port", "--leader-elect",
                   "--no-leader-elect", "--lease-name", "--lease-namespace",
                   "--resync-seconds", "--workers", "--allow-image", "--allow-service-account",
                   "--allow-bucket", "--allow-endpoint"):
        assert option in result.output
    s = settings_from(ServiceOptions(), {"POD_NAME": "op-0", "POD_NAMESPACE": "infra"})
    assert s.namespaces == ("infra",) and s.identity == "op-0"
    assert (s.lease.name, s.lease.namespace) == ("resumequal-operator", "infra")
    s = settings_from(ServiceOptions(all_namespaces=True, lease_namespace="x"), {})
    assert s.namespaces == () and s.lease.namespace == "x"
    assert s.allowlist == Allowlist()  # no endpoint a run may name
    narrow = Allowlist(images=("ghcr.io/acme/*",))
    assert settings_from(ServiceOptions(allowlist=narrow), {}).allowlist is narrow


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_start_up_is_frozen_and_the_collector_still_collects_what_comes_after() -> None:
    gc.unfreeze()
    try:
        freeze_startup()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        # Garbage in cycles made afterwards is still found by the collector.
        cycle = _Cycle()
        gone = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()


def test_serve_freezes_start_up_before_the_operator_runs(
    api: RealAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    frozen: list[int] = []

    def run_until(self: Any, stop: threading.Event) -> None:
        frozen.append(gc.get_freeze_count())
        self.health.server.server_close()  # bound, never started

    monkeypatch.setattr(service, "cluster_configuration", api.configuration)
    monkeypatch.setattr(service.Operator, "run_until", run_until)
    monkeypatch.setattr(service.signal, "signal", lambda *args: None)  # pytest's stay
    gc.unfreeze()
    try:
        service.serve(ServiceOptions(namespaces=(NAMESPACE,), port=0, leader_elect=False,
                                     crd_policy="skip"))
    finally:
        gc.unfreeze()
    assert len(frozen) == 1 and frozen[0] > 0


def test_the_operator_process_reconciles_and_stops_on_sigterm(
    api: RealAPI, store: dict[str, str], tmp_path: Path, aws_env: dict[str, str]
) -> None:
    port = free_port()
    env = dict(os.environ, KUBECONFIG=str(write_kubeconfig(api, tmp_path / "kubeconfig")),
               POD_NAME="op-process", POD_NAMESPACE=NAMESPACE)
    env.pop("KUBERNETES_SERVICE_HOST", None)
    cmd = [sys.executable, "-c", "from resumequal_operator.main import main; main()", "run",
           "--port", str(port), "--poll-seconds", "0.1",
           f"--allow-endpoint={store['endpointUrl']}"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        eventually(lambda: _get(f"http://127.0.0.1:{port}/readyz") == 200, timeout=20,
                   what="/readyz")
        assert _get(f"http://127.0.0.1:{port}/healthz") == 200
        api.create(QUALIFICATION_RUNS.plural, run_manifest("cli", store, world={"nnodes": 1}))
        failed = wait_phase(api, "cli", "Failed", timeout=20)
        assert "spec.preemption" in condition(failed, "Ready")["message"]
        lease = api.get(LEASES.plural, NAMESPACE, "resumequal-operator")
        assert lease is not None and lease["spec"]["holderIdentity"] == "op-process"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out.decode(errors="replace")[-2000:]
    assert b"stopped" in out
    lease = api.get(LEASES.plural, NAMESPACE, "resumequal-operator")
    assert lease is not None and lease["spec"]["holderIdentity"] == ""  # released


def test_the_operator_refuses_to_start_on_a_crd_it_may_not_update(
    api: RealAPI, tmp_path: Path
) -> None:
    from tests.operator.test_crdsync import _old_crd

    api.register_crd(_old_crd())
    env = dict(os.environ, KUBECONFIG=str(write_kubeconfig(api, tmp_path / "kubeconfig")),
               POD_NAME="op-verify", POD_NAMESPACE=NAMESPACE)
    env.pop("KUBERNETES_SERVICE_HOST", None)
    cmd = [sys.executable, "-c", "from resumequal_operator.main import main; main()", "run",
           "--port", str(free_port()), "--crd", "verify"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "qualificationruns.resumequal.dev" in proc.stderr
    assert "--crd=apply" in proc.stderr
