"""The report files at a run's root: ``verdict.json``, ``report.json`` and ``report.html``.

Each is written atomically (a fresh file in the same directory created
``O_EXCL|O_NOFOLLOW``, fsync, rename, fsync of the directory), so a reader — a person,
the operator, a dashboard — sees the old file or the new one, never a torn one. Both JSON
files carry ``schema_version``; reading checks it before validating and names the file in
every error.

Non-finite floats (a loss that became NaN, an infinite drift) are written as the JSON
constants ``NaN`` / ``Infinity``, which Python's and pydantic's parsers read back; plain
``model_dump_json`` would write ``null`` and the file would no longer validate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import pydantic_core
from pydantic import BaseModel, ValidationError

from resumequal.errors import ReportError
from resumequal.report.html import render_html
from resumequal.results.verdict import SCHEMA_VERSION, Report, Verdict
from resumequal.store import regular
from resumequal.store.file import fsync_dir

VERDICT_JSON = "verdict.json"
REPORT_JSON = "report.json"
REPORT_HTML = "report.html"

# Versions this code can read. A new version is added here together with its migration.
KNOWN_SCHEMA_VERSIONS: frozenset[str] = frozenset({SCHEMA_VERSION})

_M = TypeVar("_M", bound=BaseModel)


def report_files(report: Report) -> dict[str, bytes]:
    """The three report files' contents by name."""
    return {
        VERDICT_JSON: _to_json(report.verdict),
        REPORT_JSON: _to_json(report),
        REPORT_HTML: render_html(report).encode("utf-8"),
    }


def write_reports(report: Report, directory: Path,
                  contents: dict[str, bytes] | None = None) -> dict[str, Path]:
    """Write the three report files (``contents``, else made here) into ``directory`` and
    return their paths by name."""
    directory.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for name, data in (contents or report_files(report)).items():
        path = directory / name
        _write_atomic(path, data)
        paths[name] = path
    fsync_dir(directory)
    return paths


def read_report(path: Path) -> Report:
    """Read a ``report.json``; raise ReportError naming the file if it is not one we know."""
    return _read(path, Report)


def read_verdict(path: Path) -> Verdict:
    """Read a ``verdict.json``; raise ReportError naming the file if it is not one we know."""
    return _read(path, Verdict)


def _to_json(model: BaseModel) -> bytes:
    data = model.model_dump(mode="python")
    return pydantic_core.to_json(data, indent=2, inf_nan_mode="constants") + b"\n"


def _read(path: Path, model: type[_M]) -> _M:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ReportError(f"{path}: cannot read: {e.strerror or e}") from e
    try:
        data: Any = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ReportError(f"{path}: not JSON: {e}") from e
    if not isinstance(data, dict):
        raise ReportError(f"{path}: expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if version not in KNOWN_SCHEMA_VERSIONS:
        known = ", ".join(sorted(KNOWN_SCHEMA_VERSIONS))
        raise ReportError(
            f"{path}: unknown schema_version {version!r} (this resumequal reads: {known})"
        )
    try:
        return model.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
            for err in e.errors()
        )
        raise ReportError(f"{path}: not a valid {model.__name__}: {problems}") from e


def _write_atomic(path: Path, data: bytes) -> None:
    # A fresh name created O_EXCL|O_NOFOLLOW, then a rename: the folder may be the run
    # folder, which others may write, and a link planted at a name of ours is never
    # written through.
    try:
        regular.write_file(path.parent, path.name, data)
    except OSError as e:
        raise ReportError(f"{path}: cannot write: {e.strerror or e}") from e
