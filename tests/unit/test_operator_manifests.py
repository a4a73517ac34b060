"""The QualificationRun spec, its validation, and the PyTorchJobs and Jobs a run starts."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from resumequal.qualify.plan import LegPlan, qualification_plan
from resumequal.run.name import run_uri
from resumequal.run.signing import KEY_ENV
from resumequal.spec import MAX_NODES, QualificationSpec
from resumequal.store import GCSSettings, S3Settings, StoreSettings
from resumequal_operator import pytorchjob, trainjob
from resumequal_operator.resource import QualificationRunSpec, pin_of
from resumequal_operator.validation import RunSpecError, parse_run_spec, qualification_spec
from testing.k8s_schemas import validate_core, validate_pytorchjob
from tests.pod_security import restricted_violations

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qualificationrun.yaml"
NS, RUN, UID = "training", "nightly", "5b1f0c3e-7d2a-4e8b-9c61-0a2f3e4d5c6b"


def example_spec(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())["spec"]
    for path, value in changes.items():
        node = data
        parts = path.split("__")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return data


def problems(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(RunSpecError) as info:
        parse_run_spec(data)
    return {p.path: p.message for p in info.value.problems}


def all_legs(spec: QualificationSpec) -> list[LegPlan]:
    """Every leg a run starts: the plan's (a seed matrix is refused on the cluster)."""
    return list(qualification_plan(spec).legs)


# -- the resource ------------------------------------------------------------------------


def test_example_parses_and_maps_to_the_spec() -> None:
    cr = parse_run_spec(example_spec())
    location = run_uri(cr.store.uri, NS, RUN, UID)
    assert location == f"s3://resumequal-runs/qualifications/{NS}/{RUN}/{UID}"
    spec = qualification_spec(cr, location)
    assert spec.checkpoint.store == location
    assert spec.checkpoint.s3 is not None
    assert (spec.checkpoint.s3.endpoint_url, spec.checkpoint.s3.addressing_style) == (
        "http://minio.storage.svc:9000", "path")
    assert spec.world == cr.world and spec.preemption == cr.preemption
    assert type(cr.world) is type(spec.world)  # the same models, not copies
    assert qualification_spec(cr).checkpoint.store == cr.store.uri


def test_defaults_are_the_spec_defaults() -> None:
    cr = QualificationRunSpec.model_validate(
        {"stack": {"image": "train:1"}, "store": {"uri": "s3://bucket/p"}})
    base = QualificationSpec()
    for section in ("workload", "world", "training", "preemption", "timeouts", "ddp",
                    "comparison", "controls", "matrix"):
        assert getattr(cr, section) == getattr(base, section), section
    assert cr.retention.policy == "Retain"


@pytest.mark.parametrize(("image", "pin"), [
    ("ghcr.io/acme/train:2026-11-29", "train:2026-11-29"),
    ("train", "train"),
    ("localhost:5000/train:v1", "train:v1"),
    ("r.io/train@sha256:" + "ab" * 32, "train@sha256:abababababab"),
    ("r.io/train:v2@sha256:" + "cd" * 32, "train@sha256:cdcdcdcdcdcd"),
])
def test_pin_defaults_from_the_image(image: str, pin: str) -> None:
    assert pin_of(image) == pin


def test_store_uri_is_checked() -> None:
    assert "spec.store.uri" in problems(example_spec(store__uri="http://bucket/x"))
    assert "spec.store.uri" in problems(example_spec(store__uri="s3://Bad_Bucket/x"))
    assert "spec.store" in problems({k: v for k, v in example_spec().items() if k != "store"})
    found = problems(example_spec(store__endpointUrl="http://user:pw@minio:9000"))
    assert "pw" not in found["spec.store.endpointUrl"]


