"""Build the operator and worker images with podman, without a registry, and smoke-test them.

    python3 tools/images.py build    # host tools, bases, both images
    python3 tools/images.py smoke    # run the built images: operator --help, a worker qualification
    python3 tools/images.py push --registry REGISTRY   # tag both as REGISTRY/NAME:VERSION, push
    python3 tools/images.py all      # build and smoke (what `make images` runs); with
                                     # --registry, push too (`make images REGISTRY=...`)

Pushing verifies the registry's TLS certificate unless REGISTRY_TLS_VERIFY is false.

No base image can be pulled on a machine without a registry, so the bases are made here:
a Python base bootstrapped from Debian packages (mmdebstrap) and a torch base from the pin's
wheels, downloaded once from the index into build/wheels. Each base carries a label with the
hash of its inputs and is rebuilt only when they change. Standard library only: it runs before any
virtual environment exists.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "images"
WHEELS = ROOT / "build" / "wheels"
# Written last into a wheel folder: the download finished, with these names and sizes.
WHEEL_LIST = "wheels.json"
SUITE = "bookworm"
# bookworm's python3 is 3.11 and its glibc 2.36: the wheels must be built for them.
PYTHON_VERSION = "3.11"
PYTHON_TAG = "cp311"
BASE_GLIBC = "2_36"
PYTHON_BASE = f"localhost/resumequal-python:{SUITE}"
OPERATOR_IMAGE = "localhost/resumequal-operator:dev"
WORKER_IMAGE = "localhost/resumequal-worker:dev"
DEFAULT_TORCH = "2.13.0"
# Every image this tool makes inherits this label from the Python base; pruning is limited
# to dangling images that carry it, so nobody else's images are touched.
OWNER_LABEL = "org.resumequal.local-base"
PYTHON_INPUTS_LABEL = "org.resumequal.python-base.inputs"
TORCH_INPUTS_LABEL = "org.resumequal.torch-base.inputs"
HOST_PACKAGES = {"podman": "podman", "runc": "runc", "mmdebstrap": "mmdebstrap"}
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
VENV = "/opt/python"
SMOKE_TIMEOUT_S = 900.0
PODMAN_ULIMIT = 1048576  # podman's default nofile and nproc
PODMAN_NPROC = 32768
# Nothing is ever pulled; builds share the host's network (pip reaches its index as the
# host does, with no bridge or NAT to set up); a failed step leaves no container behind.
BUILD_FLAGS = ("--pull=never", "--network=host", "--force-rm", "--layers")
TLS_VERIFY_ENV = "REGISTRY_TLS_VERIFY"
# host[:port] then lowercase path components, as image references name a repository.
_REGISTRY = re.compile(r"[a-z0-9]+([.-][a-z0-9]+)*(:[0-9]+)?"
                       r"(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")

# The torch base: torch and everything it needs come from the host's wheel folder,
# bind-mounted read-only and downloaded once (several GB from PyPI: a CUDA build, which runs
# on a CPU), so a rebuild fetches nothing and the build never reaches an index.
TORCH_CONTAINERFILE = """\
ARG PYTHON_IMAGE
FROM ${PYTHON_IMAGE}
ARG TORCH_VERSION
RUN python -m pip install --no-cache-dir --no-index --find-links /wheels \\
      "torch==${TORCH_VERSION}" \\
 && python -c "import torch; print('torch', torch.__version__)" \\
 && command -v torchrun
