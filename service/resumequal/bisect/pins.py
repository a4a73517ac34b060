"""Pin files: the exact requirements of a stack, as users keep them, and how two differ.

A pin file is ``pip freeze`` output (``name==version``, ``name @ url`` lines, index
options) or a ``pylock.toml`` (PEP 751). Either becomes a :class:`PinSet`: one exact
:class:`Requirement` per package. Two pin sets differ by :class:`Change` s; a *mix* takes
some changes from the bad pin and the rest from the good one. Pure: no I/O but reading
the file.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from resumequal.errors import UsageError

# resumequal itself is never taken from a pin: every probe runs the resumequal that runs
# the bisection (the one thing that must not change between probes).
SELF = "resumequal"
# Options a requirements file may carry that say where packages come from: kept, so that a
# probe installs from the same indexes the pin was made from.
SOURCE_OPTIONS = ("-i", "--index-url", "--extra-index-url", "-f", "--find-links",
                  "--trusted-host", "--no-index", "--pre", "--prefer-binary", "--only-binary")
_EXACT = re.compile(
    r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?P<extras>\[[^\]]*\])?\s*"
    r"(?:(?P<op>===|==)\s*(?P<version>[^\s;,]+)|@\s*(?P<url>[^\s;]+))\s*(?P<marker>;.*)?$")
_COMMENT = re.compile(r"(^|\s+)#.*$")
_HASH = re.compile(r"\s--hash[=\s]\S+")


class PinError(UsageError):
    """A pin file cannot be read, or holds a line that is not an exact pin; the message
    names the file and the line."""


def canonical(name: str) -> str:
    """PEP 503's normalised name: ``Foo_Bar.baz`` and ``foo-bar-baz`` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Requirement:
    """One package at one exact version (or one exact URL): ``line`` is what pip reads."""

    name: str
    version: str
    line: str


@dataclass(frozen=True)
class PinSet:
    """The packages of one pin file by canonical name, and its index options."""

    source: str
    packages: dict[str, Requirement]
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class Change:
    """One package that differs between the good and the bad pin (None: absent there)."""

    name: str
    good: Requirement | None
    bad: Requirement | None

    @property
    def label(self) -> str:
        """``torchdata 0.10.1 → 0.11.0``; ``+name 1.0`` added, ``-name 1.0`` removed."""
        if self.good is None:
            return f"+{self.name} {self.bad.version if self.bad else ''}".rstrip()
        if self.bad is None:
            return f"-{self.name} {self.good.version}"
        return f"{self.name} {self.good.version} → {self.bad.version}"