@pytest.mark.parametrize(("changes", "path", "words"), [
    ({"preemption__step": 13}, "spec.preemption.step", "after the last step"),
    ({"preemption__rank": 4}, "spec.preemption.rank", "does not exist"),
    ({"preemption__microstep": 3}, "spec.preemption.microstep", "accumulationSteps"),
    ({"timeouts__armSeconds": 500}, "spec.timeouts.armSeconds", "processGroupSeconds"),
    ({"preemption__rank": 0}, "spec.preemption.rank", "worker-0"),
    ({"preemption__rank": 1}, "spec.preemption.rank", "rendezvous"),
    ({"world__nnodes": 1, "preemption__rank": 1}, "spec.preemption.rank", "worker-0"),
    ({"checkpoint__store": "s3://other/x"}, "spec.checkpoint.store", "set by the operator"),
    ({"world__backend": "nccl"}, "spec.resources.limits", "GPU"),
    ({"world__nprocPerNode": 4, "preemption__rank": 5, "world__backend": "auto",
      "resources__limits": {"nvidia.com/gpu": 2}}, "spec.world.nprocPerNode", "2 GPUs"),
    ({"world__nnodes": 0}, "spec.world.nnodes", "greater than or equal to 1"),
    ({"world__nodes": 2}, "spec.world.nodes", "unknown field; allowed: backend"),
    ({"stack__image": ""}, "spec.stack.image", "at least 1"),
    ({"retention__policy": "Keep"}, "spec.retention.policy", "'Delete' or 'Retain'"),
    ({"resources__limits": {"cpu": "two"}}, "spec.resources.limits.cpu",
     "not a Kubernetes quantity"),
    ({"tolerations": [{"key": "a", "operator": "Maybe"}]}, "spec.tolerations.0.operator",
     "Exists"),
    ({"matrix__seeds": [1, 2]}, "spec.matrix.seeds", "one seed per QualificationRun"),
    ({"colour": "blue"}, "spec.colour", "unknown field; allowed: allowRendezvousHostKill"),
])
def test_impossible_specs_name_the_field(changes: dict[str, Any], path: str, words: str) -> None:
    found = problems(example_spec(**changes))
    assert path in found, found
    assert words in found[path]


def test_the_snake_case_spelling_is_read_too() -> None:
    snake = example_spec()
    snake["node_selector"] = snake.pop("nodeSelector")
    snake["world"]["nproc_per_node"] = snake["world"].pop("nprocPerNode")
    snake["store"]["endpoint_url"] = snake["store"].pop("endpointUrl")
    assert parse_run_spec(snake) == parse_run_spec(example_spec())
    # Problems name fields in camelCase whichever spelling was read; both at once is refused.
    snake["world"]["nproc_per_node"] = 0
    assert "spec.world.nprocPerNode" in problems(snake)
    found = problems(example_spec(world__nproc_per_node=2))
    assert found["spec.world.nproc_per_node"] == "given twice, as nprocPerNode and nproc_per_node"


def test_every_problem_is_reported_at_once() -> None:
    found = problems(example_spec(preemption__rank=0, checkpoint__store="s3://x/y",
                                  world__backend="nccl"))
    assert {"spec.preemption.rank", "spec.checkpoint.store", "spec.resources.limits"} <= set(
        found)


def test_rendezvous_host_kill_is_an_explicit_opt_in() -> None:
    data = example_spec(world__nnodes=1, preemption__rank=1, allowRendezvousHostKill=True)
    assert parse_run_spec(data).preemption.rank == 1


def test_a_cut_on_another_pod_is_accepted() -> None:
    cr = parse_run_spec(example_spec(preemption__rank=3))
    assert cr.preemption.rank == 3


def test_a_resize_cuts_on_the_pod_that_lowering_the_replicas_deletes() -> None:
    three = {**RESIZE, "world__nnodes": 3, "training__accumulationSteps": 4,
             "preemption__resize": {"toNodes": 2}}
    found = problems(example_spec(**three, preemption__rank=2))
    assert set(found) == {"spec.preemption.rank"}
    assert "worker-1" in found["spec.preemption.rank"]
    assert "deletes the last pod, worker-2" in found["spec.preemption.rank"]
    assert "(ranks 4..5)" in found["spec.preemption.rank"]
    assert parse_run_spec(example_spec(**three, preemption__rank=4)).preemption.rank == 4


