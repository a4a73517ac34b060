"""How a ``gs://`` store is reached: the spec's ``checkpoint.gcs`` section
(:class:`GCSSettings`) and the environment variable that carries it to a worker without a
spec.

Settings only: no SDK and no store, as the spec imports this module and importing the spec
must not load the Cloud Storage client. No credentials here: :mod:`resumequal.store.gcs`
says where they come from.
"""

from __future__ import annotations

import os
from typing import ClassVar

from pydantic import Field

from resumequal.store.errors import StoreConfigError
from resumequal.store.s3settings import Endpoint, endpoint_problem
from resumequal.store.settings import (
    MAX_URL,
    StoreSettings,
    connect_timeout_field,
    max_attempts_field,
    read_timeout_field,
)

# The Cloud Storage client's own variable for an emulator (scheme included): requests go
# there without credentials.
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


class GCSSettings(StoreSettings):
    """How workers and the comparator reach a ``gs://`` checkpoint store (Google Cloud
    Storage's JSON API). No credentials here: they come from Application Default
    Credentials (GOOGLE_APPLICATION_CREDENTIALS, workload identity, the metadata server),
    since specs are written into run files and reports."""

    scheme: ClassVar[str] = "gs"

    endpoint_url: Endpoint = Field(
        default=None, max_length=MAX_URL,
        description="http(s)://host:port of a Cloud Storage emulator (fake-gcs-server), "
        "reached without credentials; None: storage.googleapis.com with Application Default "
        "Credentials.",
    )
    max_attempts: int = max_attempts_field("the store")
    connect_timeout_seconds: float = connect_timeout_field()
    read_timeout_seconds: float = read_timeout_field(
        60.0, "; an upload of one object is one request, so raise it for large checkpoint "
        "shards on a slow link.")

    def endpoint(self) -> str | None:
        return self.endpoint_url

    def environment(self) -> dict[str, str]:
        return {EMULATOR_ENV: self.endpoint_url} if self.endpoint_url else {}


def gcs_settings(settings: GCSSettings | None) -> GCSSettings:
    """``settings``, or without them the defaults and an emulator named by
    ``STORAGE_EMULATOR_HOST``."""
    if settings is not None:
        return settings
    emulator = os.environ.get(EMULATOR_ENV, "").strip()
    if not emulator:
        return GCSSettings()
    problem = endpoint_problem(emulator)
    if problem is not None:
        raise StoreConfigError(f"{EMULATOR_ENV} {problem}")
    return GCSSettings(endpoint_url=emulator)


__all__ = ["EMULATOR_ENV", "GCSSettings", "gcs_settings"]
