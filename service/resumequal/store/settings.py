"""What every store's settings are: a section of the spec that says how a store of one
scheme is reached (:class:`StoreSettings`), and how those settings travel to a process
that reads its run location before it has a spec (:meth:`StoreSettings.environment`).

Each store that has settings declares its model beside it (``S3Settings`` for ``s3://``,
``GCSSettings`` for ``gs://``; a folder has none) and names it as its class's
``settings`` (:mod:`resumequal.store.registry`). A run carries one such value, the one of
its store's scheme; everything outside this package passes it along without looking in.

Settings only: no SDK and no store, as the spec imports the models and importing the spec
must not load an SDK. Of resumequal it imports only the error base.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# A store's settings are a section of the spec and are spelt like every other one
# (resumequal.spec.SECTION_CONFIG: camelCase on the wire, unknown keys refused, finite
# floats, inputs kept out of messages) and bounded by the spec's ceilings (MAX_URI,
# MAX_SECONDS). Written out here because the spec imports this package; test_store checks
# that the two agree, and the generated spec reference and CRD would show any difference.
SPEC_SECTION = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel,
                          validate_by_name=True, validate_by_alias=True,
                          serialize_by_alias=True, allow_inf_nan=False,
                          hide_input_in_errors=True)
MAX_URL = 2048
MAX_SECONDS = 7 * 24 * 3600.0


def max_attempts_field(who: str) -> Any:
    """The field of how many attempts ``who`` (the client) makes per request."""
    return Field(
        default=5, ge=1, le=20,
        description=f"Attempts {who} makes per request (exponential backoff) for the runner "
        "and the operator: 5 ride out ~15 s of endpoint trouble. A worker makes its own "
        "attempts for timeouts.backendErrorSeconds instead.",
    )


def connect_timeout_field() -> Any:
    """The field of how long a connection may take to open."""
    return Field(
        default=3.0, gt=0, le=MAX_SECONDS,
        description="Seconds to open a connection before the attempt fails (and is retried).",
    )


def read_timeout_field(default: float, advice: str) -> Any:
    """The field of how long the endpoint may send nothing before an attempt fails;
    ``advice`` ends the description (punctuation first) with this store's own words."""
    return Field(
        default=default, gt=0, le=MAX_SECONDS,
        description="Seconds without a byte from the endpoint before the attempt fails (and "
        f"is retried){advice}",
    )


class StoreSettings(BaseModel):
    """How workers and the comparator reach a store of :attr:`scheme`: a section of the
    spec, never holding a credential (specs are written into run files and reports)."""

    model_config = SPEC_SECTION

    scheme: ClassVar[str]
    """The URI scheme of the stores these settings reach, e.g. ``"s3"``."""

    def endpoint(self) -> str | None:
        """The endpoint requests go to, or None for the service's public one."""
        return None

    def environment(self) -> dict[str, str]:
        """The variables that carry these settings to a process started without a spec (a
        worker reads its leg's spec from the run location first): what the store reads
        when it is opened with no settings."""
        return {}


def settings_problem(name: str, value: object, uri: str | None) -> str | None:
    """Why the field ``name`` may not hold ``value`` beside the store ``uri``: settings of
    another scheme's store; None for any other value."""
    if not isinstance(value, StoreSettings) or (uri or "").startswith(f"{value.scheme}://"):
        return None
    return f"{name} configures {value.scheme}:// stores; the store is {uri!r}"


__all__ = ["MAX_SECONDS", "MAX_URL", "SPEC_SECTION", "StoreSettings", "connect_timeout_field",
           "max_attempts_field", "read_timeout_field", "settings_problem"]