def read_pins(path: Path) -> PinSet:
    """The pin file at ``path``: ``pylock.toml`` (or ``pylock.*.toml``) by name, else
    requirements-file syntax (``pip freeze``)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise PinError(f"cannot read pin file {path}: {e}") from e
    if path.name == "pylock.toml" or (path.name.startswith("pylock.")
                                      and path.suffix == ".toml"):
        return parse_pylock(text, str(path))
    if path.name == "uv.lock":
        raise PinError(f"{path}: uv.lock is not read yet; export it with "
                       "`uv export --no-hashes --format requirements-txt` (or pylock.toml)")
    return parse_freeze(text, str(path))


def _logical_lines(text: str) -> Iterable[tuple[int, str]]:
    """Lines with comments cut and ``\\`` continuations joined, numbered from 1."""
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = _COMMENT.sub("", raw).rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield start, (pending + line).strip()
        pending = ""
    if pending.strip():
        yield start, pending.strip()


def parse_freeze(text: str, source: str) -> PinSet:
    """``pip freeze`` output, or any requirements file of exact pins."""
    packages: dict[str, Requirement] = {}
    options: list[str] = []
    for number, line in _logical_lines(text):
        if not line:
            continue
        if line.startswith("-"):
            if _is_self_editable(line):
                continue
            if line.split("=", 1)[0].split()[0] not in SOURCE_OPTIONS:
                raise PinError(f"{source}:{number}: {line.split()[0]} is not supported in a "
                               "pin file (only exact pins and index options)")
            options.append(line)
            continue
        # A hash pins an artifact, not a version: probes resolve by version alone.
        req = _requirement(_HASH.sub("", f" {line}").strip(), f"{source}:{number}")
        _add(packages, req, f"{source}:{number}")
    return PinSet(source, _without_self(packages), tuple(options))


def parse_pylock(text: str, source: str) -> PinSet:
    """A PEP 751 ``pylock.toml``: each ``[[packages]]`` entry with a version becomes
    ``name==version`` (its marker kept); its index URL is not turned into an option."""
    try:
        lock = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PinError(f"{source}: not valid TOML: {e}") from e
    packages: dict[str, Requirement] = {}
    for i, entry in enumerate(lock.get("packages", [])):
        where = f"{source}: packages[{i}]"
        name, version = entry.get("name"), entry.get("version")
        if not isinstance(name, str) or not isinstance(version, str):
            raise PinError(f"{where}: needs a name and a version (a VCS or directory "
                           "package has no version to pin)")
        marker = entry.get("marker")
        line = f"{name}=={version}" + (f" ; {marker}" if marker else "")
        _add(packages, Requirement(canonical(name), version, line), where)
    return PinSet(source, _without_self(packages))


def _requirement(line: str, where: str) -> Requirement:
    found = _EXACT.match(line)
    if found is None:
        raise PinError(f"{where}: {line!r} is not an exact pin (name==version or name @ url)")
    version = found["version"] or found["url"]
    return Requirement(canonical(found["name"]), version, line)


def _add(packages: dict[str, Requirement], req: Requirement, where: str) -> None:
    if req.name in packages and packages[req.name] != req:
        raise PinError(f"{where}: {req.name} is pinned twice")
    packages[req.name] = req


def _is_self_editable(line: str) -> bool:
    """``-e`` of resumequal (a freeze of its own checkout's environment); other editable
    installs have no version to pin, and are refused."""
    if line.split()[0] not in ("-e", "--editable"):
        return False
    target = line.split(None, 1)[1] if " " in line else ""
    if canonical(SELF) in canonical(target):
        return True
    raise PinError(f"{line!r}: an editable install has no version to pin; pin a version, "
                   "or build a wheel of it (pip wheel) and pin that")


def _without_self(packages: dict[str, Requirement]) -> dict[str, Requirement]:
    return {name: req for name, req in packages.items() if name != SELF}


def diff(good: PinSet, bad: PinSet) -> tuple[list[Requirement], list[Change]]:
    """What both pins hold alike (sorted by name) and what changes from good to bad."""
    names = sorted(good.packages.keys() | bad.packages.keys())
    same = [good.packages[n] for n in names
            if n in good.packages and good.packages[n] == bad.packages.get(n)]
    changes = [Change(n, good.packages.get(n), bad.packages.get(n)) for n in names
               if good.packages.get(n) != bad.packages.get(n)]
    return same, changes


def shared(pins: Sequence[PinSet]) -> list[Requirement]:
    """The requirements every pin of ``pins`` holds alike, sorted by name."""
    first, *rest = pins
    return [req for name, req in sorted(first.packages.items())
            if all(p.packages.get(name) == req for p in rest)]


def mix(changes: Sequence[Change], applied: Collection[int]) -> list[Requirement]:
    """The changed packages of a mix: the bad pin's for the changes at ``applied``
    (indexes into ``changes``), the good pin's for the others; absent ones left out."""
    chosen = (c.bad if i in applied else c.good for i, c in enumerate(changes))
    return [req for req in chosen if req is not None]


def layer(pins: PinSet, common: Collection[Requirement]) -> list[Requirement]:
    """The requirements of ``pins`` that are not in ``common``, sorted by name."""
    return [req for _, req in sorted(pins.packages.items()) if req not in common]


__all__ = ["SELF", "Change", "PinError", "PinSet", "Requirement", "canonical", "diff",
           "layer", "mix", "parse_freeze", "parse_pylock", "read_pins", "shared"]
