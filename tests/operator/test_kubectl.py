"""The real ``kubectl`` against the test's API server, as a user drives a QualificationRun:
``apply`` (server-side field validation), ``get`` with the printer columns as the run
progresses, ``get -w``, ``describe`` (camelCase spec and status, Events) and ``delete``.

kubectl talks to the test's proxy over loopback HTTP with a kubeconfig of its own and a
private cache directory; nothing else is read from the machine. The run that kubectl
follows has its pods on the pod cluster.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from resumequal.results.verdict import Result
from testing.cluster.podcluster import PodCluster
from testing.cluster.testapi import RealAPI
from testing.operator.harness import (
    NAMESPACE,
    Operators,
    flush_events,
    run_manifest,
    wait_phase,
    write_kubeconfig,
)
from tests.tools import require

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qualificationrun.yaml"
PHASES = ("Pending", "LegsRunning", "Armed", "Preempted", "Resumed", "Comparing", "Succeeded",
          "Failed")
HEADER = ["NAME", "PHASE", "VERDICT", "FIRST", "DIVERGENCE", "PIN", "AGE"]

pytestmark = pytest.mark.timeout(240)


class Kubectl:
    """Runs kubectl against ``api`` in ``namespace``, with its own kubeconfig and cache."""

    def __init__(self, api: RealAPI, home: Path, namespace: str) -> None:
        self.binary = require("kubectl")
        home.mkdir(parents=True, exist_ok=True)
        config = write_kubeconfig(api, home / "kubeconfig", namespace)
        self.env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home),
                    "KUBECONFIG": str(config)}

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([self.binary, *args], env=self.env, capture_output=True,
                                text=True, timeout=60, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {result.returncode}: "
                                 f"{result.stderr}")
        return result

    @contextmanager
    def streaming(self, *args: str) -> Iterator[Lines]:
        """A long-running kubectl (``get -w``) whose output lines arrive in ``Lines``."""
        proc = subprocess.Popen([self.binary, *args], env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        lines = Lines(proc)
        try:
            yield lines
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            lines.reader.join(timeout=10)


class Lines:
    """The stdout lines of a running process, collected by a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()

    def wait_for(self, predicate: Callable[[list[str]], bool], timeout: float) -> list[str]:
        with self.changed:
            if not self.changed.wait_for(lambda: predicate(self.lines), timeout):
                raise AssertionError(f"kubectl printed {self.lines} (exit "
                                     f"{self.proc.poll()}) within {timeout}s")
            return list(self.lines)


def words(output: str) -> list[list[str]]:
    """kubectl's table, a row per line as its words (empty cells print as nothing)."""
    return [line.split() for line in output.splitlines() if line.strip()]


def without_age(row: list[str]) -> list[str]:
    assert re.fullmatch(r"\d+s", row[-1]), row  # AGE, from metadata.creationTimestamp
    return row[:-1]


@pytest.fixture
def kubectl(api: RealAPI, tmp_path: Path) -> Kubectl:
    return Kubectl(api, tmp_path / "kubectl", NAMESPACE)


def test_apply_the_example_then_get_describe_and_delete(api: RealAPI, tmp_path: Path) -> None:
    api.create("namespaces", {"metadata": {"name": "training"}})  # the example's namespace
    kubectl = Kubectl(api, tmp_path / "kubectl", "training")
    created = kubectl("apply", "-f", str(EXAMPLE))
    assert created.stdout.strip() == "qualificationrun.resumequal.dev/nightly-2026-11-29 created"
    assert created.stderr == ""  # no warning: every field is one the CRD declares
    # kubectl left validation to the server, as it does with any API server that says so.
    assert any(m == "POST" and "fieldValidation=Strict" in p for m, p in api.requests)
    stored = api.get("qr", "training", "nightly-2026-11-29")
    assert stored is not None and stored["spec"]["world"]["nprocPerNode"] == 2
    again = kubectl("apply", "-f", str(EXAMPLE))
    assert again.stdout.strip().endswith(" unchanged")

    header, row = words(kubectl("get", "qr").stdout)
    assert header == HEADER
    assert without_age(row) == ["nightly-2026-11-29"]  # no status yet: empty cells

    described = kubectl("describe", "qr", "nightly-2026-11-29").stdout
    for label in ("Nproc Per Node:", "Node Selector:", "Service Account Name:",
                  "Image Pull Secrets:", "Credentials Secret:", "Accumulation Steps:"):
        assert label in described, described
    assert not re.search(r"^\s*\w+_\w+:", described, re.M), described
    assert re.search(r"^Events:\s+<none>$", described, re.M)

    gone = kubectl("delete", "qr", "nightly-2026-11-29")
    assert gone.stdout.strip() == 'qualificationrun.resumequal.dev "nightly-2026-11-29" deleted'
    assert api.get("qr", "training", "nightly-2026-11-29") is None


