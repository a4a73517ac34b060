"""The QualificationRun custom resource: its spec and status as pydantic models.

The spec reuses every section of :class:`resumequal.spec.QualificationSpec` as the same
models (same fields, defaults and per-field validation) and adds what only a cluster needs:
the image (``stack``), the object store (``store``), pod placement and ``retention``. Spec
and status follow the Kubernetes API conventions: every field is camelCase on the wire,
generated from its Python name (``node_selector`` is ``nodeSelector``) by the same alias
generator as the spec's sections, so a new field gets its spelling without a table. The
snake_case names are read too, and problems name fields in camelCase.

Validation comes in two layers: the models check each field (this is also what the CRD
schema is generated from), and :func:`parse_run_spec` adds the checks across fields — the
spec's own (a cut after the last step, a rank outside the world, ...) and the cluster's
(a kill on the pod that hosts the rendezvous, GPUs for nccl). Every problem names its field.
"""

from __future__ import annotations

import logging
import math
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from resumequal.qualify import Phase
from resumequal.redact import redact, redact_tree
from resumequal.run.beacons import MAX_EPOCH_SECONDS
from resumequal.spec import (
    MAX_SECONDS,
    MAX_URI,
    PIN_PATTERN,
    SECTION_CONFIG,
    QualificationSpec,
    SpecError,
    SpecSections,
    error_lines,
    store_uri,
)
from resumequal.store import GCSSettings, S3Settings, StoreSettings
from resumequal.store.settings import settings_problem
from resumequal.verdict import Result

log = logging.getLogger(__name__)

GROUP = "resumequal.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "QualificationRun"
PLURAL = "qualificationruns"
SINGULAR = "qualificationrun"

# Kubernetes' resource.Quantity grammar (apimachinery/pkg/api/resource).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# Extended resources a pod can ask for to get one accelerator per rank.
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
# Bounds of what a run's pods are given (Kubernetes' own limits where it has them).
MAX_ENTRIES = 64  # map entries (nodeSelector, requests, limits) and list items
_NAME = 253  # a DNS subdomain


def is_object_name(name: str) -> bool:
    """Whether ``name`` can name a pod (or most objects): a DNS-1123 subdomain. Checked on
    names read from the store before they go into an API path."""
    return len(name) <= _NAME and re.match(_DNS_SUBDOMAIN, name) is not None

_QUANTITY = re.compile(QUANTITY_PATTERN)


def _quantity(value: Any) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _QUANTITY.match(value):
        return value
    raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 2, \"500m\", \"4Gi\")")


# What a pod's resources take: an integer or a string like "500m" or "4Gi".
Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    WithJsonSchema({"anyOf": [{"type": "integer"},
                              {"type": "string", "pattern": QUANTITY_PATTERN}]}),
]


class _Section(BaseModel):
    model_config = SECTION_CONFIG


class StackSpec(_Section):
    """The training stack under qualification: the image every leg and the comparator run."""

    image: str = Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[^\s]+$",
        description="The training image (registry/repository:tag or @sha256:digest); it "
        "must contain resumequal and the torch stack to qualify.",
    )
    pin: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=PIN_PATTERN,
        description="The label this qualification is reported under (metrics, status, "
        "report); default: the image's last path segment with its tag or short digest. "
        "Letters, digits and . _ + : @ = - only: alert templates query by it.",
    )
    image_pull_secrets: list[Annotated[str, Field(pattern=_DNS_SUBDOMAIN, max_length=_NAME)]] \
        = Field(default_factory=list, max_length=MAX_ENTRIES,
                description="Names of Secrets to pull the image with.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="Kubernetes' default when unset (Always for :latest)."
    )
    torch_version: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?([A-Za-z0-9.+_-]*)$",
        description="The torch version the image carries, e.g. \"2.6.0\"; when set, "
        "features the spec needs that this version lacks are refused before anything "
        "is created. Unset: the legs themselves refuse them, once started.",
    )

    @property
    def effective_pin(self) -> str:
        return self.pin or pin_of(self.image)


