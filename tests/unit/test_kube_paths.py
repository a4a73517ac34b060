"""``Kube`` checks every segment of the paths it requests itself: a name that is no name
(``..``, a '/', empty) is refused with our own error, and no request is sent."""

from __future__ import annotations

from typing import Any

import pytest

from resumequal.errors import ClusterError
from resumequal_operator.kube import (
    JOBS,
    PODS,
    QUALIFICATION_RUNS,
    SECRETS,
    InvalidName,
    Kind,
    Kube,
)


class _Recorder:
    """An ApiClient that records what it is asked and answers nothing."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def call_api(self, path: str, method: str, **_: Any) -> Any:
        self.paths.append(path)
        raise AssertionError(f"{method} {path} was sent")


BAD_NAMES = ["", ".", "..", "../secrets/key", "a/b", "worker-0/exec", "a%2Fb", "A", "a b",
             "a..b", "-a", "x" * 254, "a?watch=true"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_name_that_is_no_path_segment_is_refused_before_any_request(name: str) -> None:
    api = _Recorder()
    kube = Kube(api)
    for call in (lambda: kube.get(PODS, "quals", name),
                 lambda: kube.delete(PODS, "quals", name, grace_seconds=0),
                 lambda: kube.patch(JOBS, "quals", name, {}),
                 lambda: kube.replace(QUALIFICATION_RUNS, "quals",
                                      {"metadata": {"name": name}}, sub="status")):
        with pytest.raises(InvalidName) as info:
            call()
        assert isinstance(info.value, ClusterError)
        assert "no request sent" in str(info.value)
    assert api.paths == []


@pytest.mark.parametrize("namespace", ["", "..", "a/b", "kube-system/secrets", "x" * 64,
                                       "a.b"])
def test_a_namespace_that_is_no_dns_label_is_refused(namespace: str) -> None:
    api = _Recorder()
    kube = Kube(api)
    with pytest.raises(InvalidName):
        kube.get(SECRETS, namespace, "ok")
    with pytest.raises(InvalidName):
        kube.list(JOBS, namespace)
    with pytest.raises(InvalidName):
        kube.create(JOBS, namespace, {"metadata": {"name": "ok"}})
    assert api.paths == []


def test_a_subresource_or_kind_that_is_no_word_is_refused() -> None:
    kube = Kube(_Recorder())
    with pytest.raises(InvalidName):
        kube.patch(QUALIFICATION_RUNS, "quals", "run", {}, sub="../../pods")
    with pytest.raises(InvalidName):
        Kind("batch", "v1", "jobs/../secrets")
    with pytest.raises(InvalidName):
        Kind("a/b", "v1", "jobs")


def test_valid_names_make_the_paths_the_api_serves() -> None:
    assert PODS.path("quals", "run-preempted-1a2b3c4d-worker-1") == \
        "/api/v1/namespaces/quals/pods/run-preempted-1a2b3c4d-worker-1"
    assert QUALIFICATION_RUNS.path("quals", "nightly.2026-11-29", "status") == \
        "/apis/resumequal.dev/v1alpha1/namespaces/quals/qualificationruns/nightly.2026-11-29/status"
    assert JOBS.path() == "/apis/batch/v1/jobs"
