"""TrainJob legs (``spec.backend: trainjob``): the manifests (validated against the
kubeflow-trainer-api models and Kubernetes' schemas) and what the backend refuses. The pods
the real Trainer and JobSet make of them are checked in the cluster suite (tests/cluster)."""

from __future__ import annotations

import re
from typing import Any

import yaml
from click.testing import CliRunner

from resumequal.qualify.plan import qualification_plan
from resumequal.run.name import run_uri
from resumequal_operator import pytorchjob, trainjob
from resumequal_operator.legjobs import PyTorchJobLegs, TrainerSettings, TrainJobLegs, leg_jobs
from resumequal_operator.main import main
from resumequal_operator.validation import parse_run_spec, qualification_spec
from testing.k8s_schemas import RESERVED_ENV, trainer_problem, validate_trainer
from tests.trainer_refusals import refused
from tests.trainer_refusals import trainjob as plain_trainjob
from tests.unit.test_operator_manifests import EXAMPLE, NS, RUN, UID, example_spec, problems

Obj = dict[str, Any]


def _trainjobs(**changes: Any) -> list[Obj]:
    data = example_spec(backend="trainjob", **changes)
    data["stack"].pop("imagePullPolicy", None)
    spec = parse_run_spec(data)
    uri = run_uri(spec.store.uri, NS, RUN, UID)
    plan = qualification_plan(qualification_spec(spec, uri))
    return [trainjob.leg_trainjob(RUN, NS, UID, spec, leg, uri) for leg in plan.legs]


def _env(obj: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in obj["spec"]["trainer"]["env"]}


def test_every_leg_is_a_trainjob_on_the_runtime_that_validates() -> None:
    jobs = _trainjobs()
    assert [j["metadata"]["labels"][pytorchjob.LEG_LABEL] for j in jobs][:2] == [
        "control", "preempted"]
    for tj in jobs:
        validate_trainer(tj)
        spec = tj["spec"]
        assert spec["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org",
                                      "kind": "ClusterTrainingRuntime", "name": "resumequal-leg"}
        trainer = spec["trainer"]
        assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 2)
        # The launcher, in the leg's kill mode (pending_grads' control leg is graceful).
        assert trainer["command"][:3] == ["resumequal", "launch", "--mode"]
        assert trainer["command"][3:] in (["hard", "--launcher", "torchrun", "--"],
                                          ["graceful", "--launcher", "torchrun", "--"])
        assert trainer["args"][:3] == ["-m", "resumequal", "leg"]
        assert spec["activeDeadlineSeconds"] == 1860  # legSeconds + 60
        assert tj["metadata"]["ownerReferences"][0]["kind"] == "QualificationRun"
        name = tj["metadata"]["name"]
        env = _env(tj)
        assert env["PET_RDZV_BACKEND"] == "c10d" and env["PET_RDZV_ID"] == name
        assert env["PET_RDZV_ENDPOINT"] == f"{name}-node-0-0.{name}:29400"
        assert env["PET_RDZV_CONF"] == "join_timeout=300,read_timeout=300"
        # What the torch plugin injects is left to it (a TrainJob setting one is refused).
        assert not set(env) & set(RESERVED_ENV)
        # The host names of node pods (<trainjob>-node-0-<index>) are DNS labels.
        assert len(trainjob.node_host(name, 99).split(".")[0]) <= 63


def test_the_webhook_check_refuses_what_the_real_trainer_refuses() -> None:
    # The same objects meet the real webhooks in tests/cluster.
    for what, (obj, words) in refused("quals").items():
        problem = trainer_problem(obj)
        assert problem is not None and re.search(words, problem), (what, problem)
    assert trainer_problem(trainjob.leg_runtime()) is None
    assert trainer_problem(plain_trainjob("fine", "quals")) is None


def test_what_a_trainjob_cannot_do_is_refused_naming_the_field() -> None:
    found = problems(example_spec(backend="trainjob", preemption={
        "step": 6, "rank": 2, "target": "pod", "resize": {"toNodes": 1}},
        timeouts={"restartSeconds": 10}))
    assert "a TrainJob has a fixed number of nodes" in found["spec.preemption.resize"]
    assert "cannot set the pull policy" in found["spec.stack.imagePullPolicy"]
    assert "before it replaces a TrainJob's deleted pod" in found["spec.timeouts.restartSeconds"]
    # The same spec on PyTorchJobs has none of these problems.
    ok = problems(example_spec(backend="pytorchjob", preemption={
        "step": 6, "rank": 2, "target": "pod", "resize": {"toNodes": 1}},
        timeouts={"restartSeconds": 10}))
    assert not {"spec.stack.imagePullPolicy", "spec.timeouts.restartSeconds"} & set(ok)
    assert "fixed number of nodes" not in ok.get("spec.preemption.resize", "")


def test_render_prints_trainjobs_for_the_trainjob_backend() -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["stack"].pop("imagePullPolicy")
    text = yaml.safe_dump(doc)
    result = CliRunner().invoke(main, ["render", "--default-backend", "trainjob",
                                       "--trainjob-runtime", "legs",
                                       "--trainjob-runtime-kind", "TrainingRuntime", "-"],
                                input=text)
    assert result.exit_code == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    assert [o["kind"] for o in objects] == (["Secret"] + ["NetworkPolicy", "TrainJob"] * 8
                                            + ["Job"])
    for tj in objects[2:-1:2]:
        validate_trainer(tj)
        assert tj["spec"]["runtimeRef"]["name"] == "legs"
        assert tj["spec"]["runtimeRef"]["kind"] == "TrainingRuntime"
    # A run that names its backend keeps it, whatever the default.
    doc["spec"]["backend"] = "pytorchjob"
    result = CliRunner().invoke(main, ["render", "--default-backend", "trainjob", "-"],
                                input=yaml.safe_dump(doc))
    assert result.exit_code == 0, result.stderr
    assert {o["kind"] for o in yaml.safe_load_all(result.stdout)} == {
        "Secret", "NetworkPolicy", "PyTorchJob", "Job"}


def test_leg_pods_and_their_node_index_by_backend() -> None:
    legs = TrainJobLegs(TrainerSettings("legs", "TrainingRuntime"))
    assert leg_jobs("trainjob", TrainerSettings()).kind.plural == "trainjobs"
    assert leg_jobs("pytorchjob").kind.plural == "pytorchjobs"
    pod = {"metadata": {
        "name": "tj-node-0-1-x7k2p",
        "labels": {trainjob.JOBSET_NAME: "tj", trainjob.COMPLETION_INDEX: "1"},
        "annotations": {trainjob.COMPLETION_INDEX: "1"},
        "ownerReferences": [{"kind": "Job", "name": "tj-node-0", "controller": True}]}}
    assert legs.job_of(pod) == "tj" and legs.node_index(pod) == "1"
    # A pod of another Job of that JobSet, or of another owner, is no leg's.
    other = {"metadata": {**pod["metadata"], "ownerReferences": [
        {"kind": "Job", "name": "tj-initializer-0", "controller": True}]}}
    assert legs.job_of(other) is None
    ptj = PyTorchJobLegs()
    worker = {"metadata": {"name": "leg-worker-0", "labels": {}, "ownerReferences": [
        {"kind": "PyTorchJob", "name": "leg", "controller": True}]}}
    assert ptj.job_of(worker) == "leg" and ptj.node_index(worker) == "0"
    assert ptj.job_of(pod) is None
