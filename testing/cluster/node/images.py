"""The images the node agent can run, and what each is: its entrypoint, command, user and
environment, with the programs it holds found on this machine.

No container runtime runs here, so an image is not unpacked: each known image is this
machine's file system plus its configuration, read from where it is defined —
``images/*/Dockerfile`` for resumequal's own (parsed with the official Dockerfile parser:
ENTRYPOINT, CMD, ENV, USER), the upstream Dockerfiles' ``ENTRYPOINT ["/manager"]`` for
the Kubeflow controllers, whose ``/manager`` is the program built from the same release.
A pod naming any other image waits with ``ErrImagePull``, as a node that cannot pull it.
The Python programs run from this checkout's environment (its ``bin`` first on PATH).
"""

from __future__ import annotations

import fnmatch
import os
import shlex
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
    """Known images by repository glob (tag and digest ignored: one build each)."""

    known: dict[str, Image] = field(default_factory=dict)

    def find(self, reference: str) -> Image | None:
        return by_repository(self.known, reference)


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
