"""Which store class serves which URI scheme.

A store class declares its scheme and its settings model (:mod:`resumequal.store.settings`,
or None) and registers itself with :func:`register`, in its own module of this package;
nothing else names it. :func:`store_class` finds the class of a
scheme, importing every module of the package once so that each registers (a new store is
one file here). :func:`open_store` and the spec's validation of store URIs both ask here.

This module imports nothing at load time but the standard library: the spec imports it
lazily, and the store modules (and their SDKs, such as boto3) load on the first lookup.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import threading
from typing import TYPE_CHECKING, ClassVar, Protocol, TypeVar

if TYPE_CHECKING:
    from resumequal.store.base import Store
    from resumequal.store.settings import StoreSettings

log = logging.getLogger(__name__)


class StoreClass(Protocol):
    """What a store class declares about the URIs it serves."""

    scheme: ClassVar[str]
    """The URI scheme it serves, e.g. ``"s3"`` for ``s3://bucket/prefix``."""
    example: ClassVar[str]
    """A URI of the scheme, for messages: ``"s3://bucket/prefix"``."""
    settings: ClassVar[type[StoreSettings] | None]
    """The model of the spec section that says how such a store is reached; None: the
    URI says it all (a folder)."""

    @classmethod
    def authority_problem(cls, authority: str) -> str | None:
        """Why ``authority`` (what follows ``scheme://`` up to the first ``/``) cannot
        name a store of this scheme, or None."""
        ...

    @classmethod
    def open(cls, uri: str, settings: StoreSettings | None, retry_seconds: float) -> Store:
        """The store at ``uri``, reached with ``settings`` (an instance of :attr:`settings`;
        None: its defaults and the environment). ``retry_seconds``: how long a request that
        the endpoint cannot serve is made again (0: the settings' attempts alone)."""
        ...


_CLASSES: dict[str, type[StoreClass]] = {}
_discovered = False
# Discovery imports modules: a second thread asking meanwhile waits for all of them (else it
# sees only the stores imported so far), and an import that asks again returns at once.
_discovering = threading.RLock()
_loading = False

C = TypeVar("C")


def register(cls: C) -> C:
    """Class decorator: ``cls`` serves its ``scheme``."""
    store: type[StoreClass] = cls  # type: ignore[assignment]
    _CLASSES[store.scheme] = store
    return cls


def _discover() -> None:
    global _discovered, _loading
    if _discovered:
        return
    with _discovering:
        if _discovered or _loading:
            return
        _loading = True
        try:
            package = importlib.import_module("resumequal.store")
            for module in pkgutil.iter_modules(package.__path__):
                try:
                    importlib.import_module(f"{package.__name__}.{module.name}")
                except ModuleNotFoundError as e:
                    if (e.name or "").startswith("resumequal"):
                        raise
                    # A store whose SDK is not installed here serves nothing here.
                    log.debug("store module %s not loaded: %s", module.name, e)
            _discovered = True
        finally:
            _loading = False


def store_class(scheme: str) -> type[StoreClass] | None:
    """The class serving ``scheme``, or None."""
    _discover()
    return _CLASSES.get(scheme)


def schemes() -> dict[str, str]:
    """Every scheme served here, with an example URI of each, in scheme order."""
    _discover()
    return {s: _CLASSES[s].example for s in sorted(_CLASSES)}


def supported() -> str:
    """The schemes' examples in words, for a message: ``file:///abs/path or s3://...``."""
    examples = list(schemes().values())
    return ", ".join(examples[:-1]) + (" or " if len(examples) > 1 else "") + examples[-1]


__all__ = ["StoreClass", "register", "schemes", "store_class", "supported"]