def test_not_a_mapping() -> None:
    assert problems([]) == {"spec": "must be a mapping"}  # type: ignore[arg-type]


# -- names -------------------------------------------------------------------------------


def test_job_names_are_stable_unique_and_short() -> None:
    long_run = "a" * 40 + ".b" * 40
    names = set()
    for run in (RUN, long_run, "9lives", "x"):
        for leg in ("control", "preempted", "nc-model-optimizer-only", "nc-rng",
                    "seed-7-boundary-hard", "seed-8-boundary-hard", "a_b"):
            name = pytorchjob.leg_job_name(run, UID, leg)
            assert name == pytorchjob.leg_job_name(run, UID, leg)
            assert len(name) <= pytorchjob.MAX_JOB_NAME
            # The training operator names pods and services <job>-worker-<i>.
            assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name + "-worker-999"), name
            assert len(name + "-worker-999") <= 63
            # JobSet's webhook: its largest pod name, for the most nodes a spec may ask.
            jobset_pod = f"{trainjob.node_job_name(name)}-{MAX_NODES - 1}-abcde"
            assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", jobset_pod), jobset_pod
            assert len(jobset_pod) <= 63, jobset_pod
            names.add(name)
        names.add(pytorchjob.comparator_job_name(run, UID))
    assert len(names) == 4 * 8
    # The same run name recreated (a new uid) gets new jobs: no clash with dying ones.
    assert pytorchjob.leg_job_name(RUN, "other-uid", "control") != pytorchjob.leg_job_name(
        RUN, UID, "control")


def test_long_run_names_still_make_valid_labels() -> None:
    long_run = "a" * 40 + ".b" * 40
    value = pytorchjob.labels(long_run, UID, "control")[pytorchjob.RUN_LABEL]
    assert len(value) <= 63 and value != pytorchjob.label_value(long_run + "x")
    assert pytorchjob.label_value(RUN) == RUN


# -- manifests ---------------------------------------------------------------------------


# The example shrunk to worker-0 at the kill (rank 2 runs on worker-1), grown back after 8.
RESIZE = {"preemption__resize": {"toNodes": 1, "growAfterStep": 8},
          "comparison": {"mode": "tolerance", "tolerances": {
              "loss": 1e-4, "grad_norm": 1e-4, "params": 1e-4}}}

SPECS = {
    "example": {},
    "resize": RESIZE,
    "graceful-mid": {"preemption__mode": "graceful"},
    "boundary-hard": {"preemption__microstep": 0},
    "commit-cut": {"preemption__at": "checkpoint_commit", "preemption__microstep": 0,
                   "preemption__step": 8},
    "iam-aws": {"store": {"uri": "s3://acme-runs/q", "region": "eu-west-1"},
                "serviceAccountName": "rq", "tolerations": [], "nodeSelector": {}},
    "gpu": {"world__backend": "nccl", "world__nprocPerNode": 4, "preemption__rank": 5,
            "resources": {"limits": {"nvidia.com/gpu": 4, "memory": "64Gi"},
                          "requests": {"cpu": 8}}},
}


def _manifests(changes: dict[str, Any]) -> tuple[QualificationRunSpec, list[LegPlan],
                                                 list[dict[str, Any]], dict[str, Any]]:
    cr = parse_run_spec(example_spec(**changes))
    location = run_uri(cr.store.uri, NS, RUN, UID)
    legs = all_legs(qualification_spec(cr, location))
    jobs = [pytorchjob.leg_job(RUN, NS, UID, cr, leg, location) for leg in legs]
    return cr, legs, jobs, pytorchjob.comparator_job(RUN, NS, UID, cr, location,
                                                     ttl_seconds=3600)


@pytest.mark.parametrize("changes", SPECS.values(), ids=SPECS.keys())
def test_every_leg_and_the_comparator_validate(changes: dict[str, Any]) -> None:
    _, legs, jobs, comparator = _manifests(changes)
    assert {leg.role for leg in legs} >= {"reference", "main"}
    for job in jobs:
        validate_pytorchjob(job)
    validate_core(comparator)
    names = [j["metadata"]["name"] for j in jobs] + [comparator["metadata"]["name"]]
    assert len(set(names)) == len(names)
    assert all(len(n) <= 63 for n in names)


