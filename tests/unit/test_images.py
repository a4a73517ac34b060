"""The Dockerfiles, read with the official parser: pinned bases, non-root, no secrets in
layers, a build context that keeps credentials out, and an operator image without torch."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import dockerfile  # type: ignore[import-not-found]  # compiled, no stubs
import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ("operator", "worker")
SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
CREDENTIAL_FILE = re.compile(
    r"(^|/)(\.env(\..*)?|.*\.pem|.*\.key|.*\.p12|id_rsa.*|id_ed25519.*|\.aws|\.kube|"
    r"\.netrc|\.docker|credentials|kubeconfig.*)$"
)


def _commands(image: str) -> tuple[dockerfile.Command, ...]:
    cmds: tuple[dockerfile.Command, ...] = dockerfile.parse_file(
        str(ROOT / "images" / image / "Dockerfile")
    )
    return cmds


def _stages(cmds: tuple[dockerfile.Command, ...]) -> list[list[dockerfile.Command]]:
    stages: list[list[dockerfile.Command]] = []
    for c in cmds:
        if c.cmd == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(c)
    return stages


def _global_args(cmds: tuple[dockerfile.Command, ...]) -> dict[str, str]:
    """ARG defaults declared before the first FROM (the only ones FROM may use)."""
    args: dict[str, str] = {}
    for c in cmds:
        if c.cmd == "FROM":
            break
        if c.cmd == "ARG":
            name, _, default = c.value[0].partition("=")
            args[name] = default.strip('"')
    return args


def _pinned(ref: str) -> bool:
    """An explicit, exact version tag (x.y.z-style) or a sha256 digest; never latest."""
    if re.search(r"@sha256:[0-9a-f]{64}$", ref):
        return True
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag or tag == "latest":
        return False
    return re.search(r"\d+\.\d+\.\d+", tag) is not None


@pytest.mark.parametrize("image", IMAGES)
def test_every_base_is_pinned(image: str) -> None:
    cmds = _commands(image)
    args = _global_args(cmds)
    stage_names: set[str] = set()
    for c in cmds:
        if c.cmd != "FROM":
            continue
        ref = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), ""), c.value[0])
        if ref not in stage_names:
            assert _pinned(ref), f"{image}: FROM {c.value[0]} (= {ref!r}) is not pinned"
        if len(c.value) == 3 and c.value[1].upper() == "AS":
            stage_names.add(c.value[2])


@pytest.mark.parametrize("image", IMAGES)
def test_the_python_base_is_a_build_argument(image: str) -> None:
    # Where no registry is reachable, tools/images.py passes a base of its own making.
    cmds = _commands(image)
    assert _global_args(cmds)["PYTHON_IMAGE"] == "python:3.11.11-slim-bookworm"
    froms = [c.value[0] for c in cmds if c.cmd == "FROM"]
    assert froms[0] == "${PYTHON_IMAGE}"
    # The operator runs on it too; the worker's final stage is the stack under qualification.
    assert froms[-1] == ("${PYTHON_IMAGE}" if image == "operator" else "${BASE_IMAGE}")
    assert not any("python:" in ref for ref in froms), "a Python base hard-coded in FROM"


@pytest.mark.parametrize(
    ("ref", "pinned"),
    [
        ("python:3.11.11-slim-bookworm", True),
        ("python@sha256:" + "a" * 64, True),
        ("python:3.11-slim", False),
        ("python:latest", False),
        ("python", False),
        ("registry:5000/python", False),
    ],
)
def test_the_pin_check_itself(ref: str, pinned: bool) -> None:
    assert _pinned(ref) is pinned


@pytest.mark.parametrize("image", IMAGES)
def test_the_final_stage_runs_unprivileged(image: str) -> None:
    final = _stages(_commands(image))[-1]
    users = [c.value[0] for c in final if c.cmd == "USER"]
    assert users, f"{image}: the final stage sets no USER (it would run as root)"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}, f"{image}: runs as {users[-1]}"
    # The chart's securityContext says runAsUser 65532; the image agrees.
    assert user == "65532"


@pytest.mark.parametrize("image", IMAGES)
def test_no_secrets_in_layers(image: str) -> None:
    for c in _commands(image):
        if c.cmd in {"ENV", "ARG"}:
            names = c.value[::2] if c.cmd == "ENV" else [v.partition("=")[0] for v in c.value]
            values = c.value[1::2] if c.cmd == "ENV" else [v.partition("=")[2] for v in c.value]
            for name, value in zip(names, values, strict=True):
                assert not (SECRET_NAME.search(name) and value), (
                    f"{image} line {c.start_line}: {c.cmd} {name} carries a value"
                )
        if c.cmd in {"COPY", "ADD"}:
            sources = [v for v in c.value[:-1] if not v.startswith("--")]
            for src in sources:
                assert not CREDENTIAL_FILE.search(src.rstrip("/")), (
                    f"{image} line {c.start_line}: copies {src}"
                )
                assert "://" not in src, f"{image} line {c.start_line}: ADD from a URL"


def test_entrypoints() -> None:
    op = _stages(_commands("operator"))[-1]
    assert [c.value for c in op if c.cmd == "ENTRYPOINT"] == [("resumequal-operator",)]
    worker = _stages(_commands("worker"))[-1]
    assert [c.value for c in worker if c.cmd == "ENTRYPOINT"] == [("resumequal",)]
    # The operator starts legs as `torchrun -m resumequal leg ...`: the image must have both.
    run = " ".join(" ".join(c.value) for c in worker if c.cmd == "RUN")
    assert "command -v torchrun" in run and "resumequal --help" in run


def test_worker_keeps_the_torch_under_qualification() -> None:
    cmds = _commands("worker")
    args = {c.value[0].partition("=")[0] for c in cmds if c.cmd == "ARG"}
    assert {"BASE_IMAGE", "TORCH_VERSION", "TORCH_INDEX_URL"} <= args
    run = " ".join(" ".join(c.value) for c in _stages(cmds)[-1] if c.cmd == "RUN")
    assert "--constraint /tmp/torch-constraint.txt" in run


def _requirement_name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower().replace("_", "-")


def test_operator_image_installs_the_torch_free_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {
        r
        for r in project["dependencies"] + project["optional-dependencies"]["operator"]
        if _requirement_name(r) not in {"torch", "numpy"}
    }
    lines = (ROOT / "images/operator/requirements.txt").read_text().splitlines()
    listed = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    assert listed == wanted
    run = " ".join(" ".join(c.value) for c in _commands("operator") if c.cmd == "RUN")
    assert "install --no-deps /tmp/wheels/resumequal-" in run
    assert "torch" not in {_requirement_name(r) for r in listed}


def _ignored(patterns: list[str], path: str) -> bool:
    """Docker's .dockerignore rule: the last pattern matching the path or a parent wins."""

    def regex(pattern: str) -> re.Pattern[str]:
        out = ""
        for part in re.split(r"(\*\*/?|\*|\?)", pattern.strip("/")):
            if part in {"**", "**/"}:
                out += "(.*/)?" if part == "**/" else ".*"
            elif part == "*":
                out += "[^/]*"
            elif part == "?":
                out += "[^/]"
            else:
                out += re.escape(part)
        return re.compile(out + "$")

    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = regex(raw[1:] if negate else raw)
        if any(pattern.match(p) for p in prefixes):
            ignored = not negate
    return ignored


