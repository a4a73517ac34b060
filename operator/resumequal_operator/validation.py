"""A QualificationRun spec checked across its fields, and the qualification spec its legs run.

The models (:mod:`.resource`) check each field; :func:`parse_run_spec` adds the checks across
fields, the qualification spec's own (a cut after the last step, a rank outside the world,
...) and the cluster's (a kill on the pod that hosts the rendezvous, GPUs for nccl). Every
problem names its field, and none carries a credential.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    field_validator,
)

from resumequal.redact import redact
from resumequal.spec import (
    PIN_PATTERN,
    QualificationSpec,
    SpecError,
    error_lines,
)
from resumequal.store import StoreSettings
from resumequal_operator.resource import (
    GPU_RESOURCES,
    TRAINJOB_REPLACEMENT_S,
    QualificationRunSpec,
    ResourceRequirements,
)

log = logging.getLogger(__name__)


SPEC_SECTIONS: tuple[str, ...] = tuple(QualificationSpec.model_fields)


class Problem(BaseModel):
    """One reason a QualificationRun cannot run, at a field path (``spec.world.nnodes``)."""

    model_config = ConfigDict(frozen=True)
    path: str
    message: str

    @field_validator("message")
    @classmethod
    def _redacted(cls, value: str) -> str:
        # Problems become status, Events and log lines: no credential in any of them.
        return redact(value)

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class RunSpecError(SpecError):
    """A QualificationRun spec that cannot run; ``problems`` name each field."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


def _problems(err: ValidationError, prefix: str,
              model: type[BaseModel] = QualificationRunSpec) -> list[Problem]:
    return [Problem(path=".".join(p for p in (prefix, path) if p), message=msg)
            for path, msg in error_lines(err, model)]


# The spec's checks across sections lead with the field they judge ("preemption.step=7 ...").
_LEADING_FIELD = re.compile(r"^([a-z][A-Za-z0-9]*\.[a-z][A-Za-z0-9]*)")


def _spec_problems(spec: QualificationRunSpec) -> list[Problem]:
    try:
        _as_qualification_spec(spec, None)
    except ValidationError as e:
        out = []
        for p in _problems(e, "spec", QualificationSpec):
            lead = _LEADING_FIELD.match(p.message)
            out.append(Problem(path=f"spec.{lead.group(1)}", message=p.message)
                       if p.path == "spec" and lead else p)
        return out
    return []


def _cluster_problems(spec: QualificationRunSpec) -> list[Problem]:
    out: list[Problem] = []
    w, ck = spec.world, spec.checkpoint
    if ck.store is not None:
        out.append(Problem(path="spec.checkpoint.store", message=(
            "set by the operator (checkpoints live in the run location under store.uri); "
            "leave it unset")))
    for name, value in ck:
        if isinstance(value, StoreSettings):
            out.append(Problem(path=f"spec.checkpoint.{name}", message=(
                f"set by the operator from store.{name}; leave it unset")))
    out += _cut_problems(spec)
    gpus = _gpu_limit(spec.resources)
    if w.backend == "nccl" and gpus is None:
        out.append(Problem(path="spec.resources.limits", message=(
            f"world.backend=nccl needs one GPU per rank: set {GPU_RESOURCES[0]}: "
            f"{w.nproc_per_node} (world.nprocPerNode)")))
    elif gpus is not None and w.backend != "gloo" and gpus < w.nproc_per_node:
        out.append(Problem(path="spec.world.nprocPerNode", message=(
            f"world.nprocPerNode={w.nproc_per_node} ranks per pod but only {gpus} GPUs "
            "per pod in resources.limits; nccl needs one GPU per rank")))
    if spec.matrix.seeds:
        # Said up front: running only the main pair would pass off one seed as the matrix.
        out.append(Problem(path="spec.matrix.seeds", message=(
            "the seed matrix runs with `resumequal run` on one machine; the operator runs one "
            "seed per QualificationRun (create one run per seed with training.seed)")))
    if spec.backend == "trainjob":
        out += _trainjob_problems(spec)
    if spec.stack.pin is None and not re.match(PIN_PATTERN, spec.stack.effective_pin):
        # The pin of an unpinned run is the image's; stack.image admits more characters.
        out.append(Problem(path="spec.stack.pin", message=(
            "unset, and the image's last path segment is no pin (letters, digits and "
            ". _ + : @ = - only, at most 128): set stack.pin")))
    if spec.store.credentials_secret and not spec.store.uri.startswith("s3://"):
        out.append(Problem(path="spec.store.credentialsSecret",
                           message="only used with an s3:// store.uri"))
    return out


