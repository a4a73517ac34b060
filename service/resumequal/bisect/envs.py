"""Probe environments: one venv per distinct set of requirements, built once and reused.

A bisection's pins share most packages (torch and its CUDA wheels, usually) and differ in a
few. So a probe environment has two layers:

- the **common layer**: every package the pins hold alike, installed once per bisection
  cache (a venv of its own, ``pip install --no-deps`` of exactly those pins), or read
  from an existing environment (``--base-env``) after checking that what it holds of them
  is at exactly the pinned version (those it lacks join every probe layer). Those
  packages are the same in every probe, so taking them from one place changes nothing a
  probe compares.
- the **probe layer**: a venv per mix holding the packages that differ, installed by pip's
  resolver with the common pins as constraints: a mix the resolver refuses is
  *unresolvable* (no probe), and nothing the common layer holds is ever replaced.

A package a probe layer leaves out (one only the bad pin holds, say) can still be pulled in
by a package the layer holds: pip installs it at the version a pin gives it (a constraint,
when the pins give it one version), never at whatever its index offers that day. What
pip installs beyond the layer's own lines (such a package, or one no pin names because
``pip freeze`` leaves it out: setuptools) is recorded as the probe's ``pulled_in``.

A probe venv sees the common layer's site-packages through a ``.pth`` line, after its own
(its packages shadow none of the common layer's: they are different packages), and sees
the running resumequal through a second ``.pth`` line (a folder holding only a link to
its package and its metadata), never installed, so that the pins decide everything else.

Venvs live under ``<cache>/venvs/<key>``, the key a digest of the interpreter, the common
layer and the exact requirement lines: the same mix in another probe, bisection or run
reuses it. pip runs with this process's environment, so the user's pip configuration
(pip.conf, ``PIP_INDEX_URL``, ``PIP_EXTRA_INDEX_URL``, ``PIP_FIND_LINKS``) applies, and
pip's own wheel cache keeps downloads to one per wheel.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import resumequal
from resumequal.bisect.pins import Requirement, canonical
from resumequal.errors import ResumequalError

log = logging.getLogger(__name__)

READY = ".bisect-ready.json"  # written last: a venv without it is rebuilt
REFUSED = ".bisect-refused.txt"  # the resolver's refusal of this exact mix, kept
PIP_TIMEOUT_S = 3600.0  # a backstop: a CUDA torch is GB to fetch on a slow link
# How a resolver refusal reads in pip's output (pip 20.3's resolver onwards).
_REFUSAL_MARKS = ("ResolutionImpossible", "conflicting dependencies")


class EnvBuildError(ResumequalError):
    """An environment could not be built for another reason than a resolver refusal (a
    package not found, the network, a full disk): the message has pip's last lines."""


@dataclass(frozen=True)
class Built:
    """A ready probe venv: its interpreter, and what ``pip check`` finds broken in it."""

    key: str
    path: Path
    seconds: float
    reused: bool
    problems: tuple[str, ...]
    pulled_in: tuple[str, ...] = ()  # name==version pip installed beyond the layer's lines

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


@dataclass(frozen=True)
class Refused:
    """A mix pip's resolver refuses: ``message`` is its explanation of the conflict."""

    key: str
    seconds: float
    reused: bool
    message: str


