"""The ordered bisection over images on a cluster, the cluster stood in for: a fake of the
runner's narrow API (:class:`resumequal.bisect.kubeapi.RunsApi`) whose runs end with the
statuses the operator's own models write."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from resumequal import cli
from resumequal.bisect import bisection, cluster, kubeapi
from resumequal.bisect.bisection import BisectOptions
from resumequal.bisect.cluster import ClusterOptions, ClusterRunner, ManifestError
from resumequal.bisect.result import RunRef
from resumequal.errors import ClusterError, UsageError
from resumequal.qualify.machine import Phase, Reason
from resumequal.results.verdict import Result
from resumequal_operator.runstatus import FirstDivergence, QualificationRunStatus, VerdictStatus
from resumequal_operator.status import conditions, invalid_status

SCHEMA = Path(__file__).resolve().parents[2] / "docs/reference/bisect.schema.json"
IMAGES = tuple(f"registry.example/train:2026-11-{d:02d}" for d in range(1, 9))
MANIFEST = {
    "apiVersion": "resumequal.dev/v1alpha1", "kind": "QualificationRun",
    "metadata": {"name": "nightly", "namespace": "training", "labels": {"team": "ml"}},
    "spec": {"stack": {"image": "x", "pin": "nightly", "imagePullPolicy": "IfNotPresent"},
             "store": {"uri": "s3://runs/q"}, "training": {"steps": 8}},
}
Obj = dict[str, Any]


def status(result: Result, *, step: int | None = None, phase: Phase = Phase.SUCCEEDED,
           reason: str | None = None, message: str = "") -> Obj:
    """A finished run's status as the operator writes it (its models, camelCase)."""
    verdict = VerdictStatus(
        result=result, reason=f"{result.value} because",
        first_divergence=None if step is None else FirstDivergence(step=step,
                                                                   boundary="inputs", rank=0))
    return QualificationRunStatus(
        phase=phase, verdict=verdict, run_uri="s3://runs/q/training/r/uid",
        conditions=conditions(None, phase, reason, message or None, verdict, 1),
    ).model_dump(mode="json", by_alias=True, exclude_none=True)


def refused(reason: str, message: str) -> Obj:
    """The status of a run the operator refused before it started."""
    return invalid_status(None, 1, message, reason=reason).model_dump(
        mode="json", by_alias=True, exclude_none=True)


class FakeRuns:
    """QualificationRuns that end as ``ends(image, attempt)`` says (None: never end)."""

    def __init__(self, ends: Callable[[str, int], Obj | None]) -> None:
        self.ends = ends
        self.runs: dict[str, Obj] = {}
        self.created: list[Obj] = []
        self.dry: list[Obj] = []
        self.deleted: list[str] = []
        self.fail: dict[str, ClusterError] = {}  # method -> the error it raises

    def create(self, namespace: str, body: Obj, *, dry_run: bool = False) -> Obj:
        if "create" in self.fail:
            raise self.fail["create"]
        if dry_run:
            self.dry.append(body)
            return body
        run = copy.deepcopy(body)
        name = run["metadata"]["name"]
        run["metadata"]["uid"] = f"uid-{name}"
        attempt = 1 + sum(c["spec"]["stack"]["image"] == body["spec"]["stack"]["image"]
                          for c in self.created)
        run["status"] = self.ends(body["spec"]["stack"]["image"], attempt) or {
            "phase": "LegsRunning"}
        self.created.append(body)
        self.runs[name] = run
        return run

    def get(self, namespace: str, name: str) -> Obj | None:
        return self.runs.get(name)

    def delete(self, namespace: str, name: str) -> None:
        self.deleted.append(name)
        self.runs.pop(name, None)


def nightly(first_bad: int) -> Callable[[str, int], Obj | None]:
    return lambda image, attempt: (status(Result.FAIL, step=5)
                                   if IMAGES.index(image) >= first_bad else status(Result.PASS))


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "nightly.yaml"
    path.write_text(yaml.safe_dump(MANIFEST))
    return path


