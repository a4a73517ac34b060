"""The node agent's pure parts: a container's environment, a pod's files and volumes, the
images it knows. The agent itself runs in the cluster suite (tests/cluster/)."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest

from testing.cluster.node import envvars, sandbox, volumes
from testing.cluster.node.images import Image, Images, dockerfile_image, load

Obj = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]


def _pod(**spec: Any) -> Obj:
    return {"metadata": {"name": "job-worker-1", "namespace": "quals", "uid": "u-1",
                         "labels": {"app": "x"}, "annotations": {"a": "b"}},
            "spec": {"nodeName": "n0", "serviceAccountName": "sa",
                     "containers": [{"name": "c"}], **spec},
            "status": {"podIP": "10.244.0.7", "hostIP": "10.244.0.1"}}


def _objects(**by_name: Obj) -> envvars.Lookup:
    def lookup(kind: str, namespace: str, name: str) -> Obj | None:
        return by_name.get(f"{kind}/{namespace}/{name}")
    return lookup


def test_expansion_follows_the_kubelet() -> None:
    defined = {"A": "1", "B": "two"}
    assert envvars.expand("$(A)-$(B)", defined) == "1-two"
    assert envvars.expand("$$(A)", defined) == "$(A)"  # escaped
    assert envvars.expand("$(C)/$(A", defined) == "$(C)/$(A"  # unknown, unclosed: as written
    assert envvars.expand("cost: $5", defined) == "cost: $5"


def test_the_api_service_variables_name_the_servers_own_address() -> None:
    services = [
        {"metadata": {"name": "kubernetes", "namespace": "default"},
         "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443}]}},
        {"metadata": {"name": "my-db", "namespace": "quals"},
         "spec": {"clusterIP": "10.96.3.4", "ports": [{"name": "sql", "port": 5432}]}},
        {"metadata": {"name": "headless", "namespace": "quals"}, "spec": {"clusterIP": "None"}},
        {"metadata": {"name": "elsewhere", "namespace": "other"},
         "spec": {"clusterIP": "10.96.9.9", "ports": [{"port": 1}]}},
    ]
    env = envvars.service_variables(services, "10.244.0.1", 6443, "quals")
    assert env["KUBERNETES_SERVICE_HOST"] == "10.244.0.1"
    assert env["KUBERNETES_SERVICE_PORT"] == "6443"
    assert env["KUBERNETES_PORT_6443_TCP_ADDR"] == "10.244.0.1"
    assert env["MY_DB_SERVICE_HOST"] == "10.96.3.4" and env["MY_DB_SERVICE_PORT_SQL"] == "5432"
    assert env["MY_DB_PORT"] == "tcp://10.96.3.4:5432"
    assert not any(k.startswith(("HEADLESS_", "ELSEWHERE_")) for k in env)


def test_container_env_resolves_every_source_in_order() -> None:
    secret = {"data": {"password": base64.b64encode(b"s3cret").decode(),
                       "BINARY": base64.b64encode(b"\xff\xfe").decode()}}
    lookup = _objects(**{"Secret/quals/creds": secret,
                         "ConfigMap/quals/settings": {"data": {"MODE": "fast", "N": "3"}}})
    container = {
        "name": "c", "resources": {"limits": {"memory": "1Gi"}, "requests": {"cpu": "500m"}},
        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"},
                    {"secretRef": {"name": "creds"}}],
        "env": [
            {"name": "CFG_MODE", "value": "override-$(CFG_N)"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "NONE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['z']"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {
                "resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "CPU_M", "valueFrom": {"resourceFieldRef": {
                "resource": "requests.cpu", "divisor": "1m"}}},
            {"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k",
                                                           "optional": True}}},
        ]}
    env = envvars.container_env(_pod(), container, services={"KUBERNETES_SERVICE_HOST": "h"},
                                lookup=lookup, node_allocatable={"cpu": "16"})
    assert env["CFG_MODE"] == "override-3" and env["CFG_N"] == "3"
    assert env["password"] == "s3cret" and "BINARY" not in env
    assert env["POD"] == "job-worker-1" and env["APP"] == "x" and env["NONE"] == ""
    assert env["IP"] == "10.244.0.7" and env["MEM_MI"] == "1024" and env["CPU_M"] == "500"
    assert env["CPU_LIMIT"] == "16"  # no limit: the node's allocatable
    assert env["PW"] == "s3cret" and "OPT" not in env
    assert env["KUBERNETES_SERVICE_HOST"] == "h"


def test_service_links_off_keeps_only_the_api_server() -> None:
    env = envvars.container_env(_pod(enableServiceLinks=False), {"name": "c"},
                                services={"KUBERNETES_SERVICE_HOST": "h", "DB_SERVICE_HOST": "d"},
                                lookup=_objects(), node_allocatable={})
    assert env == {"KUBERNETES_SERVICE_HOST": "h"}


@pytest.mark.parametrize(("env", "message"), [
    ({"name": "X", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k"}}},
     'secret "gone" not found'),
    ({"name": "X", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "nope"}}},
     "couldn't find key nope in ConfigMap quals/settings"),
    ({"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}},
     "unsupported fieldPath: spec.bogus"),
])
def test_a_container_that_cannot_be_configured_says_why(env: Obj, message: str) -> None:
    lookup = _objects(**{"ConfigMap/quals/settings": {"data": {"MODE": "fast"}}})
    with pytest.raises(envvars.ConfigError, match=message):
        envvars.container_env(_pod(), {"name": "c", "env": [env]}, services={}, lookup=lookup,
                              node_allocatable={})


def test_hosts_and_resolver_files_are_the_kubelets() -> None:
    pod = _pod(hostname="tj-node-0-1", subdomain="tj",
               hostAliases=[{"ip": "10.0.0.9", "hostnames": ["db", "db.local"]}])
    hosts = sandbox.hosts_file(pod, "10.244.0.7")
    assert hosts.startswith("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n")
    assert "10.244.0.7\ttj-node-0-1.tj.quals.svc.cluster.local\ttj-node-0-1\n" in hosts
    assert hosts.endswith("# Entries added by HostAliases.\n10.0.0.9\tdb\tdb.local\n")
    assert sandbox.hosts_file(_pod(), "10.244.0.8").endswith("10.244.0.8\tjob-worker-1\n")
    assert sandbox.resolv_conf(_pod(), "10.244.0.1") == (
        "search quals.svc.cluster.local svc.cluster.local cluster.local\n"
        "nameserver 10.244.0.1\noptions ndots:5\n")
    assert sandbox.resolv_conf(_pod(dnsPolicy="None", dnsConfig={
        "nameservers": ["1.1.1.1"], "options": [{"name": "ndots", "value": "2"}]}),
        "10.244.0.1") == "nameserver 1.1.1.1\noptions ndots:2\n"
    assert sandbox.host_and_domain(_pod(hostname="x" * 70 + "-"))[0] == "x" * 63


def _volumes(tmp_path: Path, pod: Obj, objects: dict[str, Obj]) -> volumes.PodVolumes:
    tokens: list[tuple[str, list[str], int]] = []

    def token(namespace: str, account: str, audiences: list[str], expiry: int, pod: Obj
              ) -> tuple[str, float]:
        tokens.append((account, audiences, expiry))
        return f"token-{len(tokens)}", 4e9

    pv = volumes.PodVolumes(pod, tmp_path, _objects(**objects), token, {"cpu": "8"})
    pv.tokens_asked = tokens  # type: ignore[attr-defined]
    return pv


def test_secret_volumes_are_written_atomically_with_modes_and_the_fs_group(
    tmp_path: Path
) -> None:
    pod = _pod(securityContext={"fsGroup": 4242}, volumes=[
        {"name": "key", "secret": {"secretName": "k", "defaultMode": 0o400,
                                   "items": [{"key": "key", "path": "sub/key"}]}}])
    secret = {"data": {"key": base64.b64encode(b"v1").decode(),
                       "other": base64.b64encode(b"x").decode()}}
    pv = _volumes(tmp_path, pod, {"Secret/quals/k": secret})
    pv.sync()
    folder = tmp_path / "volumes/kubernetes.io~secret/key"
    target = folder / "sub/key"
    assert target.read_bytes() == b"v1" and not (folder / "other").exists()
    assert os.readlink(folder / "sub") == "..data/sub"
    info = (folder / os.readlink(folder / "..data") / "sub/key").stat()
    assert info.st_mode & 0o777 == 0o440 and info.st_gid == 4242  # defaultMode | 0440
    first = os.readlink(folder / "..data")
    pv.sync()  # nothing changed: the same payload stays
    assert os.readlink(folder / "..data") == first
    secret["data"]["key"] = base64.b64encode(b"v2").decode()
    pv.sync()
    assert target.read_bytes() == b"v2" and os.readlink(folder / "..data") != first
    assert [p.name for p in folder.iterdir() if p.name.startswith("..2")] == [
        os.readlink(folder / "..data")]  # the old payload is gone


def test_a_missing_secret_fails_the_mount_unless_optional(tmp_path: Path) -> None:
    pod = _pod(volumes=[{"name": "v", "secret": {"secretName": "gone"}}])
    with pytest.raises(volumes.MountError, match='secret "gone" not found'):
        _volumes(tmp_path, pod, {}).sync()
    pod = _pod(volumes=[{"name": "v", "secret": {"secretName": "gone", "optional": True}}])
    _volumes(tmp_path, pod, {}).sync()
    pod = _pod(volumes=[{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}])
    with pytest.raises(volumes.MountError, match="persistentVolumeClaim volumes are not"):
        _volumes(tmp_path, pod, {}).sync()


def test_the_service_account_projection_holds_a_bound_token_the_ca_and_the_namespace(
    tmp_path: Path
) -> None:
    pod = _pod(volumes=[{"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt",
                                                              "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
            "fieldPath": "metadata.namespace"}}]}}]}}])
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
    pv = _volumes(tmp_path, pod, {"ConfigMap/quals/kube-root-ca.crt": {"data": {
        "ca.crt": "PEM"}}})
    pv.sync()
    folder = tmp_path / "volumes/kubernetes.io~projected/kube-api-access"
    assert (folder / "token").read_text() == "token-1"
    assert (folder / "ca.crt").read_text() == "PEM"
    assert (folder / "namespace").read_text() == "quals"
    assert pv.tokens_asked == [("sa", [], 3607)]  # type: ignore[attr-defined]
    pv.sync()  # a token not near its expiry is kept
    assert len(pv.tokens_asked) == 1  # type: ignore[attr-defined]
    (mount,) = pv.mounts(pod["spec"]["containers"][0])
    assert mount.read_only and mount.source == str(folder)


def test_memory_empty_dirs_are_tmpfs_mounts_of_their_size(tmp_path: Path) -> None:
    pod = _pod(volumes=[{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                        {"name": "scratch", "emptyDir": {}}])
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "dshm", "mountPath": "/dev/shm"}, {"name": "scratch", "mountPath": "/s"}]
    pv = _volumes(tmp_path, pod, {})
    pv.sync()
    shm, scratch = pv.mounts(pod["spec"]["containers"][0])
    assert shm.tmpfs_size == 2**30 and shm.target == "/dev/shm"
    assert Path(scratch.source).stat().st_mode & 0o777 == 0o777


def test_images_give_the_cri_argv_and_stand_in_programs() -> None:
    manager = Image(("/manager",), ("--x",), files=(("/manager", "/bin/true"),))
    assert manager.argv(None, None) == ["/bin/true", "--x"]
    assert manager.argv(None, ["--y"]) == ["/bin/true", "--y"]  # args replace CMD
    assert manager.argv(["/manager", "--z"], ["a"]) == ["/bin/true", "--z", "a"]
    images = Images({"*resumequal-worker": manager})
    assert images.find("localhost/resumequal-worker:dev") is manager
    assert images.find("reg:5000/ml/resumequal-worker@sha256:ab") is manager
    assert images.find("ghcr.io/acme/other:1") is None


def test_a_loaded_image_is_its_base_with_a_layer_first_on_pythonpath(tmp_path: Path) -> None:
    base = Image(("resumequal",), env=(("PATH", "/bin"),), user="65532:65532")
    images = Images({"*resumequal-worker": base}, loaded=tmp_path / "loaded")
    layer = tmp_path / "layer" / "pkg"
    layer.mkdir(parents=True)
    (layer / "__init__.py").write_text("X = 1\n")
    held = load(tmp_path / "loaded", "localhost/nightly:01", "localhost/resumequal-worker:dev",
                layer.parent)
    found = images.find("localhost/nightly:01")
    assert found is not None and found.entrypoint == base.entrypoint and found.user == base.user
    assert dict(found.env) == {"PATH": "/bin", "PYTHONPATH": str(held)}
    assert (held / "pkg" / "__init__.py").stat().st_mode & 0o777 == 0o644
    # The whole reference: another tag of the same repository is another image.
    assert images.find("localhost/nightly:02") is None


def test_our_images_are_read_from_their_dockerfiles() -> None:
    worker = dockerfile_image(REPO / "images/worker/Dockerfile")
    assert worker.entrypoint == ("resumequal",) and worker.cmd == ("--help",)
    assert worker.user == "65532:65532"
    env = dict(worker.env)
    assert env["PYTHONUNBUFFERED"] == "1" and "HOME" not in env
    assert env["PATH"].split(":")[0].endswith("bin")
    operator = dockerfile_image(REPO / "images/operator/Dockerfile")
    assert operator.entrypoint == ("resumequal-operator",) and operator.cmd == ("run",)


def test_a_status_refused_for_the_uid_it_names_means_the_pod_wasrecreated() -> None:
    import json

    from kubernetes.client import ApiException

    from testing.cluster.node.refusals import recreated

    def refused(status: int, field: str) -> ApiException:
        e = ApiException(status=status, reason="Unprocessable Entity")
        # The real API server's answer to a status patch whose metadata.uid is not the pod's.
        e.body = json.dumps({"kind": "Status", "code": status, "reason": "Invalid", "details": {
            "name": "job-worker-1", "kind": "Pod",
            "causes": [{"reason": "FieldValueInvalid", "field": field,
                        "message": 'Invalid value: "u-1": field is immutable'}]}})
        return e

    assert recreated(refused(422, "metadata.uid"))
    assert not recreated(refused(422, "status.phase"))
    assert not recreated(refused(500, "metadata.uid"))
    not_json = ApiException(status=422)
    not_json.body = "<html>"
    assert not recreated(not_json)