@pytest.mark.parametrize(
    ("path", "ignored"),
    [
        ("pyproject.toml", False),
        ("README.md", False),
        ("service/resumequal/cli.py", False),
        ("operator/resumequal_operator/main.py", False),
        ("images/operator/requirements.txt", False),
        (".env", True),
        (".env.production", True),
        ("service/resumequal/.env", True),
        ("tls.pem", True),
        ("operator/certs/server.pem", True),
        (".venv/bin/python", True),
        ("runs/q1/report.json", True),
        ("service/resumequal/__pycache__/cli.cpython-311.pyc", True),
        (".aws/credentials", True),
        (".git/config", True),
        ("tests/unit/test_cli.py", True),
    ],
)
def test_dockerignore_keeps_credentials_and_clutter_out(path: str, ignored: bool) -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert _ignored(patterns, path) is ignored, path


@pytest.mark.parametrize("image", IMAGES)
def test_build_context_holds_what_the_images_copy(image: str) -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    for c in _commands(image):
        if c.cmd == "COPY" and not any(f.startswith("--from") for f in c.flags):
            for src in c.value[:-1]:
                assert (ROOT / src).exists(), f"{image}: COPY {src}: no such path"
                assert not _ignored(patterns, src.rstrip("/")), f"{image}: {src} is ignored"