def _bisect(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, manifest: Path, runs: FakeRuns,
            images: tuple[str, ...] = IMAGES, **kw: Any) -> bisection.BisectResult:
    monkeypatch.setattr(cluster, "connect", lambda kubeconfig, context: runs)
    monkeypatch.setattr(cluster.ClusterRunner, "__init__", _fast(cluster.ClusterRunner.__init__))
    delete = bool(kw.pop("delete_runs", False))
    options = BisectOptions(pins=(), ordered=True, out=tmp_path / "out", cache=tmp_path / "c",
                            images=images, cluster=ClusterOptions(manifest, delete_runs=delete),
                            **kw)
    return bisection.bisect(options)


def _fast(init: Callable[..., None]) -> Callable[..., None]:
    """No waiting between status reads, and a clock that moves 60 s a read."""
    def fast(self: ClusterRunner, *args: Any, **kw: Any) -> None:
        ticks = iter(range(0, 10**6, 60))
        init(self, *args, **kw, bisection="abc123", poll_s=0, clock=lambda: float(next(ticks)),
             sleep=lambda s: None)
    return fast


def test_the_first_image_to_flip_is_found_through_4_runs_that_are_kept(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, manifest: Path) -> None:
    runs = FakeRuns(nightly(5))
    result = _bisect(monkeypatch, tmp_path, manifest, runs, assume_bad=True)
    assert (result.conclusion, result.exit_code) == ("flip", 0)
    assert result.first_flip is not None and result.first_flip.path == IMAGES[5]
    assert result.first_flip.previous == IMAGES[4] and result.qualifications == 4
    assert "2026-11-06 is the first pin to flip the verdict (PASS → another verdict" in \
        result.summary
    assert result.cluster is not None and result.cluster.namespace == "training"
    assert result.cluster.bisection == "abc123" and runs.deleted == []
    # One dry run first: the API server checks the manifest before anything runs.
    assert len(runs.dry) == 1
    first = runs.created[0]
    assert first["metadata"]["name"] == "bisect-abc123-p00"
    assert first["metadata"]["labels"] == {"team": "ml", "resumequal.dev/bisection": "abc123",
                                           "resumequal.dev/bisect-pin": "0"}
    assert first["spec"]["stack"] == {"image": IMAGES[0], "imagePullPolicy": "IfNotPresent"}
    assert first["spec"]["training"] == {"steps": 8}
    probes = result.probes
    assert [p.image for p in probes] == [IMAGES[i] for i in (0, 3, 5, 4)]
    assert probes[2].attempts[0].first_divergence is not None
    assert probes[2].attempts[0].first_divergence.step == 5
    assert probes[0].attempts[0].run == RunRef(namespace="training", name="bisect-abc123-p00",
                                               uid="uid-bisect-abc123-p00", deleted=False)
    assert probes[0].attempts[0].run_dir == "s3://runs/q/training/r/uid"
    written = json.loads((tmp_path / "out" / "bisect.json").read_text())
    jsonschema.validate(written, json.loads(SCHEMA.read_text()))
    assert "bisect-abc123-p03" in (tmp_path / "out" / "bisect.html").read_text()


def test_delete_runs_deletes_each_once_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                            manifest: Path) -> None:
    runs = FakeRuns(nightly(5))
    result = _bisect(monkeypatch, tmp_path, manifest, runs, assume_bad=True, delete_runs=True)
    assert runs.deleted == [c["metadata"]["name"] for c in runs.created]
    assert all(a.run and a.run.deleted for p in result.probes for a in p.attempts)