@pytest.mark.parametrize(("change", "names"), [
    # snake_case is the CLI's second spelling only: on a cluster it is an unknown field.
    ({"world": {"nproc_per_node": 2}}, 'unknown field "spec.world.nproc_per_node"'),
    ({"training": {"colour": "blue"}}, 'unknown field "spec.training.colour"'),
    ({"world": {"nnodes": "two"}},
     'The QualificationRun "nightly-2026-11-29" is invalid: spec.world.nnodes: Invalid '
     'value: "string": spec.world.nnodes in body must be of type integer: "string"'),
])
def test_unknown_and_ill_typed_fields_are_refused_naming_them(
        api: RealAPI, kubectl: Kubectl, tmp_path: Path, change: dict[str, Any],
        names: str) -> None:
    manifest: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    manifest["metadata"]["namespace"] = NAMESPACE
    for section, fields in change.items():
        manifest["spec"][section].update(fields)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(manifest))
    refused = kubectl("apply", "-f", str(path), check=False)
    assert refused.returncode != 0
    assert names in refused.stderr, refused.stderr
    assert api.get("qr", NAMESPACE, "nightly-2026-11-29") is None


@pytest.mark.parametrize("verdict_result", [Result.FAIL])
def test_get_and_watch_follow_a_run_then_describe_and_delete(
        api: RealAPI, kubectl: Kubectl, operators: Operators,
        pods: PodCluster, store: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run_manifest("nightly", store)))
    kubectl("apply", "-f", str(path))
    header, row = words(kubectl("get", "qr").stdout)
    assert header == HEADER and without_age(row) == ["nightly"]

    with kubectl.streaming("get", "qr", "-w") as watch:
        watch.wait_for(lambda lines: len(lines) >= 2, timeout=20)  # header and first row
        operators.start()
        wait_phase(api, "nightly", ("Succeeded", "Failed"), timeout=120)
        printed = watch.wait_for(
            lambda lines: any("Succeeded" in line and "FAIL" in line for line in lines),
            timeout=20)
    rows = [r for r in words("\n".join(printed)) if r[0] == "nightly"]
    assert words(printed[0])[0] == HEADER
    phases = [r[1] for r in rows if len(r) > 2 and r[1] in PHASES]
    seen = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
    # Phases in the machine's order, from the first the operator wrote to Succeeded.
    assert seen == sorted(seen, key=PHASES.index) and seen[-1] == "Succeeded", rows
    assert len(seen) >= 3 and "LegsRunning" in seen, seen
    assert all(r[-2] == "train:2026-11-29" for r in rows if len(r) > 2), rows  # PIN
    assert without_age(rows[-1]) == [
        "nightly", "Succeeded", "FAIL", "step", "5", "lr", "rank", "1", "train:2026-11-29"]

    _, final = words(kubectl("get", "qr").stdout)
    assert without_age(final) == without_age(rows[-1])
    wide = words(kubectl("get", "qr", "nightly", "-o", "wide").stdout)
    assert wide[0] == HEADER

    flush_events()  # the replica's recorder writes the Events from a thread of its own
    described = kubectl("describe", "qr", "nightly").stdout
    assert "Nproc Per Node:" in described and "First Divergence Summary:" in described
    assert "Launched At:" in described  # the machine's state, camelCase too
    assert not re.search(r"^\s*\w+_\w+:", described, re.M), described
    events = described[described.index("\nEvents:"):]
    for reason in ("LegsRunning", "PreemptionInjected", "Comparing", "Succeeded"):
        assert re.search(rf"^\s+\w+\s+{reason}\s", events, re.M), events

    started = time.monotonic()
    gone = kubectl("delete", "qr", "nightly")  # waits for the operator's finalizer
    assert gone.stdout.strip() == 'qualificationrun.resumequal.dev "nightly" deleted'
    assert api.get("qr", NAMESPACE, "nightly") is None
    assert time.monotonic() - started < 30
