"""tools/images.py, the parts that need no podman: how the torch wheels are fetched and kept,
which apt sources and CAs the Python base takes, the engine config, the cache keys. `make images`
runs the rest (the builds and the smoke tests) for real."""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHEEL = "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("images_tool", ROOT / "tools/images.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def test_the_download_is_for_the_bases_python_and_glibc_not_the_hosts(tool: ModuleType) -> None:
    cmd = tool.download_command("2.13.0", "x86_64", Path("/d"))
    assert cmd[1:4] == ["-m", "pip", "download"]
    pairs = dict(itertools.pairwise(cmd))
    assert pairs["--python-version"] == "3.11" and pairs["--abi"] == "cp311"
    assert pairs["--implementation"] == "cp" and pairs["--dest"] == "/d"
    platforms = [b for a, b in itertools.pairwise(cmd) if a == "--platform"]
    # Up to bookworm's glibc, down to the oldest, with the legacy names some wheels carry
    # alone (nvidia_cusparselt: manylinux2014 only), and plain linux.
    assert platforms[:2] == ["manylinux_2_36_x86_64", "manylinux_2_35_x86_64"]
    assert "manylinux_2_5_x86_64" in platforms and "manylinux_2_37_x86_64" not in platforms
    assert platforms[-4:] == ["manylinux2014_x86_64", "manylinux2010_x86_64",
                              "manylinux1_x86_64", "linux_x86_64"]
    assert "--only-binary=:all:" in cmd and cmd[-1] == "torch==2.13.0"
    # No index or find-links of our own: pip's configuration decides where wheels come from.
    assert not any(a.startswith(("--index", "--find-links", "--extra-index")) for a in cmd)


def _fake_download(tool: ModuleType, monkeypatch: pytest.MonkeyPatch,
                   names: list[str]) -> list[list[str]]:
    calls: list[list[str]] = []

    def run(cmd: list[str], env: object = None) -> None:
        calls.append(cmd)
        dest = Path(cmd[cmd.index("--dest") + 1])
        for i, name in enumerate(names):
            (dest / name).write_bytes(b"x" * (i + 1))

    monkeypatch.setattr(tool, "_run", run)
    return calls


def test_wheels_are_downloaded_once_and_kept_while_the_pin_holds(
    tool: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tool, "WHEELS", tmp_path)
    calls = _fake_download(tool, monkeypatch, [WHEEL, "nvidia_nccl_cu13-2.29.7-py3-none.whl"])
    note: list[str] = []
    folder, wheels = tool.torch_wheels("2.13.0", "x86_64", note)
    assert folder == tmp_path / "torch-2.13.0-cp311-x86_64" and len(calls) == 1
    assert wheels == {WHEEL: 1, "nvidia_nccl_cu13-2.29.7-py3-none.whl": 2}
    assert "downloaded 2 wheels" in note[0]
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]  # no download- folder left
    again: list[str] = []
    assert tool.torch_wheels("2.13.0", "x86_64", again) == (folder, wheels)
    assert len(calls) == 1 and again == ["(wheels kept)"]
    # A wheel that is not what the finished download left is fetched again.
    (folder / WHEEL).write_bytes(b"truncated?")
    tool.torch_wheels("2.13.0", "x86_64", [])
    assert len(calls) == 2 and (folder / WHEEL).read_bytes() == b"x"


def test_a_download_without_torch_or_cut_short_keeps_nothing(
    tool: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tool, "WHEELS", tmp_path)
    _fake_download(tool, monkeypatch, ["numpy-2.0-cp311.whl"])
    with pytest.raises(tool.ImageBuildError, match=r"torch==2\.13\.0 left no torch wheel"):
        tool.torch_wheels("2.13.0", "x86_64", [])

    def fails(cmd: list[str], env: object = None) -> None:
        (Path(cmd[cmd.index("--dest") + 1]) / WHEEL).write_bytes(b"part")
        raise tool.ImageBuildError("pip download failed")

    monkeypatch.setattr(tool, "_run", fails)
    with pytest.raises(tool.ImageBuildError, match="pip download failed"):
        tool.torch_wheels("2.13.0", "x86_64", [])
    assert list(tmp_path.iterdir()) == []
    assert tool.read_wheel_list(tmp_path / "torch-2.13.0-cp311-x86_64") is None


