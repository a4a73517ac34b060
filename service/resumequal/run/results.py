"""A run location's results: result files published with their MAC and read back only when
it holds, an export of the run for people, and the run's removal.

Result files (``verdict.json``, ``report.json``, ``report.html``, ``metrics.prom``,
``zoom.json``) keep the schema people read: with the run's seal each one's MAC sits beside
it in ``<name>.mac``, and a reader with the seal refuses one whose MAC does not hold for
this run and name. :class:`RunResults` is what :class:`~resumequal.run.location.RunLocation`
does with them.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from resumequal.errors import NotAuthentic, ReportError, TraceError
from resumequal.run.layout import (
    ANY_SEGMENT_NAME,
    RESULT_BYTES,
    RESULT_MAC_SUFFIX,
    SMALL_OBJECT_BYTES,
    VERDICT_JSON,
    ZOOM_JSON,
)
from resumequal.run.seal import loads
from resumequal.run.signing import RunSeal
from resumequal.run.traces import Segment, verified_lines
from resumequal.store import Store, StoreIntegrityError, StoreNotFound

if TYPE_CHECKING:
    # The verdict's models load only where one is read: a worker never reads one.
    from resumequal.results.verdict import Verdict, Zoom

log = logging.getLogger(__name__)

__all__ = ["RunResults"]


class RunResults:
    """The results of the run under ``store``, sealed with ``seal`` (mixed into
    :class:`~resumequal.run.location.RunLocation`, which holds both)."""

    store: Store
    seal: RunSeal | None

    if TYPE_CHECKING:
        def check_started(self) -> None:
            """StoreNotFound naming ``run.json`` unless a leg has claimed this location."""

    def publish(self, files: dict[str, Path]) -> dict[str, str]:
        """Put local result files (name -> path) into the location; name -> their URI.

        A file already in place (a folder run's own) is left as is. With the run's seal
        each gets its ``<name>.mac`` (see :meth:`read_result`).
        """
        out = {}
        for name, path in files.items():
            self._put_result_mac(name, self.store.put_file(name, path))
            out[name] = self.store.uri(name)
        return out

    def put_result(self, name: str, data: bytes) -> str:
        """Put result file ``name`` (``zoom.json``) with its ``.mac``; its URI."""
        self.store.put_bytes(name, data)
        digest = hashlib.sha256(data).hexdigest()
        self._put_result_mac(name, digest)
        log.debug("published %s (%d bytes, sha256 %s)", self.store.uri(name), len(data),
                  digest)
        return self.store.uri(name)

    def _put_result_mac(self, name: str, sha256_hex: str) -> None:
        # Beside the file, not in it: result files keep the schema people read. Written
        # after it: a reader looks only once the writer has ended (its Job, its process).
        if self.seal is not None:
            self.store.put_bytes(f"{name}{RESULT_MAC_SUFFIX}",
                                 self.seal.digest_mac(name, sha256_hex).encode())

    def read_result(self, name: str) -> bytes:
        """Result file ``name`` (at most RESULT_BYTES); StoreNotFound while it is absent.
        With the run's seal, only a file whose ``.mac`` holds for this run and name:
        NotAuthentic otherwise (a verdict a bucket writer wrote, or one of another run)."""
        data = self.store.get_bytes(name, RESULT_BYTES)
        if self.seal is None:
            return data
        try:
            mac = self.store.get_bytes(f"{name}{RESULT_MAC_SUFFIX}", SMALL_OBJECT_BYTES)
        except StoreNotFound:
            mac = b""
        expected = self.seal.digest_mac(name, hashlib.sha256(data).hexdigest())
        if not hmac.compare_digest(expected.encode(), mac.strip()):
            raise NotAuthentic(f"{self.store.uri(name)}: not this run's: its "
                               f"{name}{RESULT_MAC_SUFFIX} is missing or does not hold for "
                               f"run {self.seal.run}")
        return data

    def read_verdict(self) -> Verdict | None:
        """``verdict.json``, or None while the comparator has not written it.

        ReportError naming the URI if it is not a verdict of a schema this code reads.
        """
        from resumequal.results.verdict import SCHEMA_VERSION, Verdict

        where = self.store.uri(VERDICT_JSON)
        try:
            raw = self.read_result(VERDICT_JSON)
        except StoreNotFound:
            return None
        except NotAuthentic as e:  # written once: reading it again changes nothing
            raise ReportError(str(e)) from e
        try:
            data = loads(raw)
        except ValueError as e:
            raise ReportError(f"{where}: not JSON: {e}") from e
        if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
            version = data.get("schema_version") if isinstance(data, dict) else None
            raise ReportError(f"{where}: unknown schema_version {version!r} (this resumequal "
                              f"reads: {SCHEMA_VERSION})")
        try:
            return Verdict.model_validate(data)
        except ValidationError as e:
            raise ReportError(f"{where}: not a valid Verdict: {e.errors()[0]['msg']}") from e

    def read_zoom(self) -> Zoom | None:
        """``zoom.json``, authenticated as every result file is, or None before ``resumequal
        zoom`` has written it; ReportError naming the URI for one that is not a zoom."""
        from resumequal.results.verdict import Zoom

        where = self.store.uri(ZOOM_JSON)
        try:
            raw = self.read_result(ZOOM_JSON)
        except StoreNotFound:
            return None
        except NotAuthentic as e:
            raise ReportError(str(e)) from e
        try:
            return Zoom.model_validate_json(raw)
        except ValidationError as e:
            raise ReportError(f"{where}: not a valid zoom: {e.errors()[0]['msg']}") from e

    def materialize(self, dest: Path | None = None) -> Path:
        """An export for people: a copy of the run in the folder ``dest`` (default: a new
        temporary folder), each rank's trace joined into ``<leg>/trace/rank-<r>.jsonl``.

        Every object but checkpoints is copied and checked against its listed size; each
        rank's trace segments are verified (trailer count and sha256, no gap in the
        sequence) and concatenated in order. A corrupted, truncated or missing segment is
        a TraceError naming it. Nothing of resumequal reads the copy back: the comparator
        reads the location itself (:class:`~resumequal.run.traces.LegTraces`).
        """
        self.check_started()
        if dest is None:
            dest = Path(tempfile.mkdtemp(prefix="resumequal-run-"))
        dest.mkdir(parents=True, exist_ok=True)
        traces: dict[tuple[str, int], list[Segment]] = {}
        for obj in self.store.list():
            if "/checkpoints/" in f"/{obj.key}":
                continue
            m = ANY_SEGMENT_NAME.match(obj.key)
            if m is not None:
                segment = Segment(int(m.group(2)), int(m.group(3)), int(m.group(4)), obj.key)
                traces.setdefault((m.group(1), segment.rank), []).append(segment)
                continue
            if "/trace/" in f"/{obj.key}":
                raise TraceError(f"{self.store.uri(obj.key)}: not a trace segment name")
            data = self.store.get_bytes(obj.key, RESULT_BYTES)
            if len(data) != obj.size:
                raise StoreIntegrityError(f"{self.store.uri(obj.key)}: read {len(data)} bytes, "
                                          f"listed with {obj.size}")
            _write_file(dest / obj.key, data)
        for (leg, rank), segments in sorted(traces.items()):
            _write_file(dest / leg / "trace" / f"rank-{rank}.jsonl",
                        b"".join(verified_lines(self.store, sorted(segments),
                                                self._seal_of(leg),
                                                within=leg.rpartition("/")[0] + "/"
                                                if "/" in leg else "")))
        return dest

    def _seal_of(self, path: str) -> RunSeal | None:
        """The seal of the run whose legs live at ``path`` (``<leg>`` or ``seed-N/<leg>``)."""
        seal = self.seal
        if seal is not None:
            for part in path.split("/")[:-1]:
                seal = seal.child(part)
        return seal

    def delete_all(self) -> int:
        """Remove the whole run location; returns how many objects (files) there were."""
        return self.store.delete_all()


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.materialize")
    tmp.write_bytes(data)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    tmp.rename(path)