def pin_of(image: str) -> str:
    """``ghcr.io/acme/train:2026-11-29`` -> ``train:2026-11-29``; digests shortened to 12."""
    name, _, digest = image.partition("@")
    last = name.rsplit("/", 1)[-1]
    if digest:
        algo, _, hexpart = digest.partition(":")
        return f"{last.split(':', 1)[0]}@{algo}:{hexpart[:12]}"
    return last


# v1alpha1's first spelling of store.s3: its fields flat in store (still accepted).
_FLAT_S3 = ("endpoint_url", "region", "addressing_style", "sign_payloads")


def _older(name: str) -> str:
    """The description of a flat field of the first spelling: the S3 settings' own."""
    return (f"Older spelling of s3.{to_camel(name)} (still accepted; not beside s3): "
            f"{S3Settings.model_fields[name].description}")


class StoreSpec(_Section):
    """Where the run's traces, beacons, checkpoints and reports live, and how to reach it."""

    uri: str = Field(
        max_length=MAX_URI,
        description="s3://bucket/prefix or gs://bucket/prefix; each run lives under "
        "<uri>/<namespace>/<name>/<uid>. file:///abs/path only where the operator and every "
        "pod see one filesystem (tests, development).",
    )
    credentials_secret: str | None = Field(
        default=None,
        pattern=_DNS_SUBDOMAIN,
        max_length=_NAME,
        description="s3:// only: Secret in the run's namespace with AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY (optionally AWS_SESSION_TOKEN); unset: the pods' own AWS "
        "chain (IRSA, instance role). A gs:// store takes the pods' Application Default "
        "Credentials (workload identity).",
    )
    # One section per store with settings, the store's own model, as in checkpoint: at most
    # the one of uri's scheme is set (settings()).
    s3: S3Settings | None = Field(default=None, exclude_if=lambda v: v is None,
                                  description="How to reach an s3:// store.")
    gcs: GCSSettings | None = Field(default=None, exclude_if=lambda v: v is None,
                                    description="How to reach a gs:// store.")
    endpoint_url: str | None = Field(default=None, max_length=MAX_URI,
                                     description=_older("endpoint_url"))
    region: str | None = Field(default=None, max_length=64, description=_older("region"))
    addressing_style: Literal["path", "virtual", "auto"] = Field(
        default="auto", description=_older("addressing_style"))
    sign_payloads: bool = Field(default=False, description=_older("sign_payloads"))

    @field_validator("uri")
    @classmethod
    def _uri(cls, value: str) -> str:
        # One spelling, no '.', '..' or empty segments, no credentials (never echoed).
        uri = store_uri(value)
        if uri.startswith("s3://"):
            bucket = uri.removeprefix("s3://").split("/", 1)[0]
            if not _S3_BUCKET.match(bucket):
                raise ValueError(f"bucket {bucket!r} is not a valid S3 bucket name "
                                 "(3-63 of a-z, 0-9, '.', '-')")
        return uri

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        # The settings' own check, which never echoes a URL that may hold user:password.
        try:
            return S3Settings(endpoint_url=value).endpoint_url
        except ValidationError as e:
            raise ValueError(e.errors()[0]["msg"].removeprefix("Value error, ")) from None

    @model_validator(mode="after")
    def _settings_of_the_store(self) -> StoreSpec:
        # Against the defaults, which the API server writes into every stored object.
        flat = [k for k in _FLAT_S3 if getattr(self, k) != type(self).model_fields[k].default]
        if flat and self.s3 is not None:
            raise ValueError("store.s3 and its older flat spelling (store.endpointUrl, ...) "
                             "are both set; keep store.s3")
        for name, value in self:
            problem = settings_problem(f"store.{name}", value, self.uri)
            if problem is not None:
                raise ValueError(problem)
        return self

    def settings(self) -> StoreSettings | None:
        """How workers reach the store (no credentials: those come from the store's own
        chain): its scheme's section, or the flat fields of an s3:// store."""
        own = next((v for _, v in self if isinstance(v, StoreSettings)), None)
        if own is not None or not self.uri.startswith(f"{S3Settings.scheme}://"):
            return own
        return S3Settings.model_validate({k: getattr(self, k) for k in _FLAT_S3})

    def settings_path(self) -> str:
        """Where in a QualificationRun the store's settings are written."""
        own = next((n for n, v in self if isinstance(v, StoreSettings)), None)
        return f"spec.store.{own}" if own is not None else "spec.store"


