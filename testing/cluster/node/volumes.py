"""A pod's volumes made on this machine, and the mounts that put them in its container.

As the kubelet's volume plugins do (kubernetes ``pkg/volume``):

- ``emptyDir``: a folder of the pod's (mode 0777, ``empty_dir.go``); ``medium: Memory``
  a tmpfs of ``sizeLimit`` (``empty_dir_linux.go``).
- ``secret``, ``configMap``, ``downwardAPI``, ``projected``: files written by the
  atomic writer (``pkg/volume/util/atomic_writer.go``): the payload in a ``..<time>``
  folder, ``..data`` a link to it, each top-level name a link through ``..data``, so a
  refresh swaps one link and a reader never sees half of it. ``items`` pick keys and
  paths; ``defaultMode`` (0644 by default) or an item's ``mode``; with a pod
  ``fsGroup`` the files belong to that group and are group-readable
  (``pkg/volume/volume_linux.go`` SetVolumeOwnership, read-only mask 0440). A missing
  Secret or ConfigMap that is not ``optional`` fails the mount (FailedMount), and the
  kubelet retries.
- ``projected`` ``serviceAccountToken``: a token from the TokenRequest API for the pod's
  ServiceAccount, bound to the pod, with its audience and expiry (``pkg/kubelet/token/
  token_manager.go``), fetched again once 80 % of its life has passed.
- ``hostPath``: this machine's path.

Files are refreshed on every sync (the kubelet's periodic volume remount), so a Secret
that changes reaches a running container, as webhook certificates rotated by a
controller must.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .envvars import ConfigError, field, resource_field

Obj = dict[str, Any]
DEFAULT_MODE = 0o644
TOKEN_DEFAULT_EXPIRY_S = 3600
# (kind, namespace, name) -> the ConfigMap or Secret as the API holds it, or None if absent.
RawLookup = Callable[[str, str, str], Obj | None]
# (namespace, service account, audiences, expiry seconds, pod) -> (token, expiry epoch)
TokenRequest = Callable[[str, str, list[str], int, Obj], tuple[str, float]]


class MountError(ConfigError):
    """A volume cannot be set up (the kubelet's FailedMount); says which and why."""


@dataclass(frozen=True)
class Mount:
    """One mount in the container: a bind of ``source`` or a tmpfs."""

    target: str
    source: str = ""
    read_only: bool = False
    tmpfs_size: int | None = None  # bytes; a tmpfs instead of a bind

    def to_json(self) -> Obj:
        return {"target": self.target, "source": self.source, "readOnly": self.read_only,
                "tmpfsSize": self.tmpfs_size}


def _write_atomic(folder: Path, files: dict[str, tuple[bytes, int]], gid: int | None) -> bool:
    """Write ``files`` (relative path -> content, mode) as the atomic writer does; returns
    whether anything changed."""
    folder.mkdir(parents=True, exist_ok=True)
    current = folder / "..data"
    if current.is_symlink():
        old = {}
        base = folder / os.readlink(current)
        for path in base.rglob("*"):
            if path.is_file():
                old[path.relative_to(base).as_posix()] = (path.read_bytes(),
                                                          path.stat().st_mode & 0o7777)
        if old == files:
            return False
    stamp = datetime.datetime.now(datetime.UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f")
    payload = folder / stamp
    payload.mkdir()
    for rel, (content, mode) in files.items():
        target = payload / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        if gid is not None:
            os.chown(target, 0, gid)
        os.chmod(target, mode)
    if gid is not None:
        os.chown(payload, 0, gid)
    os.chmod(payload, 0o755)
    tmp_link = folder / "..data_tmp"
    tmp_link.unlink(missing_ok=True)
    tmp_link.symlink_to(stamp)
    tmp_link.rename(current)  # the swap: readers see the old payload or the new, whole
    for top in {rel.split("/", 1)[0] for rel in files}:
        link = folder / top
        if not link.is_symlink():
            link.symlink_to(f"..data/{top}")
    for entry in folder.iterdir():  # what the new payload no longer has
        if entry.name.startswith("..") and entry.name not in ("..data", stamp):
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.is_symlink() and not entry.name.startswith("..") and entry.name not in {
                rel.split("/", 1)[0] for rel in files}:
            entry.unlink()
    return True


def _mode(item: Obj, default: int, fs_group: int | None) -> int:
    mode = int(item.get("mode", default))
    return mode | 0o440 if fs_group is not None else mode


def _keyed(data: Mapping[str, bytes], items: list[Obj] | None, default: int,
           fs_group: int | None, what: str, optional: bool) -> dict[str, tuple[bytes, int]]:
    out: dict[str, tuple[bytes, int]] = {}
    if not items:
        return {k: (v, _mode({}, default, fs_group)) for k, v in data.items()}
    for item in items:
        if item["key"] not in data:
            if optional:
                continue
            raise MountError(f"configmap references non-existent config key: {item['key']}"
                             if what.startswith("ConfigMap") else
                             f"references non-existent secret key: {item['key']}")
        out[item["path"]] = (data[item["key"]], _mode(item, default, fs_group))
    return out


def _secret_bytes(raw: Mapping[str, str]) -> dict[str, bytes]:
    out = {}
    for key, value in raw.items():
        try:
            out[key] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as e:
            raise MountError(f"secret key {key} is not base64") from e
    return out


@dataclass
class PodVolumes:
    """The volumes of one pod under ``root`` (its folder on the node)."""

    pod: Obj
    root: Path
    lookup: RawLookup
    request_token: TokenRequest
    node_allocatable: Mapping[str, str]
    # (volume name, source index) -> (token, expiry) of projected tokens fetched so far.
    tokens: dict[tuple[str, int], tuple[str, float]] | None = None

    def __post_init__(self) -> None:
        self.tokens = {}

    @property
    def fs_group(self) -> int | None:
        value = (self.pod["spec"].get("securityContext") or {}).get("fsGroup")
        return int(value) if value is not None else None

    def _object(self, kind: str, name: str, optional: bool) -> Obj | None:
        obj = self.lookup(kind, self.pod["metadata"]["namespace"], name)
        if obj is None and not optional:
            raise MountError(f'{kind.lower()} "{name}" not found')
        return obj

    def _config_map(self, ref: Obj) -> dict[str, bytes] | None:
        obj = self._object("ConfigMap", ref["name"], bool(ref.get("optional")))
        if obj is None:
            return None
        out = {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
        for k, v in (obj.get("binaryData") or {}).items():
            out[k] = base64.b64decode(v)
        return out

    def _secret(self, ref: Obj, name_key: str) -> dict[str, bytes] | None:
        obj = self._object("Secret", ref[name_key], bool(ref.get("optional")))
        return None if obj is None else _secret_bytes(obj.get("data") or {})

    def _downward(self, items: list[Obj], default: int) -> dict[str, tuple[bytes, int]]:
        out = {}
        container = (self.pod["spec"].get("containers") or [{}])[0]
        for item in items:
            if "fieldRef" in item:
                value = field(self.pod, item["fieldRef"]["fieldPath"])
            else:
                value = resource_field(container, item["resourceFieldRef"],
                                       self.node_allocatable)
            out[item["path"]] = (value.encode(), _mode(item, default, self.fs_group))
        return out

    def _token(self, volume: str, index: int, source: Obj) -> bytes:
        assert self.tokens is not None
        expiry_s = int(source.get("expirationSeconds") or TOKEN_DEFAULT_EXPIRY_S)
        held = self.tokens.get((volume, index))
        # token_manager.go requiresRefresh: past 80 % of the token's life, or 24 h.
        if held is None or time.time() > held[1] - 0.2 * expiry_s:
            audience = source.get("audience")
            meta, spec = self.pod["metadata"], self.pod["spec"]
            held = self.request_token(meta["namespace"], spec.get("serviceAccountName")
                                      or "default", [audience] if audience else [], expiry_s,
                                      self.pod)
            self.tokens[(volume, index)] = held
        return held[0].encode()

    def _files(self, volume: Obj) -> dict[str, tuple[bytes, int]] | None:
        """The payload of a file-backed volume; None for other kinds."""
        fs_group = self.fs_group
        if "secret" in volume:
            ref = volume["secret"]
            data = self._secret(ref, "secretName")
            default = int(ref.get("defaultMode", DEFAULT_MODE))
            return {} if data is None else _keyed(data, ref.get("items"), default, fs_group,
                                                  "Secret", bool(ref.get("optional")))
        if "configMap" in volume:
            ref = volume["configMap"]
            data = self._config_map(ref)
            default = int(ref.get("defaultMode", DEFAULT_MODE))
            return {} if data is None else _keyed(data, ref.get("items"), default, fs_group,
                                                  "ConfigMap", bool(ref.get("optional")))
        if "downwardAPI" in volume:
            ref = volume["downwardAPI"]
            return self._downward(ref.get("items") or [], int(ref.get("defaultMode",
                                                                     DEFAULT_MODE)))
        if "projected" in volume:
            ref = volume["projected"]
            default = int(ref.get("defaultMode", DEFAULT_MODE))
            out: dict[str, tuple[bytes, int]] = {}
            for index, source in enumerate(ref.get("sources") or []):
                if "serviceAccountToken" in source:
                    token = source["serviceAccountToken"]
                    out[token["path"]] = (self._token(volume["name"], index, token),
                                          _mode({}, default, fs_group))
                elif "secret" in source:
                    data = self._secret(source["secret"], "name")
                    if data is not None:
                        out.update(_keyed(data, source["secret"].get("items"), default,
                                          fs_group, "Secret",
                                          bool(source["secret"].get("optional"))))
                elif "configMap" in source:
                    data = self._config_map(source["configMap"])
                    if data is not None:
                        out.update(_keyed(data, source["configMap"].get("items"), default,
                                          fs_group, "ConfigMap",
                                          bool(source["configMap"].get("optional"))))
                elif "downwardAPI" in source:
                    out.update(self._downward(source["downwardAPI"].get("items") or [],
                                              default))
                else:
                    raise MountError(f"projected source {sorted(source)} is not supported")
            return out
        return None

    def folder(self, volume: Obj) -> Path:
        kind = next(k for k in volume if k != "name")
        return self.root / "volumes" / f"kubernetes.io~{kind}" / str(volume["name"])

    def sync(self) -> None:
        """Write (or refresh) every file-backed volume and make the empty dirs."""
        for volume in self.pod["spec"].get("volumes") or []:
            files = self._files(volume)
            folder = self.folder(volume)
            if files is not None:
                _write_atomic(folder, files, self.fs_group)
            elif "emptyDir" in volume:
                if not folder.exists():
                    folder.mkdir(parents=True)
                    os.chmod(folder, 0o777)
            elif "hostPath" not in volume:
                kind = next(k for k in volume if k != "name")
                raise MountError(f"volume {volume['name']}: {kind} volumes are not supported "
                                 "by the node agent")

    def mounts(self, container: Obj) -> list[Mount]:
        """The container's ``volumeMounts`` as mounts of what :meth:`sync` made."""
        volumes = {v["name"]: v for v in self.pod["spec"].get("volumes") or []}
        out = []
        for vm in container.get("volumeMounts") or []:
            volume = volumes.get(vm["name"])
            if volume is None:
                raise MountError(f"volumeMount {vm['name']}: no such volume in the pod")
            read_only = bool(vm.get("readOnly"))
            if "emptyDir" in volume and volume["emptyDir"].get("medium") == "Memory":
                limit = volume["emptyDir"].get("sizeLimit")
                size = int(_bytes(limit)) if limit else None
                out.append(Mount(vm["mountPath"], tmpfs_size=size or 0, read_only=read_only))
                continue
            if "hostPath" in volume:
                source = Path(volume["hostPath"]["path"])
            else:
                source = self.folder(volume)
            sub = vm.get("subPath")
            if sub:
                source = source / sub
            # Secrets, ConfigMaps, the downward API and projections are read-only
            # whatever the mount says (kubelet: these plugins' mounters are read-only).
            if any(k in volume for k in ("secret", "configMap", "downwardAPI", "projected")):
                read_only = True
            out.append(Mount(vm["mountPath"], str(source), read_only))
        return out


def _bytes(quantity_text: str) -> int:
    from .envvars import quantity

    return int(quantity(quantity_text))
