"""Reading YAML (and JSON) that a user wrote: spec files, ``--set`` values, manifests.

YAML is safe to *parse* but not to *expand*: a few hundred bytes of aliases (``&a`` …
``[*a, *a, …]``) stand for billions of nodes once validated or serialised, and thousands
of nested brackets exhaust the recursion limit. So this reader refuses, with a message
that says where:

- any alias (``*name``): nothing we read needs one, and refusing them outright is simpler
  to explain than a budget (an anchor alone is harmless and allowed);
- nesting deeper than :data:`MAX_DEPTH` collections (a QualificationRun is about 6 deep);
- a text longer than :data:`MAX_CHARS` characters (an etcd object is at most 1.5 MiB).

Every problem is raised as :class:`YAMLInputError`; callers name the file or field. Only
safe types are built (``yaml.SafeLoader``). Imports nothing of ours but the error base.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.events import AliasEvent, CollectionStartEvent
from yaml.nodes import Node

from resumequal.errors import ResumequalError

MAX_DEPTH = 64
MAX_CHARS = 1 << 20


class YAMLInputError(ResumequalError, ValueError):
    """Text that is not YAML, or YAML this reader refuses; the message says where."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer refuses aliases and deep nesting before building anything."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, AliasEvent):
            raise YAMLInputError(
                f"{_where(event)}YAML aliases (*{event.anchor}) are not accepted; write the "
                "value out")
        nested = isinstance(event, CollectionStartEvent)
        if nested:
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise YAMLInputError(f"{_where(event)}nested deeper than {MAX_DEPTH} levels")
        try:
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        finally:
            if nested:
                self._depth -= 1


def _where(event: Any) -> str:
    mark = event.start_mark
    return f"line {mark.line + 1}: " if mark is not None else ""


def _check_size(text: str) -> None:
    if len(text) > MAX_CHARS:
        raise YAMLInputError(f"longer than {MAX_CHARS} characters")


def _fail(e: Exception) -> YAMLInputError:
    # ValueError: an integer of more digits than Python converts (sys.int_info).
    return YAMLInputError(f"not valid YAML/JSON: {e}")


def load_yaml(text: str) -> Any:
    """The one document in ``text`` (None when empty)."""
    _check_size(text)
    try:
        return yaml.load(text, Loader=_BoundedLoader)
    except YAMLInputError:
        raise
    except (yaml.YAMLError, ValueError, RecursionError) as e:
        raise _fail(e) from e


def load_yaml_all(text: str) -> list[Any]:
    """Every document in ``text``, in order."""
    _check_size(text)
    try:
        return list(yaml.load_all(text, Loader=_BoundedLoader))
    except YAMLInputError:
        raise
    except (yaml.YAMLError, ValueError, RecursionError) as e:
        raise _fail(e) from e