class ResourceRequirements(_Section):
    """Requests and limits of every training container (one pod per node)."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, max_length=MAX_ENTRIES,
        description="What each training container requests (cpu, memory, nvidia.com/gpu, ...).")
    limits: dict[str, Quantity] = Field(default_factory=dict, max_length=MAX_ENTRIES,
                                        description="Limits of each training container.")


# The comparator reads both legs' traces and one checkpoint at a time on CPU: a modest pod,
# wherever the legs ask for GPUs.
COMPARATOR_REQUESTS: dict[str, int | str] = {"cpu": 1, "memory": "2Gi"}


class ComparatorResources(_Section):
    """Requests and limits of the comparator's container."""

    requests: dict[str, Quantity] = Field(
        default_factory=lambda: dict(COMPARATOR_REQUESTS), max_length=MAX_ENTRIES,
        description="What the comparator container requests; replaces the default "
        "(cpu 1, memory 2Gi) as a whole.")
    limits: dict[str, Quantity] = Field(default_factory=dict, max_length=MAX_ENTRIES,
                                        description="Limits of the comparator container.")


class ComparatorSpec(_Section):
    """The comparator Job, which compares the finished legs and writes the verdict."""

    resources: ComparatorResources = Field(
        default_factory=ComparatorResources,
        description="Its container's requests and limits, apart from the legs' (it needs "
        "no GPU; raise memory for large checkpoints).")


