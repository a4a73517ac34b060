"""resumequal bisect's pure parts: pin files, their differences, the two searches, and the
bisection around them with environments and qualifications stood in for."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from resumequal import cli
from resumequal.bisect import bisection, envs, runner, search
from resumequal.bisect.bisection import BisectOptions
from resumequal.bisect.envs import Built, Refused
from resumequal.bisect.pins import (
    PinError,
    Requirement,
    diff,
    layer,
    mix,
    parse_freeze,
    parse_pylock,
    read_pins,
    shared,
)
from resumequal.bisect.probe import Qualified
from resumequal.bisect.search import Outcome, ddmin, first_flip
from resumequal.results.verdict import Cut, Divergence, Result, Verdict

SCHEMA = Path(__file__).resolve().parents[2] / "docs/reference/bisect.schema.json"

FREEZE = """\
# a comment
--extra-index-url https://example.org/simple
Torch==2.13.0
numpy==2.1.0  # trailing comment
my_pkg.Sub @ file:///wheels/my_pkg_sub-1.0-py3-none-any.whl
hashed==1.0 \\
    --hash=sha256:abc
-e git+https://example.org/resumequal.git@abc#egg=resumequal
resumequal==0.1.0
"""


# -- pin files ----------------------------------------------------------------------------

def test_a_freeze_becomes_exact_requirements_by_canonical_name() -> None:
    pins = parse_freeze(FREEZE, "a.txt")
    assert pins.options == ("--extra-index-url https://example.org/simple",)
    assert {n: (r.version, r.line) for n, r in pins.packages.items()} == {
        "torch": ("2.13.0", "Torch==2.13.0"),
        "numpy": ("2.1.0", "numpy==2.1.0"),
        "my-pkg-sub": ("file:///wheels/my_pkg_sub-1.0-py3-none-any.whl",
                       "my_pkg.Sub @ file:///wheels/my_pkg_sub-1.0-py3-none-any.whl"),
        "hashed": ("1.0", "hashed==1.0"),
    }  # resumequal itself is never pinned: every probe runs the bisecting one


@pytest.mark.parametrize(("text", "says"), [
    ("torch>=2.6\n", "a.txt:1: 'torch>=2.6' is not an exact pin"),
    ("numpy==1\nnumpy==2\n", "a.txt:2: numpy is pinned twice"),
    ("-r other.txt\n", "a.txt:1: -r is not supported"),
    ("-e ./mypkg\n", "an editable install has no version to pin"),
])
def test_what_is_no_exact_pin_is_refused_naming_file_and_line(text: str, says: str) -> None:
    with pytest.raises(PinError, match=None) as caught:
        parse_freeze(text, "a.txt")
    assert says in str(caught.value)


def test_a_pylock_becomes_name_equals_version() -> None:
    pins = parse_pylock('lock-version = "1.0"\n[[packages]]\nname = "NumPy"\n'
                        'version = "2.1.0"\n[[packages]]\nname = "x"\nversion = "1"\n'
                        'marker = "sys_platform == \'linux\'"\n', "pylock.toml")
    assert [r.line for r in pins.packages.values()] == [
        "NumPy==2.1.0", "x==1 ; sys_platform == 'linux'"]
    with pytest.raises(PinError, match="needs a name and a version"):
        parse_pylock('[[packages]]\nname = "y"\n', "pylock.toml")


def test_read_pins_tells_the_formats_by_name(tmp_path: Path) -> None:
    (tmp_path / "pylock.toml").write_text('[[packages]]\nname = "a"\nversion = "1"\n')
    (tmp_path / "freeze.txt").write_text("a==2\n")
    (tmp_path / "uv.lock").write_text("")
    assert read_pins(tmp_path / "pylock.toml").packages["a"].version == "1"
    assert read_pins(tmp_path / "freeze.txt").packages["a"].version == "2"
    with pytest.raises(PinError, match="uv export"):
        read_pins(tmp_path / "uv.lock")
    with pytest.raises(PinError, match="cannot read"):
        read_pins(tmp_path / "missing.txt")


def test_two_pins_differ_by_changes_and_a_mix_takes_some_of_them() -> None:
    good = parse_freeze("a==1\nb==1\nc==1\nsame==3\n", "good")
    bad = parse_freeze("a==2\nb==1\nd==1\nsame==3\n", "bad")
    common, changes = diff(good, bad)
    assert [r.line for r in common] == ["b==1", "same==3"]
    assert [c.label for c in changes] == ["a 1 → 2", "-c 1", "+d 1"]
    assert [r.line for r in mix(changes, {0, 2})] == ["a==2", "c==1", "d==1"]
    assert [r.line for r in mix(changes, ())] == ["a==1", "c==1"]
    assert shared([good, bad]) == common
    assert [r.line for r in layer(bad, set(common))] == ["a==2", "d==1"]


# -- delta debugging ----------------------------------------------------------------------

class Oracle:
    """A stand-in stack: the verdict flips when every change of one of ``flips`` is in;
    a probe holding a change of ``needs`` without what it needs is unresolved."""

    def __init__(self, flips: Iterable[set[int]], needs: dict[int, int] | None = None,
                 unresolved: Callable[[frozenset[int]], bool] = lambda s: False) -> None:
        self.flips = [frozenset(f) for f in flips]
        self.needs = needs or {}
        self.unresolved = unresolved
        self.probed: list[frozenset[int]] = []

    def __call__(self, subset: frozenset[int]) -> Outcome:
        self.probed.append(subset)
        if self.unresolved(subset) or any(
                k in subset and v not in subset for k, v in self.needs.items()):
            return Outcome.UNRESOLVED
        return Outcome.FLIP if any(f <= subset for f in self.flips) else Outcome.SAME


@pytest.mark.parametrize("n", [2, 7, 8, 16, 33])
def test_one_culprit_is_found_within_2_log2_n_plus_2_probes_with_both_ends(n: int) -> None:
    for culprit in range(n):
        oracle = Oracle([{culprit}])
        found = ddmin(n, oracle)
        assert (found.culprits, found.decided) == ((culprit,), True)
        # The two ends are the bisection's first two qualifications.
        assert len(oracle.probed) + 2 <= 2 * math.ceil(math.log2(n)) + 2, (culprit, n)


def test_a_pair_that_flips_only_together_is_named_as_a_pair() -> None:
    for pair in [(0, 7), (3, 4), (1, 2), (5, 6)]:
        found = ddmin(8, Oracle([set(pair)]))
        assert (found.culprits, found.decided) == (pair, True)


def test_unresolvable_mixes_are_never_blamed() -> None:
    # Change 0 needs change 7 (the resolver refuses 0 without 7); change 3 flips.
    oracle = Oracle([{3}], needs={0: 7})
    found = ddmin(8, oracle)
    assert (found.culprits, found.decided) == ((3,), True)
    assert any(0 in s and 7 not in s for s in oracle.probed)  # one was tried, not blamed
    assert len(oracle.probed) + 2 <= 8


def test_a_flip_that_needs_a_dependency_names_both() -> None:
    # 1 flips, but the resolver refuses 1 without 5: the smallest resolvable set is {1, 5}.
    found = ddmin(8, Oracle([{1}], needs={1: 5}))
    assert found.culprits == (1, 5)
    assert not found.decided and found.unsure == (5,)  # without 5 it never resolved


def test_cannot_decide_when_nothing_smaller_resolves() -> None:
    found = ddmin(4, Oracle([{0}], unresolved=lambda s: len(s) < 4))
    assert found.culprits == (0, 1, 2, 3) and not found.decided
    assert "never judged" in found.why


def test_a_spent_budget_stops_undecided() -> None:
    calls = []

    def probe(subset: frozenset[int]) -> Outcome:
        calls.append(subset)
        if len(calls) > 2:
            raise search.BudgetSpent
        return Outcome.SAME

    found = ddmin(8, probe)
    assert not found.decided and "budget" in found.why


@pytest.mark.parametrize("flip", range(1, 8))
def test_the_first_of_8_pins_to_flip_is_found_in_3_probes_between_known_ends(flip: int) -> None:
    probed: list[int] = []

    def probe(i: int) -> Outcome:
        probed.append(i)
        return Outcome.FLIP if i >= flip else Outcome.SAME

    assert first_flip(8, probe).index == flip
    assert len(probed) <= 3  # 4 with one end confirmed, 5 with both


def test_an_unjudged_pin_is_skipped_and_one_left_between_is_undecided() -> None:
    def probe(i: int) -> Outcome:
        return Outcome.UNRESOLVED if i == 3 else Outcome.FLIP if i >= 5 else Outcome.SAME

    assert first_flip(8, probe).index == 5  # 3 skipped, 4 and 5 decided it
    stuck = first_flip(8, lambda i: Outcome.UNRESOLVED if i == 4 else
                       Outcome.FLIP if i >= 4 else Outcome.SAME)
    assert (stuck.index, stuck.good, stuck.bad, stuck.unjudged) == (None, 3, 5, (4,))


# -- the bisection, environments and qualifications stood in for --------------------------

def _verdict(result: Result, step: int | None = None) -> Verdict:
    first = None if step is None else Divergence(step=step, boundary="inputs", rank=0,
                                                 control=1, preempted=2, before_cut=False)
    return Verdict(result=result, reason="r", cut=Cut(step=6, microstep=1, rank=1, mode="hard"),
                   resumed_from=None, first_divergence=first, exact_through_step=0, checks=[])


class FakeStack:
    """Environments and qualifications: ``verdict(packages)`` says how a probe ends;
    ``refuse(packages)`` which mixes the resolver refuses."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch,
                 verdict: Callable[[dict[str, str]], Verdict | None],
                 refuse: Callable[[dict[str, str]], bool] = lambda p: False) -> None:
        self.qualified: list[dict[str, str]] = []
        stack = self

        def probe_env(self: envs.Environments, layer: list[Requirement]) -> Built | Refused:
            packages = {r.name: r.version for r in layer}
            key = "k" + "-".join(f"{n}{v}" for n, v in sorted(packages.items()))
            if refuse(packages):
                return Refused(key, 0.1, False, "x 2 depends on y>=2")
            return Built(key, Path("/venvs") / key, 0.5, False, ())

        def qualify(python: Path, run_dir: Path, **kwargs: object) -> Qualified:
            packages = _packages(python)
            stack.qualified.append(packages)
            v = verdict(packages)
            code = 2 if v is None else 0 if v.result is Result.PASS else 1
            return Qualified.of(v, exit_code=code, seconds=1.0, where=str(run_dir),
                                error="" if v else "error: boom")

        monkeypatch.setattr(envs.Environments, "probe_env", probe_env)
        monkeypatch.setattr(runner, "qualify", qualify)