def test_the_plan_covers_the_negative_controls() -> None:
    _, legs, jobs, _ = _manifests({})
    names = {leg.name for leg in legs}
    assert {"control", "preempted", "nc-rng", "nc-pending-grads"} <= names
    assert len(jobs) == len(legs)


def test_leg_job_shape() -> None:
    cr, _, jobs, _ = _manifests({})
    by_leg = {j["metadata"]["labels"][pytorchjob.LEG_LABEL]: j for j in jobs}
    job = by_leg["nc-data-cursor"]
    spec = job["spec"]
    # nProcPerNode under elasticPolicy is deprecated (the webhook warns): spec.nprocPerNode.
    assert spec["nprocPerNode"] == "2"
    assert spec["elasticPolicy"] == {
        "rdzvBackend": "c10d", "rdzvId": job["metadata"]["name"], "minReplicas": 2,
        "maxReplicas": 2, "maxRestarts": 1,
        # torchrun's 60 s store read timeout would fail a pod that starts a minute early.
        "rdzvConf": [{"key": "join_timeout", "value": "300"},
                     {"key": "read_timeout", "value": "300"}]}
    # No backoffLimit (inert with ExitCode); None: ranks still writing are never deleted
    # when the first worker's success makes the elastic job Succeeded.
    assert spec["runPolicy"] == {"cleanPodPolicy": "None",
                                 "activeDeadlineSeconds": 1800 + 60}
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    assert set(spec["pytorchReplicaSpecs"]) == {"Worker"}
    assert (worker["replicas"], worker["restartPolicy"]) == (2, "ExitCode")
    pod = worker["template"]["spec"]
    [c] = pod["containers"]
    assert c["name"] == "pytorch" and c["image"] == cr.stack.image
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert [*c["command"], *c["args"]] == [
        "resumequal", "launch", "--mode", "hard", "--launcher", "torchrun", "--",
        "-m", "resumequal", "leg", "--leg", "nc-data-cursor", "--run-dir",
        f"s3://resumequal-runs/qualifications/{NS}/{RUN}/{UID}", "--omit", "data_cursor"]
    assert c["ports"] == [{"name": "pytorchjob-port", "containerPort": 29400,
                           "protocol": "TCP"}]
    assert c["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"},
                              "limits": {"cpu": "2", "memory": "4Gi"}}
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["OMP_NUM_THREADS"]["value"] == "1"
    assert env["AWS_ENDPOINT_URL_S3"]["value"] == "http://minio.storage.svc:9000"
    assert env["AWS_REGION"]["value"] == "us-east-1"
    assert "AWS_ENDPOINT_URL" not in env  # STS (web identity) must keep its own endpoint
    # A worker reads the run location before it has a spec: path-style MinIO needs this.
    assert env["RESUMEQUAL_S3_ADDRESSING_STYLE"]["value"] == "path"
    assert "RESUMEQUAL_S3_SIGN_PAYLOADS" not in env  # unsigned bodies, the default
    assert pod["nodeSelector"] == {"kubernetes.io/arch": "amd64"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Equal",
                                   "value": "training", "effect": "NoSchedule"}]
    assert pod["imagePullSecrets"] == [{"name": "ghcr-pull"}]
    assert pod["serviceAccountName"] == "resumequal-worker"
    # The training operator overwrites a template restartPolicy (with a Warning event).
    assert "restartPolicy" not in pod
    # The kubelet enforces a pod's deadline; the job's is checked only on events.
    assert pod["activeDeadlineSeconds"] == 1800 + 60
    assert env["POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory",
                                                            "sizeLimit": "2Gi"}}]
    assert "--omit" not in by_leg["preempted"]["spec"]["pytorchReplicaSpecs"]["Worker"][
        "template"]["spec"]["containers"][0]["args"]