class Toleration(_Section):
    """A pod toleration, in Kubernetes' own shape so it can be pasted as is."""

    key: str | None = Field(  # prefix/name of a label key
        default=None, max_length=316,
        description="The taint key it tolerates; unset with operator Exists: every key.")
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal (unset: Equal, Kubernetes' default).")
    value: str | None = Field(default=None, max_length=63,
                              description="The taint value to match (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="The taint effect it tolerates; unset: every effect.")
    toleration_seconds: int | None = Field(
        default=None, ge=0, le=int(MAX_SECONDS),
        description="NoExecute: how long the pod stays bound once the taint appears.")


# A Kubernetes object the API server validates itself (a PodSecurityContext, a
# SecurityContext): kept whole so any field of it can be set, shown by kubectl describe.
KubeObject = Annotated[
    dict[str, Any],
    Field(max_length=MAX_ENTRIES),
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


# The fields of core/v1 PodSecurityContext and SecurityContext (k8s.io/api/core/v1
# types.go). Any other key is refused rather than passed on: a custom resource's pod
# template would prune it silently (hostNetwork here would read as set and do nothing).
POD_SECURITY_FIELDS = frozenset({
    "appArmorProfile", "fsGroup", "fsGroupChangePolicy", "runAsGroup", "runAsNonRoot",
    "runAsUser", "seLinuxChangePolicy", "seLinuxOptions", "seccompProfile",
    "supplementalGroups", "supplementalGroupsPolicy", "sysctls", "windowsOptions"})
CONTAINER_SECURITY_FIELDS = frozenset({
    "allowPrivilegeEscalation", "appArmorProfile", "capabilities", "privileged",
    "procMount", "readOnlyRootFilesystem", "runAsGroup", "runAsNonRoot", "runAsUser",
    "seLinuxOptions", "seccompProfile", "windowsOptions"})


def _known_fields(value: dict[str, Any], known: frozenset[str], kind: str) -> dict[str, Any]:
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{', '.join(unknown)[:200]}: not a field of a {kind} (host "
                         "namespaces, volumes and the like are not settable here)")
    return value


class SecuritySpec(_Section):
    """How locked down the run's pods are. The defaults meet the Pod Security "restricted"
    profile; each object given here is merged over its default, key by key. What leaves
    the profile (privileged, root, added capabilities, ...) runs only where the operator's
    allowlist.security permits it."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True,
                              validate_by_alias=True, serialize_by_alias=True)

    pod_security_context: KubeObject = Field(
        default_factory=dict, alias="podSecurityContext",
        description="Merged over the default pod securityContext: runAsNonRoot, "
        "runAsUser/runAsGroup/fsGroup 65532 (the images' user), seccomp RuntimeDefault. "
        "runAsUser 0, runAsNonRoot false, an Unconfined profile and sysctls need the "
        "operator's allowlist.security.")
    security_context: KubeObject = Field(
        default_factory=dict, alias="securityContext",
        description="Merged over the default container securityContext: no privilege "
        "escalation, every capability dropped, read-write root filesystem. privileged, "
        "allowPrivilegeEscalation, added capabilities, root and an Unconfined profile "
        "need the operator's allowlist.security.")
    shm_size_limit: Quantity = Field(
        default="2Gi", alias="shmSizeLimit",
        description="sizeLimit of the memory-backed /dev/shm of training pods (NCCL and "
        "DataLoader workers use it); it counts against the pod's memory.")

    @field_validator("pod_security_context")
    @classmethod
    def _pod_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _known_fields(value, POD_SECURITY_FIELDS, "PodSecurityContext")

    @field_validator("security_context")
    @classmethod
    def _container_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _known_fields(value, CONTAINER_SECURITY_FIELDS, "SecurityContext")


class RetentionSpec(_Section):
    """What becomes of the run's store artifacts when the QualificationRun is deleted."""

    policy: Literal["Delete", "Retain"] = Field(
        default="Retain",
        description="What happens to the run's store artifacts (traces, checkpoints, "
        "reports) when the QualificationRun is deleted. Retain keeps the evidence; expire "
        "it with the bucket's lifecycle rules.",
    )


Backend = Literal["pytorchjob", "trainjob"]
# How long the Job controller waits before it replaces a failed (a deleted) pod of a
# TrainJob's Job: its pod failure backoff after a first failure.
TRAINJOB_REPLACEMENT_S = 10.0
BACKENDS: tuple[Backend, ...] = ("pytorchjob", "trainjob")


class QualificationRunSpec(SpecSections):
    """A qualification on a cluster: the spec's sections plus image, store and placement."""

    stack: StackSpec
    store: StoreSpec
    backend: Backend | None = Field(
        default=None,
        description="What runs each leg: pytorchjob (a Kubeflow training operator v1 "
        "PyTorchJob) or trainjob (a Kubeflow Trainer v2 TrainJob on the runtime the chart "
        "installs). Unset: the operator's default (chart value backend), fixed when the run "
        "starts.",
    )
    zoom: Literal["never", "onFail"] = Field(
        default="never",
        description="onFail: when the verdict is FAIL, the operator runs a zoom Job that "
        "replays the first divergent step of both legs with every module hooked and adds "
        "zoom.json and a zoom section to the report; status.zoom says where it starts.",
    )
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    comparator: ComparatorSpec = Field(default_factory=ComparatorSpec)
    node_selector: dict[str, str] = Field(
        default_factory=dict, max_length=MAX_ENTRIES,
        description="nodeSelector of every pod the run starts.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=MAX_ENTRIES,
        description="Tolerations of every pod the run starts.",
    )
    service_account_name: str | None = Field(
        default=None, pattern=_DNS_SUBDOMAIN, max_length=_NAME,
        description="ServiceAccount of the pods (e.g. one bound to an IAM role for S3).",
    )
    retention: RetentionSpec = Field(default_factory=RetentionSpec)
    security: SecuritySpec = Field(default_factory=SecuritySpec)
    allow_rendezvous_host_kill: bool = Field(
        default=False,
        description="Allow a cut whose rank runs on pod worker-0. With the c10d rendezvous "
        "that pod hosts the rendezvous store, so deleting it ends the whole group rather "
        "than preempting one node; only meaningful when a lost job is what you qualify.",
    )


# Sections of QualificationSpec, in its own order.
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


# -- status -----------------------------------------------------------------------------


class _Status(BaseModel):
    # camelCase from the same generator as the spec: ``run_uri`` is ``runUri``.
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, validate_by_name=True,
                              validate_by_alias=True, serialize_by_alias=True)


def _time(value: Any) -> Any:
    """Epoch seconds (what the qualification machine records) become UTC datetimes. The
    machine also keeps times read from the store (a resume's, from a trace record): one no
    timestamp can hold is clamped into range with a warning rather than raised, which
    would fail every reconcile of the run."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not 0 <= value <= MAX_EPOCH_SECONDS:  # NaN too
            clamped = MAX_EPOCH_SECONDS if value > 0 else 0.0
            log.warning("a status time of %.6g epoch seconds is out of range; shown as %s",
                        value, datetime.fromtimestamp(clamped, tz=UTC).isoformat())
            value = clamped
        return datetime.fromtimestamp(value, tz=UTC)
    return value


def _finite(value: Any) -> Any:
    """A JSON number cannot be NaN or infinite; such drift is reported as unknown (null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


Time = Annotated[datetime, BeforeValidator(_time)]
Drift = Annotated[float | None, BeforeValidator(_finite)]


class Condition(_Status):
    """A Kubernetes condition: Ready (finished?) or Qualified (passed?)."""

    type: Literal["Ready", "Qualified"] = Field(
        description="Ready: True once finished with a verdict, False when the run failed, "
        "Unknown meanwhile. Qualified: True for a PASS, False for any other verdict or a "
        "failure, Unknown before a verdict.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str | None = Field(
        default=None, description="One word: the phase, the verdict, NoVerdict, or what ended "
        "the run (Timeout, Error, InvalidSpec, NotAllowed, ...).")
    message: str | None = Field(default=None, description="The same in words, redacted.")
    last_transition_time: Time | None = Field(
        default=None, description="When status last changed.")
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation it was computed from.")


class LegStatus(_Status):
    """One leg's progress: control, preempted, or a negative control's leg."""

    job: str | None = Field(default=None, description="the leg's PyTorchJob or TrainJob")
    attempts: int = Field(default=0, description="Attempts seen in its trace: 1 + restarts.")
    steps: int = Field(default=0, description="Steps every rank has finished.")
    launched_at: Time | None = Field(default=None, description="When it was launched.")
    killed_at: Time | None = Field(default=None, description="When its armed rank was killed.")
    resumed_at: Time | None = Field(
        default=None, description="When every rank had finished its first step after the "
        "restart.")
    finished_at: Time | None = Field(
        default=None, description="When the leg was seen done: every rank had written its "
        "completion marker.")
    restart_seconds: Drift = Field(default=None, description="kill -> first resumed step")


class PreemptionStatus(_Status):
    """The kill delivered to the preempted leg's armed rank."""

    leg: str = Field(description="The leg that was cut.")
    pod: str | None = Field(default=None, description="The armed rank's pod, from its beacon.")
    rank: int = Field(description="The armed rank.")
    mode: Literal["hard", "graceful"] = Field(description="spec.preemption.mode.")
    injected_at: Time | None = Field(default=None, description="When the kill was delivered.")


class FirstDivergence(_Status):
    """Where the legs first differ."""

    step: int = Field(description="The optimizer step.")
    boundary: str = Field(description="The boundary, one of spec.comparison.boundaries.")
    rank: int = Field(description="The rank.")


class VerdictStatus(_Status):
    """A summary of the verdict.json the comparator wrote into the run location."""

    result: Result = Field(
        description="PASS, FAIL, NONDETERMINISTIC or INVALID (INVALID too for a run that "
        "failed before its comparison).")
    reason: str | None = Field(default=None, description="One sentence a person can act on.")
    first_divergence: FirstDivergence | None = None
    first_divergence_summary: str | None = Field(
        default=None, description="'step 6 lr rank 1', or 'none'")
    exact_through_step: int | None = Field(
        default=None, description="The last step up to which every boundary on every rank "
        "was equal (0: none).")
    param_max_abs_diff: Drift = Field(
        default=None, description="Final model parameters: the largest absolute difference.")
    param_rel_l2_diff: Drift = Field(
        default=None, description="Final model parameters: ||a-b||_2 / ||a||_2.")
    param_mismatch_fraction: Drift = Field(
        default=None, description="Final model parameters: the fraction of elements whose "
        "bits differ.")
    loss_max_abs_diff: Drift = Field(
        default=None, description="The largest difference of a step's loss between the legs.")
    controls_detected: int | None = Field(default=None,
                                          description="Negative controls detected.")
    controls_total: int | None = Field(
        default=None, description="Negative controls owed a detection (not applicable and "
        "not judged ones left out).")


class ZoomStatus(_Status):
    """The zoom Job of a FAIL (``spec.zoom: onFail``) and what it found."""

    job: str = Field(description="The zoom Job.")
    state: Literal["Running", "Succeeded", "Failed"] = Field(
        description="Running, Succeeded or Failed.")
    origin_kind: str | None = Field(default=None, description="input (before the model: the "
                                    "data path or loss_fn), loss_fn, module, reduction, "
                                    "clipping, optimizer, state or none")
    origins: list[str] = Field(default_factory=list, max_length=8,
                               description="Origin modules, or the stage, in execution order.")
    summary: str | None = Field(default=None, description="One sentence a person can act on.")
    url: str | None = Field(default=None, description="zoom.json in the run location")


class QualificationRunStatus(_Status):
    """What the operator reports; ``machine`` lets a restarted operator continue."""

    phase: Phase | None = Field(
        default=None, description="Pending, LegsRunning, Armed, Preempted, Resumed, "
        "Comparing, then Succeeded or Failed.")
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation the status was computed from.")
    conditions: list[Condition] = Field(default_factory=list,
                                        description="Ready and Qualified.")
    backend: Backend | None = Field(default=None, description="what runs the legs")
    launcher: str | None = Field(
        default=None, description="what started the legs' workers (spec.world.launcher): "
        "torchrun, every worker a fresh interpreter; or forked from one warm process")
    launcher_caveats: list[str] | None = Field(
        default=None,
        description="what a verdict under this launcher cannot see (none for torchrun)")
    pin: str | None = Field(default=None,
                            description="The label it is reported under: spec.stack.pin, or from "
                            "the image.")
    run_uri: str | None = Field(
        default=None, description="The run location: <store.uri>/<namespace>/<name>/<uid>.")
    report_url: str | None = Field(
        default=None, description="report.html in the run location, once there is a verdict.")
    legs: dict[str, LegStatus] = Field(default_factory=dict,
                                       description="Each leg's progress, by leg name.")
    preemption: PreemptionStatus | None = None
    comparator_job: str | None = Field(default=None, description="The comparator Job.")
    checkpoint_key_secret: str | None = Field(
        default=None, max_length=253,
        description="The Secret holding the run's checkpoint key, named by the API server "
        "when the run started (recorded before any pod names it)")
    verdict: VerdictStatus | None = None
    zoom: ZoomStatus | None = None
    started_at: Time | None = Field(default=None,
                                    description="When the qualification started.")
    completed_at: Time | None = Field(default=None,
                                      description="When it reached Succeeded or Failed.")
    machine: dict[str, Any] = Field(
        default_factory=dict,
        description="The serialised qualification state machine (resumequal.qualify."
        "QualificationStatus); kept as is.",
    )

    def to_k8s(self) -> dict[str, Any]:
        """The status as the API stores it: camelCase, RFC 3339 times, no nulls, and no
        credential in any message (:func:`~resumequal.redact.redact`)."""
        status: dict[str, Any] = redact_tree(
            self.model_dump(mode="json", by_alias=True, exclude_none=True))
        return status


class QualificationRun(BaseModel):
    """A whole QualificationRun object (for examples and tests; the API holds metadata)."""

    model_config = ConfigDict(extra="forbid")
    api_version: Literal["resumequal.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["QualificationRun"]
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: QualificationRunSpec
    status: QualificationRunStatus | None = None