def test_the_base_uses_the_hosts_sources_for_its_suite(tool: ModuleType, tmp_path: Path) -> None:
    deb822 = tmp_path / "debian.sources"
    deb822.write_text("Types: deb\n# http://snapshot.debian.org/archive/debian/2025\n"
                      "URIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\n")
    one_line = tmp_path / "security.list"
    one_line.write_text("deb http://deb.debian.org/debian-security bookworm-security main\n"
                        "deb http://deb.debian.org/debian bookworm main\n")
    third_party = tmp_path / "nodesource.sources"
    third_party.write_text("URIs: https://deb.nodesource.com/node_20.x\nSuites: nodistro\n")
    commented = tmp_path / "old.list"
    commented.write_text("# deb http://deb.debian.org/debian bookworm main\n")
    files = [deb822, one_line, third_party, commented, tmp_path / "absent.list"]
    assert tool.apt_sources("bookworm", files) == [deb822, one_line]


def test_host_cas_are_installed_in_the_base_only_when_there_are_some(
    tool: ModuleType,
) -> None:
    with_ca = tool.mmdebstrap_args([Path("/usr/local/share/ca-certificates/proxy.crt")])
    assert any("proxy.crt" in a for a in with_ca)
    assert '--customize-hook=chroot "$1" update-ca-certificates' in with_ca
    without = tool.mmdebstrap_args([])
    assert not any("update-ca-certificates" in a for a in without)
    # Both give `python` with pip, and pip trusting the system bundle.
    for args in (with_ca, without):
        assert f'--customize-hook=chroot "$1" python3 -m venv {tool.VENV}' in args
        assert any(tool.SYSTEM_BUNDLE in a and "/etc/pip.conf" in a for a in args)
        assert "--include=python3,python3-venv,ca-certificates" in args


def test_the_base_key_follows_its_inputs(tool: ModuleType) -> None:
    inputs = {"sources": ["deb http://a bookworm main"], "ca": {"x.crt": "A"}}
    key = tool.inputs_key(inputs)
    assert key == tool.inputs_key(dict(reversed(inputs.items())))
    assert key != tool.inputs_key({**inputs, "ca": {"x.crt": "B"}})
    assert key != tool.inputs_key({**inputs, "sources": ["deb http://b bookworm main"]})
    changes = tool.import_changes(key)
    assert f"LABEL={tool.PYTHON_INPUTS_LABEL}={key}" in changes
    assert f"LABEL={tool.OWNER_LABEL}={tool.SUITE}" in changes
    assert any(c.startswith(f"ENV=PATH={tool.VENV}/bin:") for c in changes)


def test_the_engine_config_stays_under_the_limits_and_uses_runc(tool: ModuleType) -> None:
    conf = tomllib.loads(tool.containers_conf(20000, 32768))
    assert conf["containers"]["default_ulimits"] == ["nofile=20000:20000", "nproc=32768:32768"]
    assert conf["engine"]["runtime"] == "runc"


def test_builds_never_pull(tool: ModuleType) -> None:
    assert "--pull=never" in tool.BUILD_FLAGS


@pytest.mark.parametrize(("spec", "version"), [("torch==2.13.0", "2.13.0"), ("2.9.1", "2.9.1")])
def test_the_torch_option_takes_the_makefiles_spec(
    tool: ModuleType, spec: str, version: str
) -> None:
    assert tool._torch_version(spec) == version


@pytest.mark.parametrize("argv", [["push"], ["build", "--torch", "torch>=2.4"],
                                  ["deploy"], ["build", "--registry", "r.example"]])
