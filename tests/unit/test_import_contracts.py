"""The import contract that names modules one by one keeps naming every one of them.

import-linter has no "everything but": the contract keeping the operator's runtime apart
lists every module of both packages that it may not import. A module added later must
join that list (or be shown to belong to the runtime), or the contract would let the
runtime import it unseen.
"""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path
from typing import Any

import resumequal
import resumequal_operator

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
RUNTIME = "resumequal_operator.runtime"
# What the runtime may import: the error tree, and the API door it reaches the server by.
ALLOWED = {"resumequal.errors", "resumequal.__main__", "resumequal_operator.kube", RUNTIME}


def _contract(source: str) -> dict[str, Any]:
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    return next(c for c in config["contracts"] if c.get("source_modules") == [source])


def test_the_runtime_contract_forbids_every_module_but_the_error_tree_and_the_api_door() -> None:
    modules = {f"{package.__name__}.{m.name}"
               for package in (resumequal, resumequal_operator)
               for m in pkgutil.iter_modules(package.__path__)}
    assert set(_contract(RUNTIME)["forbidden_modules"]) == modules - ALLOWED
