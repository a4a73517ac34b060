"""The cluster's Go programs, built from their own modules into ``build/cluster/bin``.

Each folder under ``testing/cluster/go`` is a small module of ours that requires the
upstream module at its pinned release (go.mod and go.sum committed, so the build is the
same on every machine) and names the programs to build. ``k8s.io/kubernetes`` cannot be
required as is: its go.mod requires the staging modules (``k8s.io/api``, ...) at v0.0.0
and replaces them with ``./staging/...``; our go.mod replaces each with its published
v0.X.Y of the same release, the usual way to build Kubernetes' commands as a dependency.

Binaries land in ``build/cluster/bin/<module>-<key>/``, where the key hashes the module's
files and the Go version: a pin that changes builds anew, one that does not is reused
(the Go build cache makes a rebuild after a small change quick, too).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import ClusterError

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
SOURCES = Path(__file__).resolve().parent / "go"
BIN = REPO / "build" / "cluster" / "bin"


@dataclass(frozen=True)
class GoModule:
    """A module of ours under ``testing/cluster/go`` and the programs it builds."""

    folder: str
    programs: tuple[tuple[str, str], ...]  # (binary name, package path)
    # -X settings: what a release's own build stamps in (a dependency build has none).
    stamps: tuple[str, ...] = ()

    @property
    def source(self) -> Path:
        return SOURCES / self.folder


K8S_VERSION = "v1.36.3"
# Kubernetes' hack/lib/version.sh stamps both packages; the API server reports it as its
# /version, which helm checks against a chart's kubeVersion.
_K8S_STAMPS = tuple(
    f"-X {pkg}.{name}={value}"
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
    for name, value in (("gitVersion", K8S_VERSION), ("gitMajor", "1"), ("gitMinor", "36"),
                        ("gitTreeState", "clean"), ("buildDate", "1970-01-01T00:00:00Z")))
KUBERNETES = GoModule("kubernetes", (
    ("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
    ("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager"),
    ("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler"),
    ("kubectl", "k8s.io/kubernetes/cmd/kubectl"),
    ("helm", "helm.sh/helm/v3/cmd/helm"),
    ("trainer-controller-manager",
     "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"),
    ("jobset-controller-manager", "sigs.k8s.io/jobset"),
    ("coredns", "resumequal.dev/cluster/kubernetes/coredns"),
), (*_K8S_STAMPS, "-X helm.sh/helm/v3/internal/version.version=v3.21.4",
    "-X github.com/coredns/coredns/coremain.GitCommit=v1.14.2"))
ETCD = GoModule("etcd", (("etcd", "resumequal.dev/cluster/etcd"),))
TRAINING_OPERATOR = GoModule("training-operator", (
    ("training-operator", "github.com/kubeflow/training-operator/cmd/training-operator.v1"),
))
SEAWEEDFS = GoModule("seaweedfs", (("weed", "github.com/seaweedfs/seaweedfs/weed"),))
FAKE_GCS = GoModule("fake-gcs-server", (("fake-gcs-server", "github.com/fsouza/fake-gcs-server"),))
MODULES = (ETCD, KUBERNETES, TRAINING_OPERATOR, SEAWEEDFS, FAKE_GCS)


def go() -> str:
    """The go command, or a clear error when Go is not installed."""
    found = shutil.which("go") or ("/usr/local/go/bin/go"
                                    if os.access("/usr/local/go/bin/go", os.X_OK) else None)
    if found is None:
        raise ClusterError("no `go` on PATH: the cluster's programs are built from their Go "
                           "modules (Go 1.26 or later)")
    return found


def go_version() -> str:
    out = subprocess.run([go(), "env", "GOVERSION"], capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def module_key(module: GoModule) -> str:
    """What decides the binaries: the module's files, the programs and the Go version."""
    digest = hashlib.sha256(go_version().encode())
    for path in sorted(p for p in module.source.rglob("*") if p.is_file()):
        digest.update(path.relative_to(module.source).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    digest.update(repr((module.programs, module.stamps)).encode())
    return digest.hexdigest()[:16]


def binaries_dir(module: GoModule) -> Path:
    return BIN / f"{module.folder}-{module_key(module)}"


def build(module: GoModule, *, jobs: int | None = None) -> Path:
    """The module's programs, built unless this pin's are already there; their folder.
    One build at a time: a second caller waits for the first and takes its binaries."""
    target = binaries_dir(module)
    if all((target / name).is_file() for name, _ in module.programs):
        return target
    BIN.mkdir(parents=True, exist_ok=True)
    with open(BIN / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all((target / name).is_file() for name, _ in module.programs):
            return target
        return _build(module, target, jobs)


def _build(module: GoModule, target: Path, jobs: int | None) -> Path:
    # Older pins' binaries go: only the current ones are kept.
    for old in BIN.glob(f"{module.folder}-*"):
        shutil.rmtree(old, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=BIN, prefix=f".{module.folder}-"))
    started = time.monotonic()
    ldflags = " ".join(["-s", "-w", *module.stamps])
    cmd = [go(), "build", "-trimpath", f"-ldflags={ldflags}", *([f"-p={jobs}"] if jobs else [])]
    log.info("building %s (%s)", module.folder, ", ".join(n for n, _ in module.programs))
    try:
        for name, package in module.programs:
            # One `go build` per program: -o names the binary, whatever its package's path.
            result = subprocess.run([*cmd, "-o", str(tmp / name), package], cwd=module.source,
                                    env={**os.environ, "GOFLAGS": "-mod=readonly",
                                         "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"},
                                    capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise ClusterError(f"go build {package} (in {module.source}) exited "
                                   f"{result.returncode}:\n{result.stderr[-4000:]}")
        tmp.chmod(0o755)  # pods run these as users of their own
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("built %s in %.0f s", module.folder, time.monotonic() - started)
    return target


def build_all() -> dict[str, Path]:
    """Every program of every module: name -> path."""
    found: dict[str, Path] = {}
    for module in MODULES:
        folder = build(module)
        found.update({name: folder / name for name, _ in module.programs})
    return found


def module_dir(module: str) -> Path:
    """Where a module our Go modules require lies in the module cache (its manifests and
    CRDs are read from there)."""
    out = subprocess.run([go(), "list", "-m", "-f", "{{.Dir}}", module],
                         cwd=SOURCES / ("training-operator" if "training-operator" in module
                                        else "kubernetes"),
                         capture_output=True, text=True, check=True)
    path = Path(out.stdout.strip())
    if not path.is_dir():
        raise ClusterError(f"{module}: not in the module cache")
    return path
