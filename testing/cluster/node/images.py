"""The images the node agent can run, and what each is: its entrypoint, command, user and
environment, with the programs it holds found on this machine.

No container runtime runs here, so an image is not unpacked: each known image is this
machine's file system plus its configuration, read from where it is defined —
``images/*/Dockerfile`` for resumequal's own (parsed with the official Dockerfile parser:
ENTRYPOINT, CMD, ENV, USER), the upstream Dockerfiles' ``ENTRYPOINT ["/manager"]`` for
the Kubeflow controllers, whose ``/manager`` is the program built from the same release.
An image can also be *loaded* into the node, as ``kind load`` loads one built elsewhere
(:func:`load`): a known image plus one layer of its own, a folder of Python packages put
first on its ``PYTHONPATH``, held under its whole reference (tag included: two nightly tags
are two images). A pod naming any other image waits with ``ErrImagePull``, as a node that
cannot pull it. The Python programs run from this checkout's environment (its ``bin``
first on PATH).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parents[3]
T = TypeVar("T")
VENV_BIN = Path(sys.executable).parent


def image_paths() -> list[str]:
    """What the images hold of this machine: the Python their programs run on, its
    environment, the project it has installed (an editable install reads its sources where
    they lie) and this checkout (the stand-ins built under build/)."""
    import resumequal

    project = Path(resumequal.__file__).resolve().parents[2]
    return sorted({sys.base_prefix, sys.prefix, str(project), str(REPO)})


@dataclass(frozen=True)
class Image:
    """What a container of this image starts with, before the pod's own settings."""

    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    user: str | None = None
    # Paths inside the image -> this machine's files that stand for them.
    files: tuple[tuple[str, str], ...] = ()

    def argv(self, command: list[str] | None, args: list[str] | None) -> list[str]:
        """The process's argv as the CRI makes it (kuberuntime_container.go: the container's
        command replaces the entrypoint, its args the image's CMD)."""
        if command:
            argv = [*command, *(args or [])]
        else:
            argv = [*self.entrypoint, *(args if args is not None else self.cmd)]
        files = dict(self.files)
        if argv and argv[0] in files:
            argv[0] = files[argv[0]]
        return argv


def repository(reference: str) -> str:
    """An image reference without its tag or digest."""
    name = reference.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name[: name.rindex(":")] if ":" in last else name


def by_repository(patterns: Mapping[str, T], reference: str) -> T | None:
    """The value of the first repository glob that ``reference``'s repository matches."""
    name = repository(reference)
    return next((v for p, v in patterns.items() if fnmatch.fnmatchcase(name, p)), None)


@dataclass
class Images:
    """Known images by repository glob (tag and digest ignored: one build each), and the
    images loaded into ``loaded`` by their whole reference (see :func:`load`)."""

    known: dict[str, Image] = field(default_factory=dict)
    loaded: Path | None = None

    def find(self, reference: str) -> Image | None:
        return self._loaded(reference) or by_repository(self.known, reference)

    def _loaded(self, reference: str) -> Image | None:
        # Read at each pod start: an image loaded while the node runs is found.
        if self.loaded is None:
            return None
        try:
            entry = json.loads((self.loaded / f"{_key(reference)}.json").read_text())
        except (OSError, ValueError):
            return None
        base = by_repository(self.known, entry["from"])
        if base is None or entry.get("reference") != reference:
            return None
        env = dict(base.env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (entry["pythonpath"],
                                                        env.get("PYTHONPATH")) if p)
        return Image(base.entrypoint, base.cmd, tuple(sorted(env.items())), base.user,
                     base.files)


def _key(reference: str) -> str:
    return hashlib.sha256(reference.encode()).hexdigest()[:20]


def load(folder: Path, reference: str, base: str, layer: Path) -> Path:
    """Hold image ``reference`` in the node's ``folder``: the known image ``base`` with a
    copy of ``layer`` (a folder of Python packages) first on its ``PYTHONPATH``, readable
    by any user, as an image's files are. Returns where the layer lies."""
    key = _key(reference)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / key
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(layer, target)
    for path in [target, *target.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    folder.chmod(0o755)
    entry = {"reference": reference, "from": base, "pythonpath": str(target)}
    tmp = folder / f".{key}.json"
    tmp.write_text(json.dumps(entry))
    tmp.replace(folder / f"{key}.json")  # whole, or not at all: a pod may be starting
    return target


def dockerfile_image(path: Path) -> Image:
    """ENTRYPOINT, CMD, ENV and USER of the last stage of a Dockerfile of ours."""
    import dockerfile  # the official parser (moby/buildkit's), a test dependency

    stage: list[dockerfile.Command] = []
    for command in dockerfile.parse_file(str(path)):
        if command.cmd.lower() == "from":
            stage = []
        stage.append(command)
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: dict[str, str] = {}
    user = None
    for command in stage:
        name = command.cmd.lower()
        if name == "entrypoint":
            entrypoint = command.value if command.json else ("/bin/sh", "-c", *command.value)
        elif name == "cmd":
            cmd = command.value if command.json else ("/bin/sh", "-c", *command.value)
        elif name == "env":
            pairs = command.value
            env.update({pairs[i]: pairs[i + 1] for i in range(0, len(pairs) - 1, 2)})
        elif name == "user":
            user = command.value[0]
    # The image's Python is this checkout's; its HOME a folder of the pod's own (the image's
    # would be a path of the image's file system, which is this machine's here).
    env.pop("HOME", None)
    env["PATH"] = os.pathsep.join([str(VENV_BIN), "/usr/local/sbin", "/usr/local/bin",
                                   "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
    return Image(tuple(entrypoint), tuple(cmd), tuple(sorted(env.items())), user)


GO_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def cluster_images(binaries: dict[str, Path], aliases: dict[str, str] | None = None) -> Images:
    """Our two images and the Kubeflow controllers', with the programs built here; each
    alias (a repository -> a known image's reference) names one of them again, as a node
    holds an image loaded under the name a user's manifest pulls (``kind load``)."""
    operator = dockerfile_image(REPO / "images" / "operator" / "Dockerfile")
    worker = dockerfile_image(REPO / "images" / "worker" / "Dockerfile")

    def manager(program: str) -> Image:
        # distroless images: ENTRYPOINT ["/manager"], USER 65532:65532.
        return Image(("/manager",), (), (("PATH", GO_PATH),), "65532:65532",
                     (("/manager", str(binaries[program])),))

    images = Images({
        "*resumequal-operator": operator,
        "*resumequal-worker": worker,
        "ghcr.io/kubeflow/training-v1/training-operator": manager("training-operator"),
        "ghcr.io/kubeflow/trainer/trainer-controller-manager":
            manager("trainer-controller-manager"),
        "*/jobset/jobset": manager("jobset-controller-manager"),
    })
    for repository, known in (aliases or {}).items():
        image = images.find(known)
        if image is None:
            raise ValueError(f"image alias {repository}={known}: {known} is not an image of "
                             "this node")
        images.known[repository] = image
    return images


def describe(image: Image) -> str:
    """One line for a log: what the image runs."""
    return shlex.join([*image.entrypoint, *image.cmd])