def _packages(python: Path) -> dict[str, str]:
    key = python.parent.parent.name[1:]
    return {part.rstrip("0123456789."): part[len(part.rstrip("0123456789.")):]
            for part in key.split("-") if part}


def _pins(tmp_path: Path, good: str, bad: str) -> tuple[Path, Path]:
    (tmp_path / "good.txt").write_text(good)
    (tmp_path / "bad.txt").write_text(bad)
    return tmp_path / "good.txt", tmp_path / "bad.txt"


GOOD = "torch==2.13.0\n" + "".join(f"p{c}==1\n" for c in "abcdefg")
BAD = "torch==2.13.0\n" + "".join(f"p{c}==2\n" for c in "abcdefg")


def _run(tmp_path: Path, pins: tuple[Path, ...], **kw: object) -> bisection.BisectResult:
    options = BisectOptions(pins=pins, ordered=bool(kw.pop("ordered", False)),
                            out=tmp_path / "out", cache=tmp_path / "cache", **kw)  # type: ignore[arg-type]
    return bisection.bisect(options)


def test_a_bisection_names_the_change_and_writes_json_and_html(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stack = FakeStack(monkeypatch, lambda p: _verdict(Result.FAIL, 5) if p.get("pd") == "2"
                      else _verdict(Result.PASS),
                      refuse=lambda p: p.get("pa") == "2" and p.get("pg") == "1")
    result = _run(tmp_path, _pins(tmp_path, GOOD, BAD))
    assert (result.conclusion, result.exit_code, result.decided) == ("flip", 0, True)
    assert [c.label for c in result.culprits] == ["pd 1 → 2"]
    assert result.summary == "pd 1 → 2 flips the verdict: PASS → FAIL at step 5, inputs"
    assert result.common_packages == 1 and len(result.changes) == 7
    assert [p.role for p in result.probes[:2]] == ["good", "bad"]
    refused = [p for p in result.probes if p.status == "unresolvable"]
    assert refused and all(p.outcome == "unresolved" for p in refused)
    assert result.qualifications == len(stack.qualified) == len(result.probes) - len(refused)
    written = json.loads((tmp_path / "out" / "bisect.json").read_text())
    jsonschema.validate(written, json.loads(SCHEMA.read_text()))
    page = (tmp_path / "out" / "bisect.html").read_text()
    assert "<svg" in page and "pd 1 → 2" in page and "<script" not in page


def test_no_flip_and_an_unjudged_end_have_statuses_of_their_own(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    FakeStack(monkeypatch, lambda p: _verdict(Result.PASS))
    same = _run(tmp_path, _pins(tmp_path, GOOD, BAD))
    assert (same.conclusion, same.exit_code, len(same.probes)) == ("no-flip", 5, 2)
    FakeStack(monkeypatch, lambda p: None if p.get("pa") == "2" else _verdict(Result.PASS))
    broken = _run(tmp_path, _pins(tmp_path, GOOD, BAD))
    assert (broken.conclusion, broken.exit_code) == ("undecided", 6)
    assert "the bad pin was not judged (no verdict (exit 2): error: boom)" in broken.summary


def test_an_invalid_probe_is_retried_then_left_unresolved(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stack = FakeStack(monkeypatch, lambda p: _verdict(
        Result.INVALID if p.get("pb") == "2" and p.get("pa") == "1" else
        Result.FAIL if p.get("pb") == "2" else Result.PASS, 5))
    result = _run(tmp_path, _pins(tmp_path, GOOD, BAD), retries=2)
    unjudged = [p for p in result.probes if p.status == "unjudged"]
    assert unjudged and all(len(p.attempts) == 3 for p in unjudged)
    assert result.qualifications == len(stack.qualified)
    assert result.culprits and result.conclusion in ("flip", "undecided")


def test_ordered_pins_with_the_bad_end_assumed_take_4_qualifications(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stack = FakeStack(monkeypatch, lambda p: _verdict(Result.FAIL, 5) if int(p["pa"]) >= 6
                      else _verdict(Result.PASS))
    files = []
    for i in range(8):
        files.append(tmp_path / f"night-{i}.txt")
        files[-1].write_text(f"torch==2.13.0\npa=={i + 1}\n")
    result = _run(tmp_path, tuple(files), ordered=True, assume_bad=True)
    assert result.first_flip is not None and result.first_flip.index == 5
    assert [c.label for c in result.culprits] == ["pa 5 → 6"]
    assert len(stack.qualified) == result.qualifications == 4
    assert result.assumed == ["bad"] and result.probes[0].role == "good"


@pytest.mark.parametrize("args", [
    ["bisect"], ["bisect", "--good", "a"], ["bisect", "--ordered"],
    ["bisect", "--good", "a", "--bad", "b", "--ordered", "c"], ["bisect", "x", "y"]])
def test_the_command_refuses_what_is_no_bisection(args: list[str]) -> None:
    done = CliRunner().invoke(cli.main, args)
    assert done.exit_code == 2, done.output


def test_the_command_exits_with_the_results_status(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    FakeStack(monkeypatch, lambda p: _verdict(Result.PASS))
    good, bad = _pins(tmp_path, GOOD, BAD)
    done = CliRunner().invoke(cli.main, ["bisect", "--good", str(good), "--bad", str(bad),
                                         "--out", str(tmp_path / "o"), "--cache-dir",
                                         str(tmp_path / "c")])
    assert done.exit_code == 5, done.output
    assert "NO-FLIP" in done.output and "bisect.json" in done.output
    refused = CliRunner().invoke(cli.main, ["bisect", "--good", str(good), "--bad",
                                            str(tmp_path / "none.txt")])
    assert refused.exit_code == 2 and "cannot read pin file" in refused.output


def test_the_help_lists_its_exit_statuses() -> None:
    done = CliRunner().invoke(cli.main, ["bisect", "--help"])
    assert done.exit_code == 0
    for code, words in ((0, "a flip found"), (2, "spec, pin file, manifest, kubeconfig or "
                                             "usage error"),
                        (3, "an environment could not be built"), (5, "bisect, no flip"),
                        (6, "bisect, undecided"), (70, "internal error"), (130, "interrupted")):
        assert re.search(rf"^\s+{code}  {words}", done.output, re.MULTILINE), (code, done.output)


def _site(venv: Path, **dists: str) -> Path:
    """A venv folder whose site-packages holds the metadata of ``dists`` (name=version)."""
    v = sys.version_info
    site = venv / "lib" / f"python{v[0]}.{v[1]}" / "site-packages"
    for name, version in dists.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return site


def test_a_base_env_gives_what_it_holds_and_the_probes_get_what_it_lacks(tmp_path: Path) -> None:
    site = _site(tmp_path / "base", torch="2.13.0", numpy="2.1.0")
    common = [Requirement("torch", "2.13.0", "torch==2.13.0"),
              Requirement("extra", "1.0", "extra==1.0")]
    environments = envs.Environments(tmp_path / "cache", common, (), tmp_path / "base")
    assert environments.common_site() == site
    mixed = [Requirement("pa", "2", "pa==2")]
    assert [r.line for r in environments.with_absent(mixed)] == ["pa==2", "extra==1.0"]
    environments.check_base_lacks(["pa"])
    with pytest.raises(envs.EnvBuildError, match="holds numpy, which the pins change"):
        environments.check_base_lacks(["NumPy"])
    other = envs.Environments(tmp_path / "cache", [Requirement("torch", "2.9.1", "torch==2.9.1")],
                              (), tmp_path / "base")
    with pytest.raises(envs.EnvBuildError, match=r"torch==2.9.1 \(there: 2.13.0\)"):
        other.common_site()


def test_a_venv_key_is_the_exact_requirement_set_in_any_order(tmp_path: Path) -> None:
    _site(tmp_path / "base", torch="2.13.0")
    environments = envs.Environments(tmp_path / "cache",
                                     [Requirement("torch", "2.13.0", "torch==2.13.0")], (),
                                     tmp_path / "base")
    a, b = Requirement("a", "1", "a==1"), Requirement("b", "2", "b==2")
    assert environments.key([a, b]) == environments.key([b, a])
    assert environments.key([a]) != environments.key([a, b])
    assert environments.key([a]) != environments.key([Requirement("a", "2", "a==2")])



def test_a_mix_is_held_to_the_pins_versions_of_what_it_leaves_out_and_says_what_pip_added(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # pip stood in: it "installs" the layer and what the layer's first package needs
    # (rqt-helper, rqt-tool), each at the version the constraints give, else 3.0.
    _site(tmp_path / "base", torch="2.13.0")
    good = parse_freeze("torch==2.13.0\nrqt-app==1.0\nrqt-gone==1.0\n", "old.txt")
    bad = parse_freeze("torch==2.13.0\nrqt-app==2.0\nrqt-helper==1.0\n", "new.txt")
    common, changes = diff(good, bad)
    environments = envs.Environments(tmp_path / "cache", common, (), tmp_path / "base",
                                     known=bisection._one_version([good, bad]))
    assert sorted(r.line for r in environments.known.values()) == ["rqt-gone==1.0",
                                                                    "rqt-helper==1.0"]
    seen: list[str] = []

    def new_venv(venv: Path) -> None:
        v = sys.version_info
        (venv / "lib" / f"python{v[0]}.{v[1]}" / "site-packages").mkdir(parents=True)

    def pip(venv: Path, args: list[str]) -> object:
        if "install" in args:
            held = dict(line.strip().split("==") for line in
                        Path(args[args.index("-c") + 1]).read_text().splitlines())
            seen.append(json.dumps(sorted(held.items())))
            lines = Path(args[-1]).read_text().split()
            wanted = dict(line.split("==") for line in lines)
            for dep in ("rqt-helper", "rqt-tool"):
                wanted.setdefault(dep, held.get(dep, "3.0"))
            _site(venv.parent / venv.name, **{n: v for n, v in wanted.items()})
        return subprocess.CompletedProcess([], 0, "No broken requirements found.\n", "")

    monkeypatch.setattr(envs, "_new_venv", new_venv)
    monkeypatch.setattr(envs, "_run_pip", lambda venv, args: pip(venv, list(args)))
    app2 = [c.bad for c in changes if c.name == "rqt-app" and c.bad]
    assert [r.line for r in environments.left_out(app2)] == ["rqt-gone==1.0",
                                                             "rqt-helper==1.0"]
    built = environments.probe_env(app2)
    assert isinstance(built, Built) and not built.reused
    # The helper the layer leaves out comes at the bad pin's version, not the index's.
    assert json.loads(seen[-1]) == [["rqt-gone", "1.0"], ["rqt-helper", "1.0"],
                                    ["torch", "2.13.0"]]
    assert built.pulled_in == ("rqt-helper==1.0", "rqt-tool==3.0")
    again = environments.probe_env(app2)
    assert again.reused and again.pulled_in == built.pulled_in
    # The same lines held to other versions of what they leave out are another venv.
    assert environments.key(app2) != envs.Environments(
        tmp_path / "cache", common, (), tmp_path / "base").key(app2)
    prepared = runner.VenvRunner(environments, tmp_path / "out", None, (), 60).prepare(
        app2, "mix", check_mix=True)
    assert prepared.record is not None
    assert prepared.record.pulled_in == ["rqt-helper==1.0", "rqt-tool==3.0"]
    assert "pip added rqt-helper==1.0, rqt-tool==3.0" in prepared.shown


def test_the_common_layers_build_is_its_own_not_the_first_probes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fake clock: pip takes 40 s for the common layer, 5 s for a probe layer.
    now = [1000.0]

    def pip(venv: Path, args: Sequence[str]) -> object:
        now[0] += 40.0 if "--no-deps" in args else 5.0 if "install" in args else 0.0
        return subprocess.CompletedProcess([], 0, "No broken requirements found.\n", "")

    def new_venv(venv: Path) -> None:
        v = sys.version_info
        (venv / "lib" / f"python{v[0]}.{v[1]}" / "site-packages").mkdir(parents=True)

    monkeypatch.setattr(envs, "_new_venv", new_venv)
    monkeypatch.setattr(envs, "_run_pip", pip)
    monkeypatch.setattr(envs.time, "monotonic", lambda: now[0])
    environments = envs.Environments(tmp_path / "cache",
                                     [Requirement("torch", "2.13.0", "torch==2.13.0")], ())
    first = environments.probe_env([Requirement("a", "1", "a==1")])
    assert isinstance(first, Built) and first.seconds == 5.0
    assert environments.common_seconds == 40.0
    found = envs.Environments(tmp_path / "cache",
                              [Requirement("torch", "2.13.0", "torch==2.13.0")], ())
    found.common_site()
    assert found.common_seconds == 0.0
