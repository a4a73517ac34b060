"""What a QualificationRun may name: the operator's allowlists, judged before anything is
created.

Creating a QualificationRun is creating pods: the run's image runs as the run's
ServiceAccount, with the Secrets it names. And the operator itself reads and writes the
run's store with *its own* credentials. The allowlists, set by whoever installs the operator
(the chart's ``allowlist`` values, ``resumequal-operator run --allow-*``), bound both:

- ``images``: globs (:func:`fnmatch.fnmatchcase`) over the image reference, as written
  or fully qualified (``train:1`` is also ``docker.io/library/train:1``), e.g.
  ``ghcr.io/acme/*``. Empty: any image.
- ``service_accounts``: globs over the pods' ServiceAccount; a run that names none runs
  as its namespace's ``default``, and is judged as ``default``. Empty: any.
- ``buckets``: globs over the bucket of ``store.uri``; when set, only object stores
  (``s3://``, ``gs://``). Empty: any bucket (the operator's IAM policy is then the only bound).
- ``endpoints``: exact ``http(s)://host[:port]`` URLs a run may name as its store's
  endpoint (``store.s3.endpointUrl``, ``store.gcs.endpointUrl``, ``store.endpointUrl``).
  Empty: none — a run then uses the operator's own endpoint (AWS S3 or its
  ``AWS_ENDPOINT_URL_S3``, Cloud Storage or its ``STORAGE_EMULATOR_HOST``). This one is
  closed by default because the operator signs its store requests with its own
  credentials: a run naming any URL would have it send signed requests (with its session
  token) wherever the run creator likes, a server-side request forgery that hands out what
  the run creator could not otherwise reach.
- ``security``: what of the Pod Security "restricted" profile a run's ``spec.security``
  may leave (:mod:`.podsecurity`): ``privileged``, ``runAsRoot``,
  ``allowPrivilegeEscalation``, ``unconfined`` (seccomp or AppArmor) each a yes or no;
  ``capabilities`` a run may add (``*``: any, and keeping the runtime's defaults) and
  ``sysctls`` (globs) it may set. Default: none — every pod restricted. Closed by default
  because a privileged or root pod on a node is the node, and whoever may create a
  QualificationRun need not be who may own nodes.

Must not: talk to the cluster or the store, or echo a credential (a refused endpoint is
shown as scheme://host:port only).
"""

from __future__ import annotations

import fnmatch
import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from resumequal_operator.podsecurity import ANY_CAPABILITY, capability, departures
from resumequal_operator.resource import QualificationRunSpec, SecuritySpec
from resumequal_operator.validation import Problem

DEFAULT_SERVICE_ACCOUNT = "default"
_MAX_PATTERN = 1024
_MAX_ENTRIES = 256

# A plain endpoint: scheme, host name or address, optional port and path, nothing else
# (no userinfo, query, fragment or escape), so that what is judged here is what botocore
# connects to, with no second reading by another URL parser.
_ENDPOINT = re.compile(
    r"^(?P<scheme>[A-Za-z]+)://(?P<host>[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])"
    r"(?::(?P<port>[0-9]{1,5}))?(?P<path>/[A-Za-z0-9._~/-]*)?$")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def endpoint_key(url: str) -> str | None:
    """``url`` in one spelling (``scheme://host:port/path``, scheme and host lowercase,
    default port written out, no trailing '/'), or None when it is not a plain
    http(s)://host[:port] URL."""
    m = _ENDPOINT.match(url)
    if m is None:
        return None
    scheme, host = m["scheme"].lower(), m["host"].lower()
    if scheme not in _DEFAULT_PORTS:
        return None
    port = int(m["port"]) if m["port"] else _DEFAULT_PORTS[scheme]
    if not 0 < port < 65536:
        return None
    path = (m["path"] or "").rstrip("/")
    return f"{scheme}://{host}:{port}{path}"


def _endpoint(value: str) -> str:
    key = endpoint_key(value)
    if key is None:
        # Not echoed: an entry with user:password would leak it into messages.
        raise ValueError("an endpoint is http(s)://host[:port][/path], without "
                         "user:password, query or fragment")
    return key


Pattern = Annotated[str, Field(min_length=1, max_length=_MAX_PATTERN, pattern=r"^\S+$")]
Endpoint = Annotated[str, Field(max_length=_MAX_PATTERN), AfterValidator(_endpoint)]


