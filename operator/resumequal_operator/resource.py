"""The QualificationRun custom resource: its spec and status as pydantic models.

The spec reuses every section of :class:`resumequal.spec.QualificationSpec` as the same
models (same fields, defaults and per-field validation) and adds what only a cluster needs:
the image (``stack``), the object store (``store``), pod placement and ``retention``. Spec
and status follow the Kubernetes API conventions: every field is camelCase on the wire,
generated from its Python name (``node_selector`` is ``nodeSelector``) by the same alias
generator as the spec's sections, so a new field gets its spelling without a table. The
snake_case names are read too, and problems name fields in camelCase.

Validation comes in two layers: the models check each field (this is also what the CRD
schema is generated from), and :func:`.validation.parse_run_spec` adds the checks across
fields. The status is :mod:`.runstatus`'s.
"""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from resumequal.spec import (
    MAX_SECONDS,
    MAX_URI,
    PIN_PATTERN,
    SECTION_CONFIG,
    SpecSections,
    store_uri,
)
from resumequal.store import GCSSettings, S3Settings, StoreSettings
from resumequal.store.settings import settings_problem

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