def test_an_invalid_run_is_retried_under_a_name_of_its_own_then_skipped(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, manifest: Path) -> None:
    def ends(image: str, attempt: int) -> Obj:
        if image == IMAGES[3]:  # never judged: skipped, as git bisect skip
            return status(Result.INVALID, phase=Phase.FAILED, reason=Reason.TIMEOUT.value,
                          message="the leg did not finish within timeouts.legSeconds")
        return nightly(5)(image, attempt) or {}

    runs = FakeRuns(ends)
    result = _bisect(monkeypatch, tmp_path, manifest, runs, assume_bad=True, retries=1)
    assert result.first_flip is not None and result.first_flip.index == 5
    skipped = next(p for p in result.probes if p.image == IMAGES[3])
    assert (skipped.status, skipped.outcome) == ("unjudged", "unresolved")
    assert [a.run.name for a in skipped.attempts if a.run] == ["bisect-abc123-p03",
                                                                "bisect-abc123-p03-r1"]


def test_a_run_without_a_verdict_in_time_is_deleted_and_unresolved(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, manifest: Path) -> None:
    runs = FakeRuns(lambda image, attempt: None if image == IMAGES[1] else status(Result.PASS))
    result = _bisect(monkeypatch, tmp_path, manifest, runs, images=IMAGES[:3],
                     probe_timeout_s=300, assume_good=True, assume_bad=True)
    assert (result.conclusion, result.exit_code) == ("undecided", 6)
    [probe] = result.probes
    assert probe.status == "error" and "no verdict within 300 s (phase LegsRunning)" in probe.why
    assert probe.attempts[0].run_dir == ""
    assert runs.deleted == ["bisect-abc123-p01"]
    assert probe.attempts[0].run is not None and probe.attempts[0].run.deleted


@pytest.mark.parametrize(("end", "outcome"), [
    (status(Result.PASS), (Result.PASS, None, "")),
    (status(Result.FAIL, step=5), (Result.FAIL, (5, "inputs", 0), "")),
    (status(Result.NONDETERMINISTIC, step=2), (Result.NONDETERMINISTIC, (2, "inputs", 0), "")),
    (status(Result.INVALID, phase=Phase.FAILED, reason=Reason.TIMEOUT.value,
            message="not armed within timeouts.armSeconds"), (Result.INVALID, None, "")),
    (refused("NotAllowed", "stack.image: not allowed"),
     (None, None, "the operator ran no qualification (NotAllowed: stack.image: not allowed)")),
])
def test_a_status_reads_as_the_probe_outcome_the_local_runner_gives(
        end: Obj, outcome: tuple[Result | None, tuple[int, str, int] | None, str]) -> None:
    ref = RunRef(namespace="n", name="r", uid="u", deleted=False)
    q = cluster.outcome(cluster.read_status({"status": end}), seconds=1.0, run=ref)
    first = None if q.first is None else (q.first.step, q.first.boundary, q.first.rank)
    assert (q.result, first, q.error) == outcome
    assert q.exit_code == {Result.PASS: 0, Result.FAIL: 1, Result.NONDETERMINISTIC: 4}.get(
        q.result, 3)  # type: ignore[arg-type]
    assert q.run == ref


def test_a_spec_the_operator_refuses_stops_the_bisection_as_a_spec_error(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, manifest: Path) -> None:
    runs = FakeRuns(lambda image, attempt: refused("InvalidSpec",
                                                   "training.steps: must exceed the cut"))
    with pytest.raises(ManifestError) as caught:
        _bisect(monkeypatch, tmp_path, manifest, runs)
    assert ("the operator refused QualificationRun training/bisect-abc123-p00: InvalidSpec: "
            "training.steps") in str(caught.value)