def _cut_problems(spec: QualificationRunSpec) -> list[Problem]:
    """A cut rank whose pod cannot be deleted as the preemption or the resize needs."""
    out: list[Problem] = []
    w, p = spec.world, spec.preemption
    # The c10d rendezvous numbers nodes by host name, and <job>-worker-0 sorts first, so
    # ranks 0..nprocPerNode-1 always run on worker-0, the pod the rendezvous lives on. A
    # process kill leaves the pod's torchrun agent, and so the rendezvous, alive.
    if p.target == "pod" and p.rank < w.nproc_per_node \
            and not spec.allow_rendezvous_host_kill:
        out.append(Problem(path="spec.preemption.rank", message=(
            f"rank {p.rank} runs on pod worker-0 (ranks 0..{w.nproc_per_node - 1} of "
            f"world.nprocPerNode={w.nproc_per_node}), which hosts the c10d rendezvous: "
            "deleting it ends every node's group instead of preempting one. Use "
            "world.nnodes >= 2 and preemption.rank >= world.nprocPerNode, "
            "preemption.target: process, or allowRendezvousHostKill: true")))
    last = (w.nnodes - 1) * w.nproc_per_node
    if p.resize is not None and p.rank < last:
        # Lowering the Worker replicas makes the training operator delete the pods of the
        # highest indices (common/pod.go ReconcilePods): the cut must be on the last one.
        out.append(Problem(path="spec.preemption.rank", message=(
            f"rank {p.rank} runs on pod worker-{p.rank // w.nproc_per_node}, but a resize "
            f"lowers the Worker replicas to preemption.resize.toNodes={p.resize.to_nodes}, "
            f"which deletes the last pod, worker-{w.nnodes - 1}: cut a rank of that pod "
            f"(ranks {last}..{w.world_size - 1})")))
    return out


def _trainjob_problems(spec: QualificationRunSpec) -> list[Problem]:
    """What a TrainJob cannot do that the spec asks of its legs."""
    out: list[Problem] = []
    p = spec.preemption
    # Trainer v2 has no elastic policy (removed in v2.2): a TrainJob's node count is
    # fixed, so its world cannot shrink or grow.
    if p.resize is not None:
        out.append(Problem(path="spec.preemption.resize", message=(
            "a resize needs an elastic job, and a TrainJob has a fixed number of nodes: "
            "use backend: pytorchjob")))
    # The Job controller replaces a deleted pod only after its pod failure backoff
    # (pkg/controller/job backoff_utils.go: 10 s after the first failure).
    if p.target == "pod" and spec.timeouts.restart_seconds <= TRAINJOB_REPLACEMENT_S:
        out.append(Problem(path="spec.timeouts.restartSeconds", message=(
            f"{spec.timeouts.restart_seconds:g}s is not longer than the "
            f"{TRAINJOB_REPLACEMENT_S:g}s the Job controller waits before it replaces a "
            "TrainJob's deleted pod: the leg could never resume in time")))
    # Neither spec.trainer nor a runtime patch can set a container's pull policy.
    if spec.stack.image_pull_policy is not None:
        out.append(Problem(path="spec.stack.imagePullPolicy", message=(
            "a TrainJob cannot set the pull policy of its image (trainer.image only); "
            "set it in the training runtime, or leave it unset")))
    return out


def _gpu_limit(resources: ResourceRequirements) -> int | None:
    for name in GPU_RESOURCES:
        value = resources.limits.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return 0
    return None


def run_spec_problems(spec: QualificationRunSpec) -> list[Problem]:
    """Checks across fields: the qualification spec's own, then the cluster's."""
    return _spec_problems(spec) + _cluster_problems(spec)


def parse_run_spec(data: Any) -> QualificationRunSpec:
    """Validate a QualificationRun's ``spec`` mapping; RunSpecError names every bad field."""
    if not isinstance(data, dict):
        raise RunSpecError([Problem(path="spec", message="must be a mapping")])
    try:
        spec = QualificationRunSpec.model_validate(data)
    except ValidationError as e:
        raise RunSpecError(_problems(e, "spec")) from e
    problems = run_spec_problems(spec)
    if problems:
        raise RunSpecError(problems)
    return spec


def _as_qualification_spec(spec: QualificationRunSpec, location: str | None) -> QualificationSpec:
    data = {name: getattr(spec, name) for name in SPEC_SECTIONS}
    if location is not None:
        data["checkpoint"] = spec.checkpoint.with_store(location, spec.store.settings())
    # Revalidated from plain data: the spec's checks across sections must run again.
    return QualificationSpec.model_validate(
        {k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v
         for k, v in data.items()})


def qualification_spec(
    spec: QualificationRunSpec, location: str | None = None
) -> QualificationSpec:
    """The spec every leg runs: the CR's sections, checkpoints stored in the run location
    (``location``, default: ``store.uri``) with the store's settings."""
    try:
        return _as_qualification_spec(spec, location or spec.store.uri)
    except ValidationError as e:
        raise RunSpecError(_problems(e, "spec", QualificationSpec)) from e
