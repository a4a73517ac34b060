"""External programs the tests drive (promtool, prometheus, kubectl).

Where one is missing, a developer's run skips what needs it, saying how to get it; a CI
run (``CI`` set) fails instead, since there ``make tools`` must have installed it and a
skip would hide that it did not.
"""

from __future__ import annotations

import os
import shutil

import pytest

HINT = {"promtool": "make tools installs Debian's prometheus",
        "prometheus": "make tools installs Debian's prometheus",
        "kubectl": "make tools installs the kubectl package"}


def require(tool: str) -> str:
    """The path of ``tool``; a skip where it is missing, a failure in CI."""
    path = shutil.which(tool)
    if path is None:
        message = f"{tool} is not installed ({HINT.get(tool, 'install it')})"
        if os.environ.get("CI"):
            pytest.fail(f"{message}: CI must have it")
        pytest.skip(message)
    return path