"""


class ImageBuildError(Exception):
    """A step of building or smoke-testing the images failed; the message says which."""


@dataclass
class Phases:
    """Wall time of each phase, printed as it ends and summed up at the end."""

    done: list[tuple[str, float, str]] = field(default_factory=list)

    @contextmanager
    def phase(self, name: str) -> Iterator[list[str]]:
        """Time the block; it may append a note (e.g. "cached") to the yielded list."""
        note: list[str] = []
        log.info("--- %s", name)
        start = time.monotonic()
        try:
            yield note
        finally:
            took = time.monotonic() - start
            self.done.append((name, took, " ".join(note)))
            log.info("--- %s: %.1f s%s", name, took, "".join(f" {n}" for n in note))

    def summary(self) -> str:
        """One line per phase and the total."""
        lines = [f"  {name:<16} {took:7.1f} s  {note}".rstrip() for name, took, note in self.done]
        lines.append(f"  {'total':<16} {sum(t for _, t, _ in self.done):7.1f} s")
        return "\n".join(lines)


# ---------------------------------------------------------------- host and engine


def _run(cmd: Sequence[str], env: dict[str, str] | None = None) -> None:
    """Run a command with its output going to ours (CI logs show every build step)."""
    log.info("$ %s", " ".join(cmd))
    try:
        subprocess.run(cmd, env=env, check=True)
    except subprocess.CalledProcessError as e:
        raise ImageBuildError(f"{_what(cmd)} exited {e.returncode}") from e
    except OSError as e:
        raise ImageBuildError(f"{_what(cmd)} could not start: {e}") from e


def _what(cmd: Sequence[str]) -> str:
    """The program and its first words (``python -m pip download``, ``podman build``)."""
    words = [Path(cmd[0]).name, *cmd[1:]]
    return " ".join(words[:4] if words[1:2] == ["-m"] else words[:2])


def ensure_host_tools() -> list[str]:
    """Install podman, runc and mmdebstrap from Debian when missing; returns what was."""
    missing = [pkg for cmd, pkg in HOST_PACKAGES.items() if shutil.which(cmd) is None]
    if not missing:
        return []
    if os.geteuid() != 0:
        raise ImageBuildError(f"missing {', '.join(missing)}; install them as root "
                              f"(apt-get install {' '.join(missing)})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # runc is named on its own so apt satisfies podman's "crun | runc" with it: crun refuses
    # hosts with hybrid cgroups. No recommends: buildah, fuse-overlayfs and slirp4netns are
    # for rootless use, which this is not.
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    try:
        _run(install, env=env)
    except ImageBuildError:
        _run(["apt-get", "update", "-q"], env=env)  # stale package lists on a fresh machine
        _run(install, env=env)
    return missing


def containers_conf(nofile: int, nproc: int) -> str:
    """The engine settings podman needs on these machines (see the comments inside)."""
    return (
        "# Written by tools/images.py. Root here lacks CAP_SYS_RESOURCE, so podman's default\n"
        "# container ulimits (1048576, above the hard limits) fail with EPERM.\n"
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        "\n"
        "# crun refuses hosts with hybrid cgroups (v1 controllers beside a v2 mount).\n"
        "[engine]\n"
        'runtime = "runc"\n'
    )


def engine_env() -> dict[str, str]:
    """Our environment plus CONTAINERS_CONF naming a config written under build/images."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = PODMAN_ULIMIT if nofile == resource.RLIM_INFINITY else min(nofile, PODMAN_ULIMIT)
    # podman 4.3 runs itself with nproc 32768 (its /proc/PID/limits), whatever the host
    # allows, and a container cannot be given more than its engine holds.
    nproc = PODMAN_NPROC if nproc == resource.RLIM_INFINITY else min(nproc, PODMAN_NPROC)
    WORK.mkdir(parents=True, exist_ok=True)
    conf = WORK / "containers.conf"
    conf.write_text(containers_conf(nofile, nproc))
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def image_label(env: dict[str, str], image: str, label: str) -> str | None:
    """The label's value on a local image; None when the image or the label is absent."""
    out = subprocess.run(
        ["podman", "image", "inspect", "--format", f'{{{{index .Labels "{label}"}}}}', image],
        env=env, capture_output=True, text=True, check=False,
    )
    value = out.stdout.strip()
    return value if out.returncode == 0 and value not in {"", "<no value>"} else None