def test_a_resize_runs_every_leg_elastic_from_to_nodes_to_nnodes() -> None:
    _, legs, jobs, _ = _manifests(RESIZE)
    assert {leg.role for leg in legs} == {"reference", "main", "negative_control"}
    for job in jobs:
        spec = job["spec"]
        elastic = spec["elasticPolicy"]
        # PET_NNODES=1:2; the reference leg too: it is never shrunk, but runs the same launch.
        assert (elastic["minReplicas"], elastic["maxReplicas"]) == (1, 2)
        assert spec["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
        # The dead node leaves the rendezvous in seconds; each smaller one closes after 1 s.
        assert elastic["rdzvConf"] == [
            {"key": "join_timeout", "value": "300"}, {"key": "read_timeout", "value": "300"},
            {"key": "keep_alive_interval", "value": "1"},
            {"key": "keep_alive_max_attempt", "value": "5"},
            {"key": "last_call_timeout", "value": "1"}]
        [c] = spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # the grown pod rejoins


def test_labels_and_owner_references() -> None:
    _, _, jobs, comparator = _manifests({})
    for obj in [*jobs, comparator]:
        meta = obj["metadata"]
        assert meta["namespace"] == NS
        assert meta["labels"][pytorchjob.MANAGED_BY] == "resumequal-operator"
        assert meta["labels"]["resumequal.dev/run"] == RUN
        assert meta["ownerReferences"] == [{
            "apiVersion": "resumequal.dev/v1alpha1", "kind": "QualificationRun",
            "name": RUN, "uid": UID, "controller": True, "blockOwnerDeletion": True}]
    for job in jobs:
        leg = job["metadata"]["labels"]["resumequal.dev/leg"]
        template = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
        assert template["metadata"]["labels"]["resumequal.dev/leg"] == leg
    assert "resumequal.dev/leg" not in comparator["metadata"]["labels"]
    assert comparator["metadata"]["labels"][pytorchjob.COMPONENT] == "comparator"


def test_comparator_job_shape() -> None:
    _, _, _, job = _manifests(SPECS["gpu"])
    spec = job["spec"]
    assert (spec["backoffLimit"], spec["ttlSecondsAfterFinished"]) == (0, 3600)
    assert spec["activeDeadlineSeconds"] >= 900
    [c] = spec["template"]["spec"]["containers"]
    assert [*c["command"], *c["args"]] == [
        "resumequal", "compare", f"s3://resumequal-runs/qualifications/{NS}/{RUN}/{UID}",
        "--write", "--pin", "nightly-2026-11-29", "--namespace", NS, "--name", RUN]
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    # Its own container, not the legs' (which ask for 4 GPUs here): a modest CPU pod.
    assert c["name"] == "compare"
    assert c["resources"] == {"requests": {"cpu": 1, "memory": "2Gi"}}


def test_the_comparator_takes_resources_of_its_own() -> None:
    own = {"requests": {"cpu": "4", "memory": "32Gi"}, "limits": {"memory": "48Gi"}}
    _, _, jobs, job = _manifests({**SPECS["gpu"], "comparator": {"resources": own}})
    [c] = job["spec"]["template"]["spec"]["containers"]
    assert c["resources"] == own
    validate_core(job)
    for leg in jobs:
        [worker] = leg["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
        assert worker["resources"]["limits"] == {"nvidia.com/gpu": 4, "memory": "64Gi"}


def test_the_comparator_may_ask_for_nothing() -> None:
    _, _, _, job = _manifests({"comparator": {"resources": {"requests": {}}}})
    [c] = job["spec"]["template"]["spec"]["containers"]
    assert "resources" not in c


def test_the_zoom_job_runs_on_the_legs_resources_in_a_container_of_its_own() -> None:
    cr = parse_run_spec(example_spec(**SPECS["gpu"]))
    uri = run_uri(cr.store.uri, NS, RUN, UID)
    job = pytorchjob.zoom_job(RUN, NS, UID, cr, uri)
    [c] = job["spec"]["template"]["spec"]["containers"]
    # The replay runs on the device the legs ran on.
    assert c["name"] == "zoom"
    assert c["resources"] == {"requests": {"cpu": 8},
                              "limits": {"nvidia.com/gpu": 4, "memory": "64Gi"}}
    validate_core(job)


def test_credentials_only_by_secret_reference() -> None:
    _, _, jobs, comparator = _manifests({})
    for obj in [*jobs, comparator]:
        for c in _containers(obj):
            env = {e["name"]: e for e in c["env"]}
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
                assert "value" not in env[key]
                assert env[key]["valueFrom"] == {"secretKeyRef": {
                    "name": "resumequal-s3", "key": key}}
            assert env["AWS_SESSION_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
            inlined = [e["name"] for e in c["env"]
                       if "value" in e and re.search("KEY|SECRET|TOKEN|PASSWORD", e["name"])]
            assert inlined == []
        pod = (obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
               if obj["kind"] == "PyTorchJob" else obj["spec"]["template"]["spec"])
        assert pod["automountServiceAccountToken"] is False


def test_the_checkpoint_key_is_a_secret_of_the_run_referenced_by_every_pod() -> None:
    secret = pytorchjob.checkpoint_key_secret(RUN, NS, UID, "k" * 64)
    validate_core(secret)
    # Named by the API server: no name anyone could take first.
    assert "name" not in secret["metadata"] and secret["metadata"]["namespace"] == NS
    prefix = secret["metadata"]["generateName"]
    assert prefix.startswith(RUN) and len(prefix) <= pytorchjob.MAX_GENERATE_NAME
    assert len(pytorchjob.checkpoint_key_secret_prefix("r" * 253)) <= 58
    assert secret["metadata"]["ownerReferences"] == [pytorchjob.owner_reference(RUN, UID)]
    assert secret["metadata"]["labels"][pytorchjob.UID_LABEL] == UID
    assert base64.b64decode(secret["data"][pytorchjob.CHECKPOINT_KEY]) == b"k" * 64
    name = prefix + "x7k2q"  # as generated
    spec = parse_run_spec(example_spec())
    uri = run_uri(spec.store.uri, NS, RUN, UID)
    jobs = [pytorchjob.leg_job(RUN, NS, UID, spec, leg, uri, key_secret=name)
            for leg in all_legs(qualification_spec(spec, uri))]
    comparator = pytorchjob.comparator_job(RUN, NS, UID, spec, uri, key_secret=name)
    for obj in [*jobs, comparator]:
        for c in _containers(obj):
            env = {e["name"]: e for e in c["env"]}
            assert env[KEY_ENV] == {"name": KEY_ENV, "valueFrom": {"secretKeyRef": {
                "name": name, "key": pytorchjob.CHECKPOINT_KEY}}}
        assert "k" * 64 not in json.dumps(obj)
    # A run started before names were generated keeps naming its Secret as it did.
    legacy = pytorchjob.checkpoint_key_secret_name(RUN, UID)
    assert legacy != pytorchjob.checkpoint_key_secret_name(RUN, "another-uid")
    [c] = _containers(pytorchjob.comparator_job(RUN, NS, UID, spec, uri))
    assert {e["name"]: e for e in c["env"]}[KEY_ENV]["valueFrom"]["secretKeyRef"][
        "name"] == legacy


def test_without_a_secret_the_pods_use_their_own_aws_chain() -> None:
    _, _, jobs, comparator = _manifests(SPECS["iam-aws"])
    for obj in [*jobs, comparator]:
        for c in _containers(obj):
            names = {e["name"] for e in c["env"]}
            assert not names & {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                "AWS_ENDPOINT_URL_S3", "RESUMEQUAL_S3_ADDRESSING_STYLE"}
            assert "AWS_REGION" in names


def test_a_store_that_wants_signed_payloads_says_so_to_every_pod() -> None:
    cr, _, jobs, comparator = _manifests({"store": {
        "uri": "s3://acme-runs/q", "endpointUrl": "http://rgw.storage.svc:7480",
        "signPayloads": True}})
    assert cr.store.settings() == S3Settings(endpoint_url="http://rgw.storage.svc:7480",
                                             sign_payloads=True)
    for obj in [*jobs, comparator]:
        for c in _containers(obj):
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert env["RESUMEQUAL_S3_SIGN_PAYLOADS"] == "1"


@pytest.mark.parametrize(("store", "settings", "env"), [
    ({"uri": "s3://acme-runs/q", "s3": {"endpointUrl": "http://rgw:7480", "region": "eu-1"}},
     S3Settings(endpoint_url="http://rgw:7480", region="eu-1"),
     {"AWS_ENDPOINT_URL_S3": "http://rgw:7480", "AWS_REGION": "eu-1"}),
    ({"uri": "gs://acme-runs/q", "gcs": {"endpointUrl": "http://fake-gcs:4443"}},
     GCSSettings(endpoint_url="http://fake-gcs:4443"),
     {"STORAGE_EMULATOR_HOST": "http://fake-gcs:4443"}),
])
def test_a_store_section_reaches_the_legs_spec_and_every_pod(
    store: dict[str, Any], settings: StoreSettings, env: dict[str, str],
) -> None:
    """The store's own settings model, embedded in store: the legs' spec carries it in the
    checkpoint section of its scheme, and the pods its environment."""
    cr, _, jobs, comparator = _manifests({"store": store})
    assert cr.store.settings() == settings
    assert qualification_spec(cr).checkpoint.store_settings == settings
    for obj in [*jobs, comparator]:
        for c in _containers(obj):
            got = {e["name"]: e.get("value") for e in c["env"]}
            assert env.items() <= got.items()


def test_a_store_section_of_another_scheme_or_beside_the_flat_fields_is_refused() -> None:
    found = problems(example_spec(store={"uri": "s3://acme-runs/q", "gcs": {}}))
    assert "gs:// stores" in found["spec.store"]
    found = problems(example_spec(store={"uri": "s3://acme-runs/q", "s3": {},
                                         "endpointUrl": "http://rgw:7480"}))
    assert "keep store.s3" in found["spec.store"]


def test_graceful_pods_get_the_grace_period() -> None:
    _, _, jobs, _ = _manifests({"preemption__mode": "graceful",
                                "preemption__graceSeconds": 42.5})
    for job in jobs:
        pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == 43


def test_the_pytorchjob_validator_can_fail() -> None:
    _, _, jobs, comparator = _manifests({})
    bad = json.loads(json.dumps(jobs[0]))
    bad["spec"]["elasticPolicy"]["minReplicas"] = "two"
    with pytest.raises(AssertionError, match=r"\.spec\.elasticPolicy\.minReplicas"):
        validate_pytorchjob(bad)
    bad = json.loads(json.dumps(jobs[0]))
    bad["spec"]["elasticPolicy"]["nProcsPerNode"] = 2
    with pytest.raises(AssertionError, match=r"\.spec\.elasticPolicy\.nProcsPerNode"):
        validate_pytorchjob(bad)
    bad = json.loads(json.dumps(jobs[0]))
    bad["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "env"].append({"name": "X", "valueFrom": {"secretKeyRef": {"key": 1}}})
    with pytest.raises(AssertionError, match=r"containers\[0\]\.env"):
        validate_pytorchjob(bad)
    bad = json.loads(json.dumps(jobs[0]))
    bad["metadata"]["name"] = "Not_A_Name"
    with pytest.raises(AssertionError, match=r"\.metadata\.name"):
        validate_pytorchjob(bad)
    bad = json.loads(json.dumps(comparator))
    bad["spec"]["backoffLimit"] = "none"
    with pytest.raises(AssertionError, match=r"\.spec\.backoffLimit"):
        validate_core(bad)
    bad = json.loads(json.dumps(comparator))
    bad["metadata"]["labels"]["resumequal.dev/run"] = "x" * 64
    with pytest.raises(AssertionError, match=r"labels"):
        validate_core(bad)


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] == "PyTorchJob":
        return [c for r in obj["spec"]["pytorchReplicaSpecs"].values()
                for c in r["template"]["spec"]["containers"]]
    containers: list[dict[str, Any]] = obj["spec"]["template"]["spec"]["containers"]
    return containers


def test_core_validator_knows_leases_and_events() -> None:
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "resumequal-operator", "namespace": "ops"},
             "spec": {"holderIdentity": "op-0", "leaseDurationSeconds": 15,
                      "renewTime": "2026-11-29T21:50:00.000000Z"}}
    validate_core(lease)
    for api in ("v1", "events.k8s.io/v1"):
        event: dict[str, Any] = {"apiVersion": api, "kind": "Event",
                                 "metadata": {"name": "nightly.1879f0a2", "namespace": NS},
                                 "reason": "Preempted", "type": "Normal"}
        if api == "v1":
            event["involvedObject"] = {"kind": "QualificationRun", "name": RUN}
        else:
            event["eventTime"] = "2026-11-29T21:50:00.000000Z"
        validate_core(event)
    lease["spec"]["leaseDurationSeconds"] = "15s"
    with pytest.raises(AssertionError, match=r"\.spec\.leaseDurationSeconds"):
        validate_core(lease)
    with pytest.raises(AssertionError, match="no schema"):
        validate_core({"apiVersion": "example.com/v1", "kind": "Widget",
                       "metadata": {"name": "w"}})


def test_torchrun_hands_the_leg_arguments_to_resumequal() -> None:
    # torchrun's parser sees the module's arguments too: an option that abbreviates one of
    # its own (``--run`` for ``--run-path``) would make every pod exit with a usage error.
    from torch.distributed.run import get_args_parser

    _, _, jobs, _ = _manifests({})
    for job in jobs:
        [c] = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
        parsed = get_args_parser().parse_args(c["args"])
        assert parsed.module and parsed.training_script == "resumequal"
        assert parsed.training_script_args == c["args"][2:]


def _pods(changes: dict[str, Any]) -> list[dict[str, Any]]:
    _, _, jobs, comparator = _manifests(changes)
    pods = [j["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"] for j in jobs]
    return [*pods, comparator["spec"]["template"]["spec"]]


@pytest.mark.parametrize("changes", SPECS.values(), ids=SPECS.keys())
def test_every_pod_meets_the_restricted_pod_security_profile(changes: dict[str, Any]) -> None:
    for pod in _pods(changes):
        assert restricted_violations(pod) == []


def test_the_restricted_check_can_fail() -> None:
    [pod, *_] = _pods({})
    loose = {**pod, "securityContext": {}, "hostNetwork": True,
             "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
             "containers": [{**pod["containers"][0], "securityContext": {
                 "capabilities": {"add": ["SYS_ADMIN"]}}}]}
    found = restricted_violations(loose)
    for words in ("host namespaces", "restricted volume types", "allowPrivilegeEscalation",
                  "must drop ALL", "adds", "runAsNonRoot", "seccompProfile"):
        assert any(words in v for v in found), words


def test_security_contexts_are_merged_over_the_restricted_defaults() -> None:
    pods = _pods({"security": {"podSecurityContext": {"runAsUser": 1000, "fsGroup": 2000},
                               "securityContext": {"readOnlyRootFilesystem": True},
                               "shmSizeLimit": "8Gi"}})
    for pod in pods:
        assert pod["securityContext"]["runAsUser"] == 1000
        assert pod["securityContext"]["fsGroup"] == 2000
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        c = pod["containers"][0]["securityContext"]
        assert c["readOnlyRootFilesystem"] is True
        assert c["capabilities"] == {"drop": ["ALL"]}
        assert restricted_violations(pod) == []
    assert pods[0]["volumes"][0]["emptyDir"]["sizeLimit"] == "8Gi"
    # An override that leaves the profile is the user's choice, and is visible as such.
    [root, *_] = _pods({"security": {"podSecurityContext": {"runAsNonRoot": False,
                                                            "runAsUser": 0}}})
    assert "runAsUser=0 (pod)" in restricted_violations(root)
