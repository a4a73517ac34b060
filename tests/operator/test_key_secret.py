"""A run's checkpoint key Secret is one the operator made: named by the API server, recorded
in the run's status before any pod names it. One created first under a name derived from
the run, by whoever may create Secrets in the namespace, is never used."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from resumequal.errors import ClusterError
from resumequal.qualify.plan import qualification_plan
from resumequal_operator import pytorchjob
from resumequal_operator.backend import KubernetesBackend, RunRef
from resumequal_operator.kube import PYTORCHJOBS, QUALIFICATION_RUNS, Kube
from resumequal_operator.validation import parse_run_spec, qualification_spec
from testing.cluster.testapi import RealAPI
from testing.operator.harness import (
    NAMESPACE,
    Operators,
    qr,
    run_location,
    run_manifest,
    wait_phase,
)
from tests.waiting import eventually

ATTACKER_KEY = "chosen-by-someone-else-" + "0" * 40


def _key_refs(obj: Any) -> set[str]:
    """The Secret names ``obj``'s containers read the checkpoint key from."""
    if isinstance(obj, dict):
        ref = obj.get("secretKeyRef")
        own = {ref["name"]} if isinstance(ref, dict) and ref.get(
            "key") == pytorchjob.CHECKPOINT_KEY else set()
        return own.union(*(_key_refs(v) for v in obj.values()))
    if isinstance(obj, list):
        return set().union(*(_key_refs(v) for v in obj))
    return set()


def _key_of(secret: dict[str, Any]) -> str:
    return base64.b64decode(secret["data"][pytorchjob.CHECKPOINT_KEY]).decode()


def test_a_secret_created_first_under_the_runs_name_is_never_used(
    api: RealAPI, operators: Operators, store: dict[str, str]
) -> None:
    run = api.create(QUALIFICATION_RUNS.plural, run_manifest("taken", store))
    uid = run["metadata"]["uid"]
    # Between the run's creation and the operator's first look, someone who may create
    # Secrets in the namespace (not read them) makes the Secret the run's name derives to,
    # dressed as the operator's: its labels and an owner reference to the run.
    forged = pytorchjob.checkpoint_key_secret("taken", NAMESPACE, uid, ATTACKER_KEY)
    del forged["metadata"]["generateName"]
    forged["metadata"]["name"] = pytorchjob.checkpoint_key_secret_name("taken", uid)
    api.create("secrets", forged)

    operators.start()
    wait_phase(api, "taken", "LegsRunning")
    jobs = eventually(lambda: api.list(PYTORCHJOBS.plural, NAMESPACE) or None,
                      what="the legs' PyTorchJobs")
    recorded = qr(api, "taken")["status"]["checkpointKeySecret"]
    assert recorded != forged["metadata"]["name"]
    for job in jobs:
        assert _key_refs(job) == {recorded}
    [mine] = [s for s in api.created("secrets") if s["metadata"]["name"] == recorded]
    assert _key_of(mine) != ATTACKER_KEY and len(_key_of(mine)) >= 32
    assert mine["metadata"]["generateName"] == pytorchjob.checkpoint_key_secret_prefix("taken")
    assert mine["metadata"]["ownerReferences"][0]["uid"] == uid  # deleted with the run
    # The forged one is left as it was: the operator neither reads nor deletes Secrets.
    assert api.get("secrets", NAMESPACE, forged["metadata"]["name"]) is not None


def test_a_status_write_lost_after_the_secret_leaves_no_pod_naming_that_secret(
    api: RealAPI, operators: Operators, store: dict[str, str]
) -> None:
    # The first status write (the new Secret's record) fails: as a crash between the
    # Secret's creation and its record. Nothing may name that Secret; the retry makes and
    # records another, which every pod names.
    api.inject_fault(method="PUT", kind=QUALIFICATION_RUNS.plural + ".resumequal.dev",
                     subresource="status", code=500, times=1)
    operators.start()
    run = api.create(QUALIFICATION_RUNS.plural, run_manifest("crashed", store))
    wait_phase(api, "crashed", "LegsRunning")
    jobs = eventually(lambda: (len(api.list(PYTORCHJOBS.plural, NAMESPACE)) == 2 and
                      api.list(PYTORCHJOBS.plural, NAMESPACE)) or None, what="both legs")
    recorded = qr(api, "crashed")["status"]["checkpointKeySecret"]
    secrets = [s["metadata"]["name"] for s in api.created("secrets")]
    assert len(secrets) == 2 and secrets[-1] == recorded
    for job in jobs:
        assert _key_refs(job) == {recorded}
    # The unrecorded one is the run's too: the garbage collector takes it with the run.
    for s in api.created("secrets"):
        assert s["metadata"]["ownerReferences"][0]["uid"] == run["metadata"]["uid"]


def test_the_backend_records_a_new_secret_before_any_job_names_it(
    api: RealAPI, tmp_path: Path
) -> None:
    obj = api.create(QUALIFICATION_RUNS.plural,
                     run_manifest("unit", {"uri": f"file://{tmp_path}/store"}))
    ref, spec = RunRef.of(obj), parse_run_spec(obj["spec"])
    uri = f"{tmp_path}/store/{NAMESPACE}/unit/{ref.uid}"
    qspec = qualification_spec(spec, uri)
    recorded: list[str] = []

    def backend(record: Any, key_secret: str | None = None) -> KubernetesBackend:
        return KubernetesBackend(Kube(api.api_client()), ref, spec, qspec,
                                 qualification_plan(qspec), run_location(uri, ref.uid),
                                 key_secret=key_secret, record_key_secret=record)

    def lost(name: str) -> None:
        raise ClusterError("status of quals/unit: HTTP 500", status=500)

    first = backend(lost)
    with pytest.raises(ClusterError):
        first.launch_legs(first.plan.legs)
    assert api.created(PYTORCHJOBS.plural) == []
    second = backend(recorded.append)
    second.launch_legs(second.plan.legs)
    [name] = recorded
    assert [s["metadata"]["name"] for s in api.created("secrets")][-1] == name
    assert {n for j in api.created(PYTORCHJOBS.plural) for n in _key_refs(j)} == {name}
    # A later reconcile, with the name from the status, makes none.
    third = backend(recorded.append, key_secret=name)
    third.launch_legs(third.plan.legs)
    assert third.ensure_checkpoint_key() == name
    assert len(api.created("secrets")) == 2 and recorded == [name]