def default_cache() -> Path:
    """``$XDG_CACHE_HOME/resumequal/bisect`` (``~/.cache/resumequal/bisect``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "resumequal" / "bisect"


def _digest(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _interpreter() -> str:
    return f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}"


def _site_packages(venv: Path) -> Path:
    v = sys.version_info
    return venv / "lib" / f"python{v[0]}.{v[1]}" / "site-packages"


class Environments:
    """Builds and reuses the probe venvs of one bisection under ``cache``."""

    def __init__(self, cache: Path, common: Sequence[Requirement], options: Sequence[str],
                 base_env: Path | None = None, known: Sequence[Requirement] = ()) -> None:
        self.cache = cache
        self.common = list(common)
        # The one version the pins give each package they do not share (URLs aside: pip
        # takes no links as constraints): what a layer that leaves one out is held to.
        shared_names = {r.name for r in self.common}
        self.known = {r.name: r for r in known
                      if r.name not in shared_names and " @ " not in r.line}
        self.options = list(options)
        self.base_env = base_env
        self._common_site: Path | None = None
        self.common_seconds: float | None = None  # to build or find the common layer
        self._absent: list[Requirement] = []  # common pins --base-env lacks
        self._self_dir: Path | None = None

    # -- the layers every probe shares ------------------------------------------------

    def common_site(self) -> Path:
        """The common layer's site-packages: ``--base-env``'s, checked, or a venv built
        from the common pins (once per cache)."""
        if self._common_site is None:
            started = time.monotonic()
            self._common_site = (self._checked_base() if self.base_env is not None
                                 else self._built_common())
            self.common_seconds = (0.0 if self.base_env is not None
                                   else time.monotonic() - started)
        return self._common_site

    def _checked_base(self) -> Path:
        assert self.base_env is not None
        site = _site_packages(self.base_env)
        found = {canonical(d.metadata["Name"]): d.version
                 for d in metadata.distributions(path=[str(site)]) if d.metadata["Name"]}
        wrong = [f"{r.name}=={r.version} (there: {found[r.name]})"
                 for r in self.common if found.get(r.name, r.version) != r.version]
        if wrong:
            raise EnvBuildError(f"--base-env {self.base_env} holds packages the pins share "
                                f"at other versions: {', '.join(wrong)}")
        # What it lacks goes into every probe venv (shared pins not in an image, say).
        self._absent = [r for r in self.common if r.name not in found]
        return site

    def check_base_lacks(self, names: Sequence[str]) -> None:
        """Refuse a ``--base-env`` that holds a package a probe changes: its version would
        show through in a probe that leaves the package out."""
        if self.base_env is None:
            return
        site = _site_packages(self.base_env)
        there = {canonical(d.metadata["Name"]) for d in metadata.distributions(path=[str(site)])
                 if d.metadata["Name"]}
        clash = sorted(there & {canonical(n) for n in names})
        if clash:
            raise EnvBuildError(f"--base-env {self.base_env} holds {', '.join(clash)}, which "
                                "the pins change: a probe would see its version there")

    def _built_common(self) -> Path:
        lines = [r.line for r in self.common]
        key = "common-" + _digest(_interpreter(), *self.options, *lines)
        venv = self.cache / "venvs" / key
        with _locked(venv):
            if not (venv / READY).exists():
                log.debug("bisect: building the common layer %s (%d packages)", venv, len(lines))
                started = time.monotonic()
                _new_venv(venv)
                self._pip(venv, "install", "--no-deps", *self._requirements(venv, lines))
                _mark_ready(venv, time.monotonic() - started, ())
        return _site_packages(venv)

    def self_dir(self) -> Path:
        """A folder holding only a link to the running resumequal package and its
        metadata: what a probe venv's ``.pth`` points at."""
        if self._self_dir is None:
            package = Path(resumequal.__file__).resolve().parent
            dist = metadata.distribution("resumequal")
            version = dist.version
            folder = self.cache / "self" / _digest(str(package), version)
            info = folder / f"resumequal-{version}.dist-info"
            if not (info / "METADATA").exists():
                info.mkdir(parents=True, exist_ok=True)
                link = folder / "resumequal"
                if not link.is_symlink():
                    link.symlink_to(package, target_is_directory=True)
                (info / "METADATA").write_text(dist.read_text("METADATA") or
                                               f"Metadata-Version: 2.1\nName: resumequal\n"
                                               f"Version: {version}\n")
            self._self_dir = folder
        return self._self_dir

    # -- probe venvs ------------------------------------------------------------------

    def key(self, layer: Sequence[Requirement]) -> str:
        """The venv key of a probe layer: interpreter, common layer, resumequal, lines
        (and the constraints on what it leaves out)."""
        held = self.left_out(layer)
        return _digest(_interpreter(), str(self.common_site()), str(self.self_dir()),
                       *self.options, *sorted(r.line for r in layer),
                       *(["constraints:", *sorted(r.line for r in held)] if held else []))

    def left_out(self, layer: Sequence[Requirement]) -> list[Requirement]:
        """The pins' versions of the packages ``layer`` leaves out, sorted by name: the
        constraints that hold one to its pin's version should the layer pull it in."""
        names = {r.name for r in layer}
        return [r for name, r in sorted(self.known.items()) if name not in names]

    def with_absent(self, layer: Sequence[Requirement]) -> list[Requirement]:
        """``layer`` and the shared pins the common layer lacks (``--base-env`` only)."""
        self.common_site()
        return [*layer, *self._absent]

    def probe_env(self, layer: Sequence[Requirement]) -> Built | Refused:
        """The venv holding ``layer`` over the common layer: reused when a previous
        probe (of any bisection) built it, built otherwise; or the resolver's refusal.
        Its seconds leave out the common layer's build (the first probe's, once)."""
        layer = self.with_absent(layer)
        started = time.monotonic()
        key = self.key(layer)
        venv = self.cache / "venvs" / key
        with _locked(venv):
            if (venv / REFUSED).exists():
                return Refused(key, time.monotonic() - started, True,
                               (venv / REFUSED).read_text())
            if (venv / READY).exists():
                ready = json.loads((venv / READY).read_text())
                return Built(key, venv, time.monotonic() - started, True,
                             tuple(ready["problems"]), tuple(ready.get("pulled_in", ())))
            return self._build(key, venv, layer, started)

    def _build(self, key: str, venv: Path, layer: Sequence[Requirement],
               started: float) -> Built | Refused:
        log.debug("bisect: building %s (%d packages over the common layer)", venv, len(layer))
        _new_venv(venv)
        site = _site_packages(venv)
        # Read in name order: resumequal first, then the common layer, after the venv's own.
        (site / "00-resumequal-bisect.pth").write_text(f"{self.self_dir()}\n")
        (site / "10-bisect-common.pth").write_text(f"{self.common_site()}\n")
        constraints = venv / "common-constraints.txt"
        constraints.write_text("".join(f"{r.line}\n"
                                       for r in (*self.common, *self.left_out(layer))))
        if layer:
            try:
                self._pip(venv, "install", "-c", str(constraints),
                          *self._requirements(venv, [r.line for r in layer]))
            except _Refusal as refusal:
                (venv / REFUSED).write_text(refusal.message)
                return Refused(key, time.monotonic() - started, False, refusal.message)
        problems = self._problems(venv)
        pulled = _pulled_in(site, layer)
        seconds = time.monotonic() - started
        _mark_ready(venv, seconds, problems, pulled)
        return Built(key, venv, seconds, False, problems, pulled)

    def _requirements(self, venv: Path, lines: Sequence[str]) -> list[str]:
        path = venv / "bisect-requirements.txt"
        path.write_text("".join(f"{line}\n" for line in (*self.options, *lines)))
        return ["-r", str(path)]

    def _problems(self, venv: Path) -> tuple[str, ...]:
        """What ``pip check`` finds broken across both layers (the caller compares it with
        the ends': a mix that breaks a requirement neither end breaks is unresolvable)."""
        proc = _run_pip(venv, ["check"])
        lines = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
        return tuple(sorted(line for line in lines if "No broken requirements" not in line))

    def _pip(self, venv: Path, *args: str) -> None:
        proc = _run_pip(venv, ["-q", *args])
        if proc.returncode == 0:
            return
        text = proc.stdout + proc.stderr
        if any(mark in text for mark in _REFUSAL_MARKS):
            raise _Refusal(_conflict(text))
        tail = "\n".join(text.strip().splitlines()[-12:])
        raise EnvBuildError(f"pip could not build {venv}:\n{tail}")


