"""resumequal bisect end to end: real probe venvs from local wheels, real qualifications.

The stack (tests/integration/bisect_stack.py) is this environment's packages, alike in
every pin, plus eight packages of our own that change from 1.0 to 2.0: a data source whose
2.0 stops saving its cursor's position, and seven harmless ones, one of which (alpha 2.0)
needs another (golf 2.0), so that some mixes are ones the resolver refuses. Probe venvs
take the shared packages from this environment (``--base-env``, checked to hold each at
its pinned version) and install ours from a local find-links folder, with no index. The
venv cache is shared by the tests of this module, as by a user's bisections.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from resumequal.bisect.bisection import _one_version
from resumequal.bisect.envs import Built, Environments
from resumequal.bisect.pins import diff, mix, parse_freeze, read_pins, shared
from tests.integration.bisect_stack import (
    BESIDE_PAIR,
    CURSOR,
    HARMLESS,
    PAIR,
    base_pins,
    build_wheels,
    pin_file,
    wheel,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

SCHEMA = Path(__file__).resolve().parents[2] / "docs/reference/bisect.schema.json"
# The smallest qualification that still resumes mid-accumulation: 8 steps, cut at step 6,
# resumed from step 4; the forked launcher (the data source's bug is no process's doing).
SPEC = """\
workload:
  name: rqb_cursor.workload:build
controls:
  enabled: false
world:
  launcher: forked
training:
  steps: 8
