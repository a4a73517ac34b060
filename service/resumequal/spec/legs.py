"""The legs' names: the reference leg's, and what any leg name may be."""

from __future__ import annotations

import re

from resumequal.spec.section import SpecError

# The reference leg runs uninterrupted; the others are compared against it. Its folder (and
# Kubernetes) name predates the word "reference" and is kept, as runs already stored use it.
REFERENCE_LEG = "control"
_LEG_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def check_leg_name(name: str) -> str:
    """Leg names become folder names (and Kubernetes names): keep them boring."""
    if not _LEG_NAME.match(name):
        raise SpecError(
            f"leg name {name!r}: use lowercase letters, digits, '-' or '_' (at most 63 "
            "characters, starting with a letter or digit)"
        )
    return name