class _Refusal(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _conflict(text: str) -> str:
    """pip's "The conflict is caused by" paragraph, else its error lines."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "conflict is caused by" in line:
            cause = [s.strip() for s in lines[i + 1:] if s.strip()]
            return "; ".join(s for s in cause[:8] if not s.startswith("To fix"))
    return "; ".join(s.strip() for s in lines if s.startswith("ERROR"))[:2000]


def _run_pip(venv: Path, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    # This interpreter's pip, pointed at the venv (pip >= 22.3): no pip in every venv.
    # PYTHONPATH would put this process's packages in front of the venv's.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, check=False,
                              timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise EnvBuildError(f"pip ran over {PIP_TIMEOUT_S:.0f} s building {venv}") from e


def _new_venv(venv: Path) -> None:
    """An empty venv (no pip: this interpreter's pip installs into it) at ``venv``."""
    if venv.exists():
        shutil.rmtree(venv)  # a build that never finished (no ready mark)
    venv.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise EnvBuildError(f"cannot make a venv at {venv}: {proc.stderr.strip()[-500:]}")


def _pulled_in(site: Path, layer: Sequence[Requirement]) -> tuple[str, ...]:
    """``name==version`` of what pip installed into ``site`` that ``layer`` does not name."""
    named = {r.name for r in layer}
    found = {canonical(d.metadata["Name"]): f"{d.metadata['Name']}=={d.version}"
             for d in metadata.distributions(path=[str(site)]) if d.metadata["Name"]}
    return tuple(line for name, line in sorted(found.items()) if name not in named)


def _mark_ready(venv: Path, seconds: float, problems: Sequence[str],
                pulled_in: Sequence[str] = ()) -> None:
    (venv / READY).write_text(json.dumps({"seconds": round(seconds, 3),
                                          "problems": list(problems),
                                          "pulled_in": list(pulled_in)}))


@contextmanager
def _locked(venv: Path) -> Iterator[None]:
    """One builder per venv across processes: two bisections sharing a cache wait for
    each other's build instead of writing into the same folder."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.with_name(venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


__all__ = ["Built", "EnvBuildError", "Environments", "Refused", "default_cache"]
