"""A container's environment, as the kubelet makes it (kubernetes ``pkg/kubelet/
kubelet_pods.go`` makeEnvironmentVariables, ``pkg/fieldpath/fieldpath.go``,
``third_party/forked/golang/expansion/expand.go``).

In order, a later name replacing an earlier one: the Service variables of the pod's
namespace (``enableServiceLinks``, on by default) and the ``kubernetes`` Service's
always; ``envFrom`` sources; then ``env``, each value with ``$(NAME)`` expanded against
what is defined so far (``$$`` escapes, an unknown reference stays as written) and each
``valueFrom`` resolved: ``fieldRef`` (pod fields, one label or annotation),
``resourceFieldRef`` (limits and requests, with a divisor), ``configMapKeyRef`` and
``secretKeyRef`` (``optional`` honoured). A missing ConfigMap or Secret, or key, is a
:class:`ConfigError` (the kubelet's CreateContainerConfigError): the container does not
start and the pod says why.

One deviation: the ``kubernetes`` Service's variables name the API server's own address
rather than the Service's cluster IP, since no kube-proxy gives cluster IPs a route here.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

Obj = dict[str, Any]
# (kind, namespace, name) -> the ConfigMap or Secret as the API holds it, or None if absent.
Lookup = Callable[[str, str, str], Obj | None]

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([a-zA-Z]*)$")
_SUFFIX: dict[str, Decimal | int] = {
    "": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
    "Pi": 2**50, "Ei": 2**60}


class ConfigError(Exception):
    """The container cannot be configured (CreateContainerConfigError); says why."""


def quantity(text: str) -> Decimal:
    """A resource quantity (``500m``, ``1Gi``, ``2``) as a number."""
    match = _QUANTITY.match(str(text).strip())
    if not match or match.group(2) not in _SUFFIX:
        raise ConfigError(f"quantity {text!r} is not a resource quantity")
    return Decimal(match.group(1)) * Decimal(_SUFFIX[match.group(2)])


def expand(value: str, defined: Mapping[str, str]) -> str:
    """``$(NAME)`` replaced by its value where defined; ``$$`` gives ``$`` (expand.go)."""
    out, i = [], 0
    while i < len(value):
        if value[i] == "$" and i + 1 < len(value):
            nxt = value[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = value.find(")", i + 2)
                if end != -1:
                    name = value[i + 2:end]
                    out.append(defined[name] if name in defined else value[i:end + 1])
                    i = end + 1
                    continue
        out.append(value[i])
        i += 1
    return "".join(out)


def service_variables(services: list[Obj], api_host: str, api_port: int,
                      namespace: str) -> dict[str, str]:
    """``{NAME}_SERVICE_HOST``, ``_SERVICE_PORT``, ``_PORT...`` of each Service with a
    cluster IP (kubelet_pods.go getServiceEnvVarMap, pkg/kubelet/envvars/envvars.go)."""
    out: dict[str, str] = {}
    for svc in services:
        meta, spec = svc["metadata"], svc.get("spec") or {}
        is_api = meta["name"] == "kubernetes" and meta["namespace"] == "default"
        if not is_api and meta["namespace"] != namespace:
            continue
        ip = spec.get("clusterIP")
        if not ip or ip == "None":
            continue
        ports = spec.get("ports") or []
        if is_api:
            ip, ports = api_host, [{"name": "https", "port": api_port, "protocol": "TCP"}]
        name = meta["name"].upper().replace("-", "_")
        out[f"{name}_SERVICE_HOST"] = ip
        if not ports:
            continue
        out[f"{name}_SERVICE_PORT"] = str(ports[0]["port"])
        for port in ports:
            if port.get("name"):
                out[f"{name}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = str(
                    port["port"])
        first = ports[0]
        proto = first.get("protocol", "TCP").lower()
        out[f"{name}_PORT"] = f"{proto}://{ip}:{first['port']}"
        for port in ports:
            proto = port.get("protocol", "TCP")
            prefix = f"{name}_PORT_{port['port']}_{proto}"
            out.update({prefix: f"{proto.lower()}://{ip}:{port['port']}",
                        f"{prefix}_PROTO": proto.lower(), f"{prefix}_PORT": str(port["port"]),
                        f"{prefix}_ADDR": ip})
    return out


def field(pod: Obj, path: str) -> str:
    """A downward API field path's value (fieldpath.go ExtractFieldPathAsString)."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    for where in ("labels", "annotations"):
        prefix = f"metadata.{where}['"
        if path.startswith(prefix) and path.endswith("']"):
            return str((meta.get(where) or {}).get(path[len(prefix):-2], ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    simple = {
        "metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": status.get("hostIP"), "status.podIP": status.get("podIP"),
        "status.hostIPs": ",".join(a["ip"] for a in status.get("hostIPs") or []),
        "status.podIPs": ",".join(a["ip"] for a in status.get("podIPs") or []),
    }
    if path not in simple:
        raise ConfigError(f"unsupported fieldPath: {path}")
    return str(simple[path] or "")


def resource_field(container: Obj, ref: Obj, node_allocatable: Mapping[str, str]) -> str:
    """A ``resourceFieldRef``: the container's limit (else the node's allocatable) or
    request, divided and rounded up (pkg/api/v1/resource ExtractContainerResourceValue)."""
    kind, _, name = ref["resource"].partition(".")
    resources = container.get("resources") or {}
    value = (resources.get(kind) or {}).get(name)
    if value is None:
        value = node_allocatable.get(name, "0") if kind == "limits" else "0"
    divisor = quantity(ref.get("divisor") or "1")
    return str(max(math.ceil(quantity(value) / divisor), 0 if kind == "requests" else 1))


def _data(lookup: Lookup, kind: str, namespace: str, name: str, optional: bool
          ) -> dict[str, str] | None:
    """A ConfigMap's data, or a Secret's decoded (a value that is not UTF-8 text is left
    out, as the kubelet leaves out what is not a valid variable)."""
    obj = lookup(kind, namespace, name)
    if obj is None:
        if not optional:
            raise ConfigError(f'{kind.lower()} "{name}" not found')
        return None
    if kind == "ConfigMap":
        return {k: str(v) for k, v in (obj.get("data") or {}).items()}
    out = {}
    for key, value in (obj.get("data") or {}).items():
        try:
            out[key] = base64.b64decode(value, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            continue
    return out


def container_env(pod: Obj, container: Obj, *, services: Mapping[str, str],
                  lookup: Lookup, node_allocatable: Mapping[str, str]) -> dict[str, str]:
    """The environment the container starts with (image variables excluded)."""
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    if pod.get("spec", {}).get("enableServiceLinks", True):
        env.update(services)
    else:
        env.update({k: v for k, v in services.items() if k.startswith("KUBERNETES_")})
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if key in source:
                ref = source[key]
                data = _data(lookup, kind, namespace, ref["name"], bool(ref.get("optional")))
                for name, value in (data or {}).items():
                    env[prefix + name] = value
    for item in container.get("env") or []:
        name, source = item["name"], item.get("valueFrom")
        if source is None:
            env[name] = expand(str(item.get("value", "")), env)
        elif "fieldRef" in source:
            env[name] = field(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            env[name] = resource_field(container, source["resourceFieldRef"], node_allocatable)
        else:
            for kind, key in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
                if key not in source:
                    continue
                ref = source[key]
                optional = bool(ref.get("optional"))
                data = _data(lookup, kind, namespace, ref["name"], optional)
                if data is not None and ref["key"] in data:
                    env[name] = data[ref["key"]]
                elif not optional:
                    raise ConfigError(f"couldn't find key {ref['key']} in {kind} "
                                      f"{namespace}/{ref['name']}")
                break
            else:
                raise ConfigError(f"env {name}: valueFrom {sorted(source)} is not supported")
    return env