def inputs_key(inputs: object) -> str:
    """A short, stable hash of a base's inputs (JSON-serialisable)."""
    blob = json.dumps(inputs, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


# ---------------------------------------------------------------- the Python base


def apt_sources(suite: str, files: Sequence[Path]) -> list[Path]:
    """The host's apt sources files that name the suite in an active line."""
    chosen = []
    for f in files:
        if not f.is_file():
            continue
        lines = [ln.split("#", 1)[0] for ln in f.read_text().splitlines()]
        if any(re.search(rf"(^|\s){re.escape(suite)}(\s|$)", ln) for ln in lines):
            chosen.append(f)
    return chosen


def host_apt_sources(suite: str) -> list[Path]:
    """Where the host's apt reaches Debian: its mirror, keyring and snapshot, reused as is."""
    etc = Path("/etc/apt")
    candidates = [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*.list")),
                  *sorted((etc / "sources.list.d").glob("*.sources"))]
    found = apt_sources(suite, candidates)
    if not found:
        raise ImageBuildError(f"no apt sources for {suite} in /etc/apt: the Python base is "
                              "bootstrapped from the host's Debian mirror")
    return found


def host_ca_files() -> list[Path]:
    """Extra CAs the host trusts (e.g. an egress proxy's); pip in a build needs them too."""
    return sorted(p for p in HOST_CA_DIR.rglob("*.crt") if p.is_file())


def mmdebstrap_args(ca_files: Sequence[Path]) -> list[str]:
    """The bootstrap's options (output and sources excluded); they feed the base's key."""
    hooks = []
    if ca_files:
        quoted = " ".join(f"'{p}'" for p in ca_files)
        hooks += [f'cp {quoted} "$1{HOST_CA_DIR}/"', 'chroot "$1" update-ca-certificates']
    hooks += [
        # A venv gives `python` and `pip` on PATH, as the official python images do, and
        # lets pip install as root without touching Debian's externally managed python.
        f'chroot "$1" python3 -m venv {VENV}',
        # pip vendors its own CA bundle; the system one holds the host's extra CAs.
        f"printf '[global]\\ncert = {SYSTEM_BUNDLE}\\n' > \"$1/etc/pip.conf\"",
    ]
    return [
        "--variant=minbase",
        "--include=python3,python3-venv,ca-certificates",
        # The host's mirror may serve a snapshot whose Release file has expired; mmdebstrap
        # does not read the host's apt.conf.d, where that is allowed.
        '--aptopt=Acquire::Check-Valid-Until "false"',
        *[f"--customize-hook={h}" for h in hooks],
    ]


def import_changes(key: str) -> list[str]:
    """Image config for the imported rootfs: what a `FROM python` stage expects."""
    return [
        f"ENV=PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV=LANG=C.UTF-8",
        "CMD=python3",
        f"LABEL={OWNER_LABEL}={SUITE}",
        f"LABEL={PYTHON_INPUTS_LABEL}={key}",
    ]


def python_base(env: dict[str, str], fresh: bool, note: list[str]) -> str:
    """Bootstrap the Debian Python base unless an image with the same inputs exists."""
    sources = host_apt_sources(SUITE)
    ca_files = host_ca_files()
    args = mmdebstrap_args(ca_files)
    key = inputs_key({
        "suite": SUITE, "args": args, "changes": import_changes(""),
        "sources": [s.read_text() for s in sources],
        "ca": {p.name: p.read_text() for p in ca_files},
    })
    if not fresh and image_label(env, PYTHON_BASE, PYTHON_INPUTS_LABEL) == key:
        note.append("(cached)")
        return key
    with tempfile.TemporaryDirectory(dir=WORK, prefix="rootfs-") as tmp:
        tar = Path(tmp) / "rootfs.tar"
        _run(["mmdebstrap", *args, SUITE, str(tar), *map(str, sources)], env=env)
        changes = [f"--change={c}" for c in import_changes(key)]
        _run(["podman", "import", *changes, str(tar), PYTHON_BASE], env=env)
    return key


# ---------------------------------------------------------------- the torch base


def wheels_dir(version: str, arch: str) -> Path:
    """Where the torch pin's wheels for the base's Python and machine are kept."""
    return WHEELS / f"torch-{version}-{PYTHON_TAG}-{arch}"


def platform_tags(arch: str) -> list[str]:
    """Every wheel platform the base runs: manylinux up to its glibc (pip takes only the
    tags it is given), the legacy aliases some wheels carry alone, plain linux."""
    newest = int(BASE_GLIBC.split("_")[1])
    return ([f"manylinux_2_{minor}_{arch}" for minor in range(newest, 4, -1)]
            + [f"manylinux{legacy}_{arch}" for legacy in ("2014", "2010", "1")]
            + [f"linux_{arch}"])


def download_command(version: str, arch: str, dest: Path) -> list[str]:
    """`pip download` of torch and everything it needs, for the base, not for this host."""
    return [
        sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
        "--python-version", PYTHON_VERSION, "--implementation", "cp", "--abi", PYTHON_TAG,
        *(f for tag in platform_tags(arch) for f in ("--platform", tag)),
        "--dest", str(dest), f"torch=={version}",
    ]


def read_wheel_list(folder: Path) -> dict[str, int] | None:
    """The wheels a finished download left (name: size), or None if none finished there."""
    try:
        listed = json.loads((folder / WHEEL_LIST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(listed, dict) or not all(
        isinstance(size, int) and (folder / name).is_file()
        and (folder / name).stat().st_size == size
        for name, size in listed.items()
    ):
        return None
    return listed


def torch_wheels(version: str, arch: str, note: list[str]) -> tuple[Path, dict[str, int]]:
    """The pin's wheels, downloaded once into build/ and reused while the pin holds."""
    folder = wheels_dir(version, arch)
    listed = read_wheel_list(folder)
    if listed is not None:
        note.append("(wheels kept)")
        return folder, listed
    WHEELS.mkdir(parents=True, exist_ok=True)
    # pip's own configuration applies (index, extra index, find-links), so a mirror or a
    # local wheel folder is used as pip would use it; a half-finished download is never kept.
    tmp = Path(tempfile.mkdtemp(dir=WHEELS, prefix="download-"))
    try:
        _run(download_command(version, arch, tmp))
        wheels = {p.name: p.stat().st_size for p in sorted(tmp.glob("*.whl"))}
        if not any(name.startswith("torch-") for name in wheels):
            raise ImageBuildError(f"pip download torch=={version} left no torch wheel")
        (tmp / WHEEL_LIST).write_text(json.dumps(wheels, indent=1, sort_keys=True))
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total = sum(wheels.values()) / 1e9
    note.append(f"(downloaded {len(wheels)} wheels, {total:.1f} GB)")
    return folder, wheels


def torch_base_name(version: str) -> str:
    """The local tag of the torch base."""
    return f"localhost/resumequal-torch:{version}"


def torch_base(env: dict[str, str], version: str, python_key: str, fresh: bool,
               note: list[str]) -> str:
    """Build the torch base on the Python base unless one with the same inputs exists."""
    folder, wheels = torch_wheels(version, platform.machine(), note)
    image = torch_base_name(version)
    key = inputs_key({"python": python_key, "version": version, "wheels": wheels,
                      "containerfile": TORCH_CONTAINERFILE})
    if not fresh and image_label(env, image, TORCH_INPUTS_LABEL) == key:
        note.append("(cached)")
        return image
    with tempfile.TemporaryDirectory(dir=WORK, prefix="torch-") as context:
        containerfile = Path(context) / "Containerfile"
        containerfile.write_text(TORCH_CONTAINERFILE)
        _run(["podman", "build", *BUILD_FLAGS, "-v", f"{folder}:/wheels:ro",
              "--build-arg", f"PYTHON_IMAGE={PYTHON_BASE}",
              "--build-arg", f"TORCH_VERSION={version}",
              "--label", f"{TORCH_INPUTS_LABEL}={key}",
              "-f", str(containerfile), "-t", image, context], env=env)
    return image


# ---------------------------------------------------------------- the images

def build_image(env: dict[str, str], image: str, dockerfile: str,
                build_args: dict[str, str]) -> None:
    """Build one of images/*/Dockerfile from the repository root, as the README does."""
    flags = [f for name, value in build_args.items() for f in ("--build-arg", f"{name}={value}")]
    _run(["podman", "build", *BUILD_FLAGS, *flags, "-f", dockerfile, "-t", image, str(ROOT)],
         env=env)


def prune(env: dict[str, str]) -> None:
    """Drop our dangling images (older builds, build stages); keeps disk use bounded."""
    _run(["podman", "image", "prune", "-f", "--filter", f"label={OWNER_LABEL}"], env=env)


def build(torch_version: str, fresh: bool, phases: Phases) -> None:
    """Host tools, the two bases, then the operator and worker images."""
    with phases.phase("host tools") as note:
        installed = ensure_host_tools()
        note.append(f"(installed {' '.join(installed)})" if installed else "(present)")
    env = engine_env()
    with phases.phase("python base") as note:
        python_key = python_base(env, fresh, note)
    with phases.phase("torch base") as note:
        torch_image = torch_base(env, torch_version, python_key, fresh, note)
    with phases.phase("operator image"):
        build_image(env, OPERATOR_IMAGE, "images/operator/Dockerfile",
                    {"PYTHON_IMAGE": PYTHON_BASE})
    with phases.phase("worker image"):
        build_image(env, WORKER_IMAGE, "images/worker/Dockerfile",
                    {"PYTHON_IMAGE": PYTHON_BASE, "BASE_IMAGE": torch_image})
    with phases.phase("prune"):
        prune(env)


# ---------------------------------------------------------------- smoke tests


def run_container(env: dict[str, str], name: str, image: str, args: Sequence[str],
                  timeout: float) -> tuple[int, str]:
    """Run the image with loopback only; returns its exit code and output (also echoed)."""
    cmd = ["podman", "run", "--rm", "--network", "none", "--name", name, image, *args]
    log.info("$ %s", " ".join(cmd))
    out: list[str] = []
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:

        def echo() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                out.append(line)

        reader = threading.Thread(target=echo, daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            # Only our own, uniquely named container; podman run then returns.
            subprocess.run(["podman", "rm", "-f", "-t", "0", name], env=env, check=False)
            proc.wait()
            raise ImageBuildError(f"{image} {' '.join(args)} ran past {timeout:.0f} s") from e
        finally:
            reader.join(timeout=10)
    return code, "".join(out)


def smoke(phases: Phases) -> None:
    """The operator image answers --help; the worker image qualifies and says PASS."""
    env = engine_env()
    suffix = os.getpid()
    with phases.phase("smoke operator"):
        code, out = run_container(env, f"resumequal-smoke-operator-{suffix}", OPERATOR_IMAGE,
                                  ["--help"], timeout=120)
        if code != 0 or "Usage: resumequal-operator" not in out:
            raise ImageBuildError(f"{OPERATOR_IMAGE} --help exited {code} without its usage")
    with phases.phase("smoke worker"):
        # A real qualification: two torchrun ranks on gloo over loopback, a hard kill, a
        # resume from the checkpoint and the comparison. The controls (negative runs) are
        # the unit suite's business and would triple the time.
        args = ["run", "--set", "controls.enabled=false", "--run-dir", "/work/runs/smoke"]
        code, out = run_container(env, f"resumequal-smoke-worker-{suffix}", WORKER_IMAGE,
                                  args, timeout=SMOKE_TIMEOUT_S)
        if code != 0 or "PASS" not in out:
            raise ImageBuildError(f"{WORKER_IMAGE} resumequal run exited {code}, not a PASS")


# ---------------------------------------------------------------- pushing


def project_version(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The project's version: the chart's appVersion, so the default image.tag."""
    return str(tomllib.loads(pyproject.read_text())["project"]["version"])


def tls_verify(environ: dict[str, str]) -> bool:
    """REGISTRY_TLS_VERIFY: on unless false (or 0, no); anything else is refused."""
    value = environ.get(TLS_VERIFY_ENV, "true").strip().lower()
    if value in {"true", "1", "yes", ""}:
        return True
    if value in {"false", "0", "no"}:
        return False
    raise ImageBuildError(f"{TLS_VERIFY_ENV}={value!r}: want true or false")


def pushed_name(registry: str, image: str, tag: str) -> str:
    """``registry/NAME:tag`` for a local image ``localhost/NAME:dev``."""
    registry = registry.rstrip("/")
    if not _REGISTRY.fullmatch(registry):
        raise ImageBuildError(f"registry {registry!r}: want host[:port][/path] in lowercase, "
                              "no scheme and no tag (e.g. registry.example.com:5000/ml)")
    if not _TAG.fullmatch(tag):
        raise ImageBuildError(f"tag {tag!r}: letters, digits, '_', '.' and '-', at most 128")
    name = image.rsplit("/", 1)[-1].split(":", 1)[0]
    return f"{registry}/{name}:{tag}"


def push_commands(registry: str, tag: str, verify: bool) -> list[list[str]]:
    """``podman tag`` and ``podman push`` of the operator image, then of the worker image."""
    commands = []
    for image in (OPERATOR_IMAGE, WORKER_IMAGE):
        target = pushed_name(registry, image, tag)
        commands += [["podman", "tag", image, target],
                     ["podman", "push", f"--tls-verify={str(verify).lower()}", target]]
    return commands


def helm_values(registry: str, tag: str) -> list[str]:
    """The `helm install` flags that run the operator image ``push`` pushed."""
    repository = pushed_name(registry, OPERATOR_IMAGE, tag).rsplit(":", 1)[0]
    return ["--set", f"image.repository={repository}", "--set", f"image.tag={tag}"]


def push(registry: str, tag: str, phases: Phases) -> None:
    """Tag both built images into ``registry`` and push them (log in with podman first)."""
    env = engine_env()
    commands = push_commands(registry, tag, tls_verify(env))
    with phases.phase("push"):
        for cmd in commands:
            _run(cmd, env=env)
    log.info("pushed %s and %s; helm install ... %s", pushed_name(registry, OPERATOR_IMAGE, tag),
             pushed_name(registry, WORKER_IMAGE, tag), " ".join(helm_values(registry, tag)))


# ---------------------------------------------------------------- entry point


def _torch_version(spec: str) -> str:
    """`2.13.0` from `2.13.0` or `torch==2.13.0` (the Makefile's TORCH_SPEC)."""
    version = spec.removeprefix("torch==")
    if not re.fullmatch(r"\d+(\.\d+)+", version):
        raise argparse.ArgumentTypeError(f"--torch: want torch==X.Y.Z or X.Y.Z, got {spec!r}")
    return version


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, run the phases, print their timings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["build", "smoke", "push", "all"])
    parser.add_argument("--torch", type=_torch_version, default=DEFAULT_TORCH,
                        help="the torch of the torch base (default %(default)s)")
    parser.add_argument("--fresh", action="store_true",
                        help="rebuild the bases even when their inputs did not change")
    parser.add_argument("--registry", default="",
                        help="push both images there, as REGISTRY/resumequal-operator:TAG and "
                             "REGISTRY/resumequal-worker:TAG (push; all: after the smoke tests)")
    parser.add_argument("--tag", default=None,
                        help="the pushed images' tag (default: the project's version)")
    opts = parser.parse_args(argv)
    if opts.what == "push" and not opts.registry:
        parser.error("push needs --registry")
    if opts.registry and opts.what in {"build", "smoke"}:
        parser.error(f"--registry goes with push or all, not {opts.what}")
    logging.basicConfig(level=logging.INFO, format="images: %(message)s", stream=sys.stdout)
    phases = Phases()
    try:
        tag = opts.tag or project_version()
        if opts.registry:  # a bad name is refused before anything is built
            push_commands(opts.registry, tag, tls_verify(dict(os.environ)))
        if opts.what in {"build", "all"}:
            build(opts.torch, opts.fresh, phases)
        if opts.what in {"smoke", "all"}:
            smoke(phases)
        if opts.registry:
            push(opts.registry, tag, phases)
    except ImageBuildError as e:
        log.error("FAILED: %s", e)
        log.info("phase timings:\n%s", phases.summary())
        return 1
    log.info("phase timings:\n%s", phases.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
