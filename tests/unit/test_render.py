"""``resumequal-operator render``: the objects a QualificationRun would create, offline."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from resumequal_operator import pytorchjob
from resumequal_operator.main import main
from resumequal_operator.render import PLACEHOLDER_KEY, PLACEHOLDER_NAME_SUFFIX, PLACEHOLDER_UID
from testing.k8s_schemas import validate_core, validate_pytorchjob
from tests.pod_security import restricted_violations

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _render(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["render", *args], input=stdin)
    return result.exit_code, result.stdout, result.stderr


def test_the_example_renders_every_leg_and_the_comparator() -> None:
    code, out, err = _render(str(EXAMPLES / "qualificationrun.yaml"))
    assert code == 0, err
    objects = list(yaml.safe_load_all(out))
    kinds = [o["kind"] for o in objects]
    # the checkpoint key; control, preempted, six negative controls, each its NetworkPolicy
    # first; then the comparator
    assert kinds == ["Secret"] + ["NetworkPolicy", "PyTorchJob"] * 8 + ["Job"]
    legs = [o["metadata"]["labels"]["resumequal.dev/leg"] for o in objects[1:-1]]
    assert legs[:4] == ["control", "control", "preempted", "preempted"]
    for obj in objects:
        assert obj["metadata"]["namespace"] == "training"
        assert obj["metadata"]["labels"]["resumequal.dev/run-uid"] == PLACEHOLDER_UID
        if obj["kind"] in ("Secret", "NetworkPolicy"):
            validate_core(obj)
            continue
        if obj["kind"] == "PyTorchJob":
            validate_pytorchjob(obj)
            pod = obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
        else:
            validate_core(obj)
            pod = obj["spec"]["template"]["spec"]
        assert restricted_violations(pod) == []
    assert "&id" not in out  # every object reads whole, without YAML aliases


def test_a_run_that_zooms_on_fail_renders_its_zoom_job_too() -> None:
    run = yaml.safe_load((EXAMPLES / "qualificationrun.yaml").read_text())
    run["spec"]["zoom"] = "onFail"
    code, out, err = _render("-", stdin=yaml.safe_dump(run))
    assert code == 0, err
    objects = list(yaml.safe_load_all(out))
    policy, zoom = objects[-2:]
    assert zoom["kind"] == "Job" and zoom["metadata"]["name"] == pytorchjob.zoom_job_name(
        run["metadata"]["name"], PLACEHOLDER_UID)
    assert policy["kind"] == "NetworkPolicy" and policy["spec"]["podSelector"] == {
        "matchLabels": {"resumequal.dev/run-uid": PLACEHOLDER_UID,
                        "app.kubernetes.io/component": "zoom"}}
    validate_core(policy)
    assert zoom["metadata"]["labels"]["app.kubernetes.io/component"] == "zoom"
    validate_core(zoom)
    pod = zoom["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    assert pod["containers"][0]["args"][:1] == ["zoom"]
    assert zoom["spec"]["backoffLimit"] == 0 and zoom["spec"]["activeDeadlineSeconds"] > 0


def test_a_stored_run_renders_with_its_own_uid_and_namespace_override(tmp_path: Path) -> None:
    run = yaml.safe_load((EXAMPLES / "qualificationrun.yaml").read_text())
    run["metadata"]["uid"] = "3f1c9a0e-5b7d-4c1e-9a55-1e2f3a4b5c6d"
    code, out, err = _render("-", "--namespace", "qa", stdin=yaml.safe_dump(run))
    assert code == 0, err
    objects = list(yaml.safe_load_all(out))
    assert {o["metadata"]["namespace"] for o in objects} == {"qa"}
    args = objects[2]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"][
        "containers"][0]["args"]
    assert args[-1].endswith("/qa/nightly-2026-11-29/3f1c9a0e-5b7d-4c1e-9a55-1e2f3a4b5c6d")


def test_the_checkpoint_key_secret_is_rendered_with_a_placeholder_never_a_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_key(*args: object) -> str:
        raise AssertionError("render drew or made a checkpoint key")

    monkeypatch.setattr("resumequal.run.signing.new_key", no_key)
    monkeypatch.setattr("resumequal_operator.runkeys.new_key", no_key)
    monkeypatch.setattr("resumequal_operator.runkeys.derive_run_key", no_key)
    code, out, err = _render(str(EXAMPLES / "qualificationrun.yaml"))
    assert code == 0, err
    secret, *jobs = yaml.safe_load_all(out)
    # Named by the API server: the pods' references show the prefix and a placeholder.
    assert "name" not in secret["metadata"]
    prefix = secret["metadata"]["generateName"]
    assert prefix == "nightly-2026-11-29-checkpoint-key-"
    name = prefix + PLACEHOLDER_NAME_SUFFIX
    assert base64.b64decode(secret["data"][pytorchjob.CHECKPOINT_KEY]).decode() \
        == PLACEHOLDER_KEY
    assert secret["immutable"] is True
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "QualificationRun"
    # The pods read the key from exactly this Secret.
    for job in jobs:
        if job["kind"] != "NetworkPolicy":
            assert {"name": name, "key": pytorchjob.CHECKPOINT_KEY} in _secret_refs(job)


def _secret_refs(value: object) -> list[object]:
    if isinstance(value, dict):
        own = [value["secretKeyRef"]] if "secretKeyRef" in value else []
        return own + [r for v in value.values() for r in _secret_refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in _secret_refs(v)]
    return []


def test_several_runs_in_one_stream(tmp_path: Path) -> None:
    text = (EXAMPLES / "qualificationrun.yaml").read_text()
    second = yaml.safe_load(text)
    second["metadata"]["name"] = "other"
    second["spec"]["controls"] = {"enabled": False}
    code, out, err = _render("-", stdin=text + "\n---\n" + yaml.safe_dump(second))
    assert code == 0, err
    runs = [o["metadata"]["labels"]["resumequal.dev/run"] for o in yaml.safe_load_all(out)]
    assert runs.count("nightly-2026-11-29") == 18 and runs.count("other") == 6


def test_a_bad_spec_exits_2_naming_the_field() -> None:
    run = yaml.safe_load((EXAMPLES / "qualificationrun.yaml").read_text())
    run["spec"]["preemption"]["step"] = 99
    code, out, err = _render("-", stdin=yaml.safe_dump(run))
    assert code == 2 and out == ""
    assert "spec.preemption" in err and "99" in err


def test_not_a_qualification_run() -> None:
    code, _, err = _render("-", stdin="apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n")
    assert code == 2
    assert "apiVersion: must be resumequal.dev/v1alpha1" in err
    assert "kind: must be QualificationRun" in err
    code, _, err = _render("-", stdin="a: [b\n")
    assert code == 2 and "not valid YAML" in err
    code, _, err = _render("-", stdin="")
    assert code == 2 and "holds no QualificationRun" in err


def test_a_field_kubectl_would_refuse_is_refused_with_its_path() -> None:
    run = yaml.safe_load((EXAMPLES / "qualificationrun.yaml").read_text())
    # The models take snake_case names too; the API server knows only the CRD's camelCase.
    run["spec"]["world"]["nproc_per_node"] = run["spec"]["world"].pop("nprocPerNode", 1)
    code, out, err = _render("-", stdin=yaml.safe_dump(run))
    assert code == 2 and out == ""
    assert ("spec.world.nproc_per_node: unknown field; the API server refuses it (fields are "
            "camelCase: nprocPerNode)") in err


@pytest.mark.parametrize(("path", "value", "message"), [
    (("spec", "tolerations"), [{"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 1,
                                "operator": "Exists", "bogus": True}],
     "spec.tolerations[0].bogus: unknown field"),
    (("spec", "timeouts", "legSeconds"), "an hour", "spec.timeouts.legSeconds: must be a number"),
    (("spec", "world", "nnodes"), True, "spec.world.nnodes: must be an integer"),
    (("spec", "resources", "limits", "cpu"), [1], "spec.resources.limits.cpu: must be an "
     "integer or a string"),
    (("specs",), {}, "specs: unknown field"),
])
def test_the_crd_schema_is_judged_before_the_models(path: tuple[str, ...], value: object,
                                                    message: str) -> None:
    run = yaml.safe_load((EXAMPLES / "qualificationrun.yaml").read_text())
    node = run
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    code, out, err = _render("-", stdin=yaml.safe_dump(run))
    assert code == 2 and out == ""
    assert message in err


def test_what_the_server_keeps_or_ignores_is_not_refused() -> None:
    run = yaml.safe_load((EXAMPLES / "qualificationrun.yaml").read_text())
    run["metadata"]["annotations"] = {"team": "ml-platform"}
    run["status"] = {"phase": "Succeeded", "anything": 1}
    run["spec"]["workload"] = {**run["spec"].get("workload", {}), "params": {"any_key": 1}}
    run["spec"]["preemption"]["graceSeconds"] = None
    code, _, err = _render("-", stdin=yaml.safe_dump(run))
    assert code == 0, err