"""


@dataclass(frozen=True)
class Stack:
    root: Path
    wheels: Path
    base: list[str]
    spec: Path
    cache: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Stack:
    root = tmp_path_factory.mktemp("bisect")
    spec = root / "spec.yaml"
    spec.write_text(SPEC)
    return Stack(root, build_wheels(root / "wheels"),
                 base_pins(Path(sysconfig.get_paths()["purelib"])), spec, root / "cache")


def _bisect(stack: Stack, out: Path, *args: str, timeout: float = 400
            ) -> tuple[int, dict[str, Any], str]:
    env = dict(os.environ, PIP_FIND_LINKS=str(stack.wheels), PIP_NO_INDEX="1", COLUMNS="120")
    cmd = [sys.executable, "-m", "resumequal", "bisect", "--spec", str(stack.spec),
           "--base-env", sys.prefix, "--cache-dir", str(stack.cache), "--out", str(out), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)
    text = proc.stdout + proc.stderr
    assert (out / "bisect.json").exists(), text[-4000:]
    result = json.loads((out / "bisect.json").read_text())
    jsonschema.validate(result, json.loads(SCHEMA.read_text()))
    return proc.returncode, result, text


def _report(name: str, result: dict[str, Any]) -> None:
    """The figures the feature's note quotes, on the test's output (pytest -s)."""
    builds = [p["env"]["build_seconds"] for p in result["probes"] if not p["env"]["reused"]]
    sys.stdout.write(f"\n{name}: {len(result['probes'])} probes, {result['qualifications']} "
                     f"qualifications, {result['unresolvable']} unresolvable, "
                     f"{result['seconds']:.0f} s; venv builds {builds} s\n")


def test_bisect_names_the_data_source_among_seven_other_changes(stack: Stack) -> None:
    good = pin_file(stack.root / "good.txt", stack.base, {n: "1.0" for n in (CURSOR, *HARMLESS)})
    bad = pin_file(stack.root / "bad.txt", stack.base, {n: "2.0" for n in (CURSOR, *HARMLESS)})
    code, result, out = _bisect(stack, stack.root / "changes", "--good", str(good),
                                "--bad", str(bad))
    _report("changes", result)
    assert (code, result["conclusion"], result["decided"]) == (0, "flip", True), out[-3000:]
    assert [c["label"] for c in result["culprits"]] == ["rqb-cursor 1.0 → 2.0"]
    assert len(result["changes"]) == 8
    probes = result["probes"]
    good_end, bad_end = probes[0]["attempts"][0], probes[1]["attempts"][0]
    assert (good_end["result"], bad_end["result"]) == ("PASS", "FAIL")
    assert (bad_end["first_divergence"]["step"], bad_end["first_divergence"]["boundary"]) == (
        5, "inputs")  # resumed from step 4 at the start of the epoch
    # Every probe, refusals included, within 2·log2(n)+2 for n = 8 changes.
    assert len(probes) <= 2 * math.log2(8) + 2
    refused = [p for p in probes if p["status"] == "unresolvable"]
    assert refused, "the alpha-without-golf mixes are refused by the resolver"
    for probe in refused:
        assert "rqb-alpha" in probe["applied"] and "rqb-golf" not in probe["applied"]
        assert "rqb-golf" in probe["why"] and probe["outcome"] == "unresolved"
        assert probe["attempts"] == []  # no qualification ran
    assert "FLIP" in out and "rqb-cursor 1.0 → 2.0" in out and "probe 3 of ≤ 32" in out
    page = (stack.root / "changes" / "bisect.html").read_text()
    assert "<svg" in page and "rqb-cursor 1.0 → 2.0" in page


def test_ordered_bisection_finds_the_first_of_8_pins_to_flip_in_4_qualifications(
        stack: Stack) -> None:
    # Night i: golf upgraded from night 1, alpha (which needs golf 2.0) on night 7 only;
    # the data source from night 5.
    pins = []
    for night in range(8):
        versions = {name: "2.0" if night >= 7 - j else "1.0" for j, name in enumerate(HARMLESS)}
        versions[CURSOR] = "2.0" if night >= 5 else "1.0"
        pins.append(pin_file(stack.root / f"night-{night}.txt", stack.base, versions))
    started = time.monotonic()
    code, result, out = _bisect(stack, stack.root / "ordered", "--ordered", "--assume-bad",
                                *map(str, pins))
    _report("ordered", result)
    assert (code, result["conclusion"]) == (0, "flip"), out[-3000:]
    assert result["first_flip"]["index"] == 5
    assert result["first_flip"]["path"].endswith("night-5.txt")
    # The first pin confirmed (PASS), the last assumed to flip, three probes between.
    assert result["assumed"] == ["bad"] and result["probes"][0]["role"] == "good"
    assert result["qualifications"] <= 4
    assert "rqb-cursor 1.0 → 2.0" in [c["label"] for c in result["culprits"]]
    # Night 0 is the first test's good pin: its venv, kept in the cache, is found again
    # without a build.
    read = [read_pins(p) for p in pins]
    common = shared(read)
    envs = Environments(stack.cache, common, (), Path(sys.prefix))
    night0 = [r for r in read[0].packages.values() if r not in set(common)]
    found = envs.probe_env(night0)
    assert found.reused and found.seconds < 1, found
    assert time.monotonic() - started < 300


def test_a_pair_that_flips_only_together_is_named_as_the_pair(stack: Stack) -> None:
    # Both ends assumed (the good PASS, the bad flip: the first test qualified such ends):
    # three qualifications, {hotel, india} then each alone.
    pins = [pin_file(stack.root / f"pair-{version}.txt", stack.base,
                     {CURSOR: "1.0", **{n: version for n in (*PAIR, BESIDE_PAIR)}})
            for version in ("1.0", "2.0")]
    code, result, out = _bisect(stack, stack.root / "pair", "--good", str(pins[0]),
                                "--bad", str(pins[1]), "--assume-good", "--assume-bad")
    _report("pair", result)
    assert (code, result["conclusion"], result["decided"]) == (0, "flip", True), out[-3000:]
    assert [c["label"] for c in result["culprits"]] == ["rqb-hotel 1.0 → 2.0",
                                                        "rqb-india 1.0 → 2.0"]
    assert "(only together)" in result["summary"]
    alone = {tuple(p["applied"]): p["outcome"] for p in result["probes"]}
    assert alone[("rqb-hotel",)] == alone[("rqb-india",)] == "same"
    assert result["qualifications"] == 3


def test_a_left_out_package_pulled_in_comes_at_its_pins_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real pip: as torch 2.13 pulls in cuda-pathfinder (only the new pin holds it) and
    setuptools (no freeze names it), rqt-app 2.0 pulls in rqt-helper and rqt-tool."""
    links = tmp_path / "wheels"
    links.mkdir()
    wheel(links, "rqt-app", "1.0", {"rqt_app/__init__.py": ""})
    wheel(links, "rqt-app", "2.0", {"rqt_app/__init__.py": ""}, ["rqt-helper>=1.0", "rqt-tool"])
    for version in ("1.0", "2.0"):
        wheel(links, "rqt-helper", version, {"rqt_helper/__init__.py": ""})
    wheel(links, "rqt-tool", "3.0", {"rqt_tool/__init__.py": ""})
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    base = [line for line in base_pins(Path(sysconfig.get_paths()["purelib"]))
            if line.split("==")[0].lower() in ("numpy", "pyyaml")]
    good = parse_freeze("\n".join([*base, "rqt-app==1.0"]), "old.txt")
    bad = parse_freeze("\n".join([*base, "rqt-app==2.0", "rqt-helper==1.0"]), "new.txt")
    common, changes = diff(good, bad)
    envs = Environments(tmp_path / "cache", common, (), Path(sys.prefix),
                        known=_one_version([good, bad]))
    app2 = [c.bad for c in changes if c.name == "rqt-app" and c.bad]
    built = envs.probe_env(app2)  # rqt-helper left out: the index's newest is 2.0
    assert isinstance(built, Built) and not built.problems, built
    assert built.pulled_in == ("rqt-helper==1.0", "rqt-tool==3.0")
    whole = envs.probe_env(mix(changes, range(len(changes))))
    assert isinstance(whole, Built) and whole.pulled_in == ("rqt-tool==3.0",)