def test_bad_arguments_exit_2(tool: ModuleType, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        tool.main(argv)
    assert exc.value.code == 2


def test_phase_timings_add_up(tool: ModuleType) -> None:
    phases = tool.Phases()
    with phases.phase("python base") as note:
        note.append("(cached)")
    with pytest.raises(RuntimeError), phases.phase("worker image"):
        raise RuntimeError("a failed phase is timed too")
    lines = phases.summary().splitlines()
    assert [line.split()[0] for line in lines] == ["python", "worker", "total"]
    assert lines[0].endswith("(cached)")


# -- pushing ------------------------------------------------------------------------------


def test_push_tags_both_images_into_the_registry_and_pushes_them(tool: ModuleType) -> None:
    commands = tool.push_commands("registry.example.com:5000/ml/", "0.1.0", True)
    operator = "registry.example.com:5000/ml/resumequal-operator:0.1.0"
    worker = "registry.example.com:5000/ml/resumequal-worker:0.1.0"
    assert commands == [
        ["podman", "tag", tool.OPERATOR_IMAGE, operator],
        ["podman", "push", "--tls-verify=true", operator],
        ["podman", "tag", tool.WORKER_IMAGE, worker],
        ["podman", "push", "--tls-verify=true", worker],
    ]
    insecure = tool.push_commands("localhost:5000", "dev-1", False)
    assert insecure[1] == ["podman", "push", "--tls-verify=false",
                           "localhost:5000/resumequal-operator:dev-1"]


def test_the_helm_values_name_the_operator_image_as_pushed(tool: ModuleType) -> None:
    assert tool.helm_values("ghcr.io/acme", "0.1.0") == [
        "--set", "image.repository=ghcr.io/acme/resumequal-operator",
        "--set", "image.tag=0.1.0"]


def test_the_default_tag_is_the_version_the_chart_runs(tool: ModuleType) -> None:
    chart = (ROOT / "charts/resumequal/Chart.yaml").read_text()
    assert f'appVersion: "{tool.project_version()}"' in chart


@pytest.mark.parametrize(("value", "verify"), [(None, True), ("true", True), ("1", True),
                                              ("false", False), ("0", False), ("No", False)])
def test_tls_verification_is_on_unless_turned_off(
    tool: ModuleType, value: str | None, verify: bool
) -> None:
    env = {} if value is None else {tool.TLS_VERIFY_ENV: value}
    assert tool.tls_verify(env) is verify


@pytest.mark.parametrize(("registry", "tag", "named"), [
    ("https://registry.example.com", "0.1.0", "registry 'https://registry.example.com'"),
    ("Registry.Example.com/ml", "0.1.0", "registry 'Registry.Example.com/ml'"),
    ("registry.example.com/ml:latest", "0.1.0", "registry 'registry.example.com/ml:latest'"),
    ("", "0.1.0", "registry ''"),
    ("registry.example.com", "-bad", "tag '-bad'"),
    ("registry.example.com", "a" * 129, "tag 'aaa"),
])
def test_bad_registries_and_tags_are_refused_naming_them(
    tool: ModuleType, registry: str, tag: str, named: str
) -> None:
    with pytest.raises(tool.ImageBuildError, match=re.escape(named)):
        tool.push_commands(registry, tag, True)


def test_a_tls_setting_that_is_not_a_boolean_is_refused(tool: ModuleType) -> None:
    with pytest.raises(tool.ImageBuildError, match=f"{tool.TLS_VERIFY_ENV}='maybe'"):
        tool.tls_verify({tool.TLS_VERIFY_ENV: "maybe"})


def test_a_bad_registry_is_refused_before_anything_is_built(
    tool: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    def build(*args: object) -> None:
        raise AssertionError("built with a registry it could not push to")

    monkeypatch.setattr(tool, "build", build)
    assert tool.main(["all", "--registry", "https://registry.example.com"]) == 1
