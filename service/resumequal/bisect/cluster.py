"""Probes on a cluster: one QualificationRun per qualification, its verdict read from the
status the operator writes.

Each attempt creates a QualificationRun from the user's manifest with ``spec.stack.image``
set to the pin's image (``spec.stack.pin`` left to the operator, which derives it from the
image), named ``bisect-<bisection>-p<pin>`` (``-r<k>`` for the k-th retry) and labelled
``resumequal.dev/bisection=<bisection>`` and ``resumequal.dev/bisect-pin=<pin>``. It is
polled until its phase is Succeeded or Failed; the status' verdict (result, reason, first
divergence) is the answer. Runs are kept, unless ``--delete-runs``; one that outlives the
probe timeout, or is interrupted, is deleted (what the bisection started, it stops).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from resumequal.bisect.kubeapi import GROUP, VERSION, Obj, RunsApi, connect
from resumequal.bisect.probe import Qualified
from resumequal.bisect.result import FirstDivergence, RunRef
from resumequal.bisect.runner import Prepared, ProbeId
from resumequal.errors import ClusterError
from resumequal.exitcodes import ExitCode, for_result
from resumequal.redact import redact
from resumequal.results.verdict import Result
from resumequal.spec import SpecError
from resumequal.spec.yamlread import YAMLInputError, load_yaml
from resumequal.words import clip

log = logging.getLogger(__name__)

BISECTION_LABEL = "resumequal.dev/bisection"
PIN_LABEL = "resumequal.dev/bisect-pin"
IMAGE_ANNOTATION = "resumequal.dev/bisect-image"
POLL_S = 2.0  # a qualification takes minutes; a status read is one small GET
# How the operator says a run was refused before anything ran (status.py): the spec is
# wrong for every image alike; an allowlist or a torch version may refuse one image only.
SPEC_REFUSED = "InvalidSpec"
IMAGE_REFUSED = ("NotAllowed", "NotSupported")


class ManifestError(SpecError):
    """The QualificationRun manifest cannot be read or is not one; names file and field."""


@dataclass(frozen=True)
class ClusterOptions:
    """Where and what to qualify: the manifest every probe's run is made from, the
    namespace (default: the manifest's), the kubeconfig and context, and whether each run
    is deleted once its verdict is read."""

    manifest: Path
    namespace: str | None = None
    kubeconfig: Path | None = None
    context: str | None = None
    delete_runs: bool = False


# -- what the bisection reads of the status (resumequal_operator.resource's models) ------


class _Read(BaseModel):
    # camelCase on the wire, as the operator writes it; fields it may add are ignored.
    model_config = ConfigDict(extra="ignore", alias_generator=to_camel, validate_by_name=True,
                              validate_by_alias=True)


class _Divergence(_Read):
    step: int
    boundary: str
    rank: int


class _Verdict(_Read):
    result: Result
    reason: str | None = None
    first_divergence: _Divergence | None = None


class _Condition(_Read):
    type: str
    status: str
    reason: str | None = None
    message: str | None = None


class RunStatus(_Read):
    """The fields of a QualificationRun's ``.status`` a probe's outcome is read from."""

    phase: str | None = None
    verdict: _Verdict | None = None
    conditions: list[_Condition] = []
    run_uri: str | None = None

    @property
    def ended(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    def ready(self) -> _Condition | None:
        return next((c for c in self.conditions if c.type == "Ready"), None)


def read_status(obj: Obj) -> RunStatus:
    """The run's status; an unreadable one reads as not ended (the operator rewrites it)."""
    try:
        return RunStatus.model_validate(obj.get("status") or {})
    except ValidationError:
        return RunStatus()


def outcome(status: RunStatus, *, seconds: float, run: RunRef) -> Qualified:
    """A finished run's status as a probe's answer. Raises :class:`ManifestError` when the
    operator refused the spec itself (every probe would be refused alike)."""
    ready = status.ready()
    why = clip(redact(f"{ready.reason}: {ready.message}")) if ready else "no Ready condition"
    if ready is not None and ready.reason == SPEC_REFUSED:
        raise ManifestError(f"the operator refused QualificationRun {run.namespace}/"
                            f"{run.name}: {why}")
    where = status.run_uri or ""
    if (ready is not None and ready.reason in IMAGE_REFUSED) or status.verdict is None:
        return Qualified(int(ExitCode.INVALID), seconds, where, None,
                         error=f"the operator ran no qualification ({why})", run=run)
    v = status.verdict
    d = v.first_divergence
    try:
        first = None if d is None else FirstDivergence(step=d.step, boundary=d.boundary,  # type: ignore[arg-type]
                                                       rank=d.rank)
    except ValidationError:
        return Qualified(int(ExitCode.INVALID), seconds, where, None, run=run,
                         error=f"unreadable first divergence in the status: {d}")
    return Qualified(int(for_result(v.result)), seconds, where, v.result, v.reason or "",
                     first, run=run)


# -- the manifest -----------------------------------------------------------------------


def read_manifest(path: Path) -> Obj:
    """A QualificationRun manifest (``kubectl apply -f`` of it would create one run)."""
    try:
        data = load_yaml(path.read_text())
    except (OSError, UnicodeDecodeError, YAMLInputError) as e:
        raise ManifestError(f"--spec {path}: cannot read the QualificationRun manifest: "
                            f"{e}") from e
    if not isinstance(data, dict) or data.get("kind") != "QualificationRun":
        raise ManifestError(f"--spec {path}: kind: not a QualificationRun manifest (on a "
                            "cluster, --spec is one, as examples/qualificationrun.yaml)")
    spec = data.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("stack"), dict):
        raise ManifestError(f"--spec {path}: spec.stack: missing (its image is each pin's)")
    return data


