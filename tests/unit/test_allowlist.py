"""The operator's allowlists as pure logic: patterns, endpoints in one spelling, messages."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from resumequal_operator.allowlist import Allowlist, endpoint_key, qualified_image
from resumequal_operator.main import main
from resumequal_operator.resource import QualificationRunSpec
from resumequal_operator.validation import parse_run_spec


def _spec(**sections: Any) -> QualificationRunSpec:
    body: dict[str, Any] = {"stack": {"image": "ghcr.io/acme/train:1"},
                            "store": {"uri": "s3://acme-runs/q"},
                            "world": {"nnodes": 2}, "preemption": {"rank": 1}}
    body.update(sections)
    return parse_run_spec(body)


def _fields(allowlist: Allowlist, spec: QualificationRunSpec) -> list[str]:
    return [p.path for p in allowlist.refusals(spec)]


def test_empty_lists_restrict_nothing_but_named_endpoints() -> None:
    anything = Allowlist()
    assert anything.refusals(_spec(serviceAccountName="root-ish")) == []
    assert anything.refusals(_spec(store={"uri": "file:///tmp/x"})) == []
    [problem] = anything.refusals(_spec(store={"uri": "s3://b-1/q",
                                               "endpointUrl": "http://minio:9000"}))
    assert problem.path == "spec.store.endpointUrl"
    assert "endpoint http://minio:9000 is not allowed by allowlist.endpoints []" in str(problem)


@pytest.mark.parametrize(("image", "allowed"), [
    ("ghcr.io/acme/train:1", True),
    ("ghcr.io/acme/team/train@sha256:" + "a" * 64, True),
    ("ghcr.io/acmex/train:1", False),  # a prefix is not a path segment
    ("ghcr.io.evil.example/acme/train:1", False),
    ("evil.example/ghcr.io/acme/train:1", False),
    ("acme/train:1", False),  # docker.io/acme/train
    ("train:1", True),  # docker.io/library/train, listed
])
def test_image_globs(image: str, allowed: bool) -> None:
    allowlist = Allowlist(images=("ghcr.io/acme/*", "docker.io/library/train:*"))
    assert (_fields(allowlist, _spec(stack={"image": image})) == []) is allowed


def test_images_are_qualified_as_the_kubelet_pulls_them() -> None:
    assert qualified_image("train:1") == "docker.io/library/train:1"
    assert qualified_image("acme/train") == "docker.io/acme/train"
    assert qualified_image("localhost/train") == "localhost/train"
    assert qualified_image("registry:5000/train") == "registry:5000/train"
    assert qualified_image("ghcr.io/a/b:1") == "ghcr.io/a/b:1"


def test_service_accounts_and_the_default_one() -> None:
    allowlist = Allowlist(service_accounts=("qual-*",))
    assert _fields(allowlist, _spec(serviceAccountName="qual-runner")) == []
    assert _fields(allowlist, _spec(serviceAccountName="admin")) == ["spec.serviceAccountName"]
    [unset] = allowlist.refusals(_spec())
    assert "service account default (unset: the namespace's default)" in unset.message
    assert Allowlist(service_accounts=("default",)).refusals(_spec()) == []


def test_buckets_and_file_stores() -> None:
    allowlist = Allowlist(buckets=("acme-*",))
    assert allowlist.refusals(_spec()) == []
    [other] = allowlist.refusals(_spec(store={"uri": "s3://other/q"}))
    assert str(other) == ("spec.store.uri: bucket other is not allowed by allowlist.buckets "
                          "[acme-*]")
    [local] = allowlist.refusals(_spec(store={"uri": "file:///srv/runs"}))
    assert "only object stores (s3://, gs://)" in local.message


@pytest.mark.parametrize(("url", "key"), [
    ("http://minio:9000", "http://minio:9000"),
    ("HTTP://MinIO:9000/", "http://minio:9000"),
    ("https://s3.example", "https://s3.example:443"),
    ("http://s3.example:80/gw/", "http://s3.example:80/gw"),
    ("http://[::1]:9000", "http://[::1]:9000"),
    ("http://u:p@minio:9000", None),
    ("http://minio:9000?x=1", None),
    ("http://minio:9000#@evil", None),
    ("http://evil\\@minio:9000", None),
    ("http://minio%2eevil:9000", None),
    ("ftp://minio", None),
    ("http://minio:99999", None),
])
def test_endpoints_have_one_spelling(url: str, key: str | None) -> None:
    assert endpoint_key(url) == key


def test_endpoints_are_matched_exactly_in_that_spelling() -> None:
    allowlist = Allowlist(endpoints=("http://MinIO.storage.svc:9000/",))
    assert allowlist.endpoints == ("http://minio.storage.svc:9000",)

    def refused(url: str) -> list[str]:
        return _fields(allowlist, _spec(store={"uri": "s3://b-1/q", "endpointUrl": url}))

    assert refused("http://minio.storage.svc:9000") == []
    assert refused("http://minio.storage.svc:9000/") == []
    assert refused("http://minio.storage.svc:9001") == ["spec.store.endpointUrl"]
    assert refused("https://minio.storage.svc:9000") == ["spec.store.endpointUrl"]
    assert refused("http://minio.storage.svc.evil.example:9000") == ["spec.store.endpointUrl"]
    assert refused("http://169.254.169.254") == ["spec.store.endpointUrl"]
    assert allowlist.allows_store(_spec()) is True


def test_every_rule_broken_is_named_and_the_list_is_bounded_in_messages() -> None:
    allowlist = Allowlist(images=tuple(f"r{i}.example/*" for i in range(20)),
                          service_accounts=("qual",), buckets=("acme-*",))
    problems = allowlist.refusals(_spec(store={"uri": "s3://other/q",
                                               "endpointUrl": "http://x:1"}))
    assert [p.path for p in problems] == ["spec.stack.image", "spec.serviceAccountName",
                                          "spec.store.uri", "spec.store.endpointUrl"]
    assert "... 12 more]" in problems[0].message


@pytest.mark.parametrize(("field", "value"), [
    ("endpoints", "http://user:secret@minio:9000"),
    ("endpoints", "minio:9000"),
    ("images", ""),
    ("images", "has space"),
])
def test_bad_entries_are_refused_at_construction(field: str, value: str) -> None:
    with pytest.raises(ValidationError):
        Allowlist(**{field: (value,)})


def test_a_bad_option_is_a_usage_error_that_does_not_echo_it() -> None:
    result = CliRunner().invoke(main, ["run", "--allow-endpoint", "http://user:secret@m:9"])
    assert result.exit_code == 2
    assert "--allow-endpoint" in result.stderr and "secret" not in result.stderr