def qualified_image(image: str) -> str:
    """The image with its registry (and ``library/``) written out, as the kubelet pulls it:
    ``train:1`` is ``docker.io/library/train:1``, ``acme/train`` ``docker.io/acme/train``."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return image
    if not sep:
        return f"docker.io/library/{image}"
    return f"docker.io/{image}"


def _capability(value: str) -> str:
    return value if value == ANY_CAPABILITY else capability(value)


Capability = Annotated[str, Field(pattern=r"^(\*|[A-Za-z_]{1,64})$"),
                       AfterValidator(_capability)]


class SecurityAllowlist(BaseModel):
    """What of the restricted profile runs may leave (module docstring); all closed by
    default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    privileged: bool = False
    run_as_root: bool = False
    allow_privilege_escalation: bool = False
    unconfined: bool = False
    capabilities: tuple[Capability, ...] = Field(default=(), max_length=_MAX_ENTRIES)
    sysctls: tuple[Pattern, ...] = Field(default=(), max_length=_MAX_ENTRIES)

    def refusals(self, security: SecuritySpec) -> list[Problem]:
        """Each departure from the restricted profile no entry permits, naming the field."""
        granted = {"privileged": self.privileged, "runAsRoot": self.run_as_root,
                   "unconfined": self.unconfined,
                   # A privileged container escalates by definition (and the API server
                   # refuses privileged with allowPrivilegeEscalation false).
                   "allowPrivilegeEscalation": self.allow_privilege_escalation
                   or self.privileged}
        out: list[Problem] = []
        for d in departures(security):
            if d.entry == "capabilities":
                ok = ANY_CAPABILITY in self.capabilities or d.item in self.capabilities
                rule = f"allowlist.security.capabilities {_shown(self.capabilities)}"
            elif d.entry == "sysctls":
                ok = d.item is not None and _matches(self.sysctls, d.item)
                rule = f"allowlist.security.sysctls {_shown(self.sysctls)}"
            else:
                ok = granted[d.entry]
                rule = f"allowlist.security.{d.entry} (false)"
            if not ok:
                out.append(Problem(path=d.path, message=f"{d.what} is not allowed by {rule}"))
        return out


class Allowlist(BaseModel):
    """The operator's allowlists (see the module docstring); empty ones restrict nothing,
    except ``endpoints`` and ``security``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    images: tuple[Pattern, ...] = Field(default=(), max_length=_MAX_ENTRIES)
    service_accounts: tuple[Pattern, ...] = Field(default=(), max_length=_MAX_ENTRIES)
    endpoints: tuple[Endpoint, ...] = Field(default=(), max_length=_MAX_ENTRIES)
    buckets: tuple[Pattern, ...] = Field(default=(), max_length=_MAX_ENTRIES)
    security: SecurityAllowlist = Field(default_factory=SecurityAllowlist)

    def refusals(self, spec: QualificationRunSpec) -> list[Problem]:
        """Each rule the run breaks, naming the field, the value and the rule."""
        out: list[Problem] = []
        image = spec.stack.image
        if self.images and not _matches(self.images, image, qualified_image(image)):
            out.append(Problem(path="spec.stack.image", message=(
                f"image {image} is not allowed by allowlist.images {_shown(self.images)}")))
        account = spec.service_account_name or DEFAULT_SERVICE_ACCOUNT
        if self.service_accounts and not _matches(self.service_accounts, account):
            unset = "" if spec.service_account_name else " (unset: the namespace's default)"
            out.append(Problem(path="spec.serviceAccountName", message=(
                f"service account {account}{unset} is not allowed by "
                f"allowlist.serviceAccounts {_shown(self.service_accounts)}")))
        out += self.security.refusals(spec.security)
        out += self._store_refusals(spec)
        return out

    def _store_refusals(self, spec: QualificationRunSpec) -> list[Problem]:
        out: list[Problem] = []
        store = spec.store
        settings = store.settings()
        if self.buckets:
            if settings is None:
                out.append(Problem(path="spec.store.uri", message=(
                    f"allowlist.buckets {_shown(self.buckets)} is set: only object stores "
                    "(s3://, gs://) in those buckets are allowed")))
            else:
                bucket = store.uri.partition("://")[2].split("/", 1)[0]
                if not _matches(self.buckets, bucket):
                    out.append(Problem(path="spec.store.uri", message=(
                        f"bucket {bucket} is not allowed by allowlist.buckets "
                        f"{_shown(self.buckets)}")))
        endpoint = None if settings is None else settings.endpoint()
        if endpoint is not None:
            key = endpoint_key(endpoint)
            if key is None or key not in self.endpoints:
                shown = key or "this endpoint (not a plain http(s)://host[:port] URL)"
                listed = (_shown(self.endpoints) if self.endpoints else
                          "[] (empty: runs use the operator's own endpoint; name none)")
                out.append(Problem(path=f"{store.settings_path()}.endpointUrl", message=(
                    f"endpoint {shown} is not allowed by allowlist.endpoints {listed}; the "
                    "operator signs store requests with its own credentials and sends "
                    "them only to listed endpoints")))
        return out

    def allows_store(self, spec: QualificationRunSpec) -> bool:
        """Whether the operator may send requests to the run's store."""
        return not self._store_refusals(spec)


def _matches(patterns: tuple[str, ...], *values: str) -> bool:
    return any(fnmatch.fnmatchcase(v, p) for p in patterns for v in values)


def _shown(patterns: tuple[str, ...], limit: int = 8) -> str:
    """The list as a message shows it: at most ``limit`` entries."""
    more = f", ... {len(patterns) - limit} more" if len(patterns) > limit else ""
    return "[" + ", ".join(patterns[:limit]) + more + "]"