def run_name(bisection: str, pin: int, attempt: int) -> str:
    """``bisect-3f9a1c-p05``, ``bisect-3f9a1c-p05-r1`` for the first retry."""
    return f"bisect-{bisection}-p{pin:02d}" + (f"-r{attempt - 1}" if attempt > 1 else "")


def run_body(manifest: Obj, *, namespace: str, name: str, image: str, bisection: str,
             pin: int) -> Obj:
    """The run of one probe: the manifest's spec, this image, a name and labels of its own."""
    metadata = manifest.get("metadata") or {}
    stack = {k: v for k, v in manifest["spec"]["stack"].items() if k != "pin"}
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "QualificationRun",
        "metadata": {
            "name": name, "namespace": namespace,
            "labels": {**(metadata.get("labels") or {}), BISECTION_LABEL: bisection,
                       PIN_LABEL: str(pin)},
            "annotations": {**(metadata.get("annotations") or {}), IMAGE_ANNOTATION: image},
        },
        "spec": {**manifest["spec"], "stack": {**stack, "image": image}},
    }


# -- the runner -------------------------------------------------------------------------


class ClusterRunner:
    """Qualifies an image as a QualificationRun the operator runs (see the module doc)."""

    readying: str = "the QualificationRun of"

    def __init__(self, api: RunsApi, options: ClusterOptions, manifest: Obj, timeout_s: float,
                 *, bisection: str | None = None, poll_s: float = POLL_S,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.api, self.options, self.manifest = api, options, manifest
        self.namespace: str = (options.namespace or (manifest.get("metadata") or {})
                               .get("namespace") or "default")
        self.bisection = bisection or secrets.token_hex(3)
        self.timeout_s, self.poll_s, self.clock, self.sleep = timeout_s, poll_s, clock, sleep
        self.checked = False

    @classmethod
    def connect(cls, options: ClusterOptions, timeout_s: float) -> ClusterRunner:
        """Read the manifest, then load the kubeconfig: usage errors before any request."""
        manifest = read_manifest(options.manifest)
        return cls(connect(options.kubeconfig, options.context), options, manifest, timeout_s)

    def prepare(self, subject: str, role: str, check_mix: bool) -> Prepared:
        return Prepared(shown=f"as a QualificationRun in namespace {self.namespace}",
                        image=subject)

    def qualify(self, prepared: Prepared, probe: ProbeId) -> Qualified:
        assert prepared.image is not None and probe.pin_index is not None
        name = run_name(self.bisection, probe.pin_index, probe.attempt)
        body = run_body(self.manifest, namespace=self.namespace, name=name,
                        image=prepared.image, bisection=self.bisection, pin=probe.pin_index)
        if not self.checked:
            self._check(body)
        started = self.clock()
        created = self.api.create(self.namespace, body)
        uid = (created.get("metadata") or {}).get("uid")
        log.debug("created QualificationRun %s/%s for %s", self.namespace, name, prepared.image)
        try:
            status = self._wait(name)
        except BaseException:
            self._delete(name)  # Ctrl-C: stop the qualification before leaving
            raise
        seconds = self.clock() - started
        if status is None or not status.ended:
            where = ""
            if status is None:
                why = "the QualificationRun was deleted before its verdict"
            else:
                where = status.run_uri or ""
                self._delete(name)
                why = (f"no verdict within {self.timeout_s:g} s (phase {status.phase}); "
                       "the QualificationRun was deleted")
            return Qualified(int(ExitCode.INVALID), seconds, where, None, error=why,
                             run=RunRef(namespace=self.namespace, name=name, uid=uid,
                                        deleted=True))
        deleted = self.options.delete_runs
        if deleted:
            self._delete(name)
        return outcome(status, seconds=seconds,
                       run=RunRef(namespace=self.namespace, name=name, uid=uid,
                                  deleted=deleted))

    def _check(self, body: Obj) -> None:
        """A dry run of the first create: the API server checks the manifest against the
        CRD's schema (and RBAC) before anything runs; a refusal is the user's to fix."""
        try:
            self.api.create(self.namespace, body, dry_run=True)
        except ClusterError as e:
            if e.status in (400, 422):
                raise ManifestError(f"--spec {self.options.manifest}: {e}") from e
            raise
        self.checked = True

    def _wait(self, name: str) -> RunStatus | None:
        """The status once ended, the last one seen at the deadline, or None if deleted."""
        deadline = self.clock() + self.timeout_s
        while True:
            obj = self.api.get(self.namespace, name)
            if obj is None:
                return None
            status = read_status(obj)
            if status.ended or self.clock() >= deadline:
                return status
            self.sleep(self.poll_s)

    def _delete(self, name: str) -> None:
        try:
            self.api.delete(self.namespace, name)
        except ClusterError as e:
            log.warning("could not delete QualificationRun %s/%s: %s", self.namespace, name, e)


__all__ = ["BISECTION_LABEL", "PIN_LABEL", "ClusterOptions", "ClusterRunner", "ManifestError",
           "RunStatus", "outcome", "read_manifest", "read_status", "run_body", "run_name"]