@pytest.mark.parametrize(("error", "code", "says"), [
    (ClusterError("create QualificationRun training/bisect-abc123-p00: HTTP 403 Forbidden",
                  status=403), 3, "HTTP 403 Forbidden"),
    (ClusterError("create QualificationRun training/bisect-abc123-p00: HTTP 404 NotFound",
                  status=404), 3, "HTTP 404"),
    (ClusterError("create QualificationRun training/x: no answer from the API server", 0), 3,
     "no answer"),
    (ClusterError("create QualificationRun training/x: HTTP 422 Invalid: spec.training.steps: "
                  "Invalid value", status=422), 2, "spec.training.steps"),
])
def test_the_apis_refusals_exit_with_an_error_not_a_verdict(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, manifest: Path, error: ClusterError,
        code: int, says: str) -> None:
    runs = FakeRuns(nightly(5))
    runs.fail["create"] = error
    monkeypatch.setattr(cluster, "connect", lambda kubeconfig, context: runs)
    done = CliRunner().invoke(cli.main, ["bisect", "--ordered-images", "--spec", str(manifest),
                                         "--out", str(tmp_path / "o"), *IMAGES[:3]])
    assert done.exit_code == code, done.output
    assert says in done.output and not (tmp_path / "o" / "bisect.json").exists()


def test_an_interrupted_wait_deletes_the_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                             manifest: Path) -> None:
    runs = FakeRuns(lambda image, attempt: None)

    def interrupted(self: ClusterRunner, name: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cluster.ClusterRunner, "_wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _bisect(monkeypatch, tmp_path, manifest, runs)
    assert runs.deleted == ["bisect-abc123-p00"]


@pytest.mark.parametrize(("args", "says"), [
    (["--ordered-images", "a", "b"], "--ordered-images needs --spec"),
    (["--ordered", "--namespace", "n", "a", "b"], "go with --ordered-images"),
    (["--ordered-images", "--spec", "m.yaml", "--set", "x=1", "a", "b"], "--set and --base-env"),
])
def test_the_command_refuses_cluster_options_out_of_place(args: list[str], says: str) -> None:
    done = CliRunner().invoke(cli.main, ["bisect", *args])
    assert done.exit_code == 2 and says in done.output, done.output


def test_a_manifest_that_is_no_qualification_run_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("workload: {name: tiny-gpt}\n")
    done = CliRunner().invoke(cli.main, ["bisect", "--ordered-images", "--spec", str(path),
                                         "--kubeconfig", str(tmp_path / "none"), "a", "b"])
    assert done.exit_code == 2 and "not a QualificationRun manifest" in done.output


def test_a_kubeconfig_that_cannot_be_loaded_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--kubeconfig: cannot load"):
        kubeapi.connect(tmp_path / "missing", None)


class _ApiException(Exception):
    def __init__(self, status: int, body: str) -> None:
        self.status, self.reason, self.body = status, "Reason", body


def test_an_api_error_says_the_status_and_its_message_never_the_body() -> None:
    body = json.dumps({"kind": "Status", "reason": "NotFound", "message": "the server could "
                       "not find the requested resource", "details": {"secret": "s3cr3t"}})
    error = kubeapi._error(_ApiException(404, body), "create QualificationRun n/r")
    assert str(error) == ("create QualificationRun n/r: HTTP 404 NotFound: the server could not "
                          "find the requested resource (is the QualificationRun CRD installed, "
                          "and the namespace there?)")
    assert error.status == 404
    raw = kubeapi._error(_ApiException(500, "<html>token=abc</html>"), "get QualificationRun n/r")
    assert "token" not in str(raw) and str(raw) == "get QualificationRun n/r: HTTP 500 Reason"


def test_a_run_deleted_by_someone_else_is_unresolved(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path, manifest: Path) -> None:
    runs = FakeRuns(lambda image, attempt: None)
    monkeypatch.setattr(FakeRuns, "get", lambda self, namespace, name: None)
    result = _bisect(monkeypatch, tmp_path, manifest, runs, images=IMAGES[:3],
                     assume_good=True, assume_bad=True, retries=0)
    [probe] = result.probes
    assert "the QualificationRun was deleted before its verdict" in probe.why
    assert runs.deleted == []
