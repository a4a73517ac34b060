"""Property-based fuzzing of every reader of what a run keeps in its store: beacons, kill
orders, ``FAILED.json``, the verdict, spec and run files, trace segments, progress, the
checkpoint manifests (as a resume and the comparator read them).

Whoever can write to the run's prefix decides these bytes. Whatever they are: a result or
our own error (the ResumequalError tree: StoreError, TraceError, ReportError, SpecError,
TrainingError, CheckpointError), never another exception, never a hang.

Inputs are arbitrary bytes, arbitrary JSON (deep nesting, numbers such as 1e300 and
Infinity, wrong types) and plausible objects with fields dropped or given wrong values
(a trace record without ``step``, a beacon whose pid is a list). Runs are derandomized so
CI sees the same examples every time: EXAMPLES per test, 11 tests, 2,200 examples in all;
each must finish within DEADLINE.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resumequal.checkpoint.layout import MANIFEST, MANIFEST_MAC
from resumequal.checkpoint.manifest import authenticate, read_manifest, verify
from resumequal.checkpoint.remote import COMMITTED, RemoteRoot, newest_verified
from resumequal.errors import CheckpointError, ResumequalError
from resumequal.run.layout import FAILED_MARKER
from resumequal.run.location import RunLocation
from resumequal.run.signing import KEY_ENV, new_key, sign
from resumequal.store import FileStore
from resumequal.store.log import segment_bytes

EXAMPLES = 200
DEADLINE = timedelta(seconds=5)
KEY = new_key()

fuzz = settings(max_examples=EXAMPLES, deadline=DEADLINE, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
pytestmark = pytest.mark.timeout(120)

LEG = "preempted"
CKPT = "step-00000004"

# ----------------------------------------------------------------------------- inputs

NUMBERS = st.sampled_from([0, 1, -1, 2**31, 2**63, 10**300, 1e300, -1e300, math.inf,
                           -math.inf, math.nan, 0.5, True]) | st.integers() | st.floats()
SCALARS = st.none() | st.booleans() | NUMBERS | st.text(max_size=20) | st.sampled_from(
    ["../../secrets/x", "\x1b]0;evil\x07", "x" * 2000, "step", ""])
JUNK = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=8), inner, max_size=3), max_leaves=10)


def deep(depth: int, leaf: str = "0") -> str:
    return "[" * depth + leaf + "]" * depth


DEEP = st.sampled_from([100, 900, 5000, 200_000]).map(
    lambda n: deep(n)) | st.sampled_from([2000, 100_000]).map(
    lambda n: '{"a":' * n + "1" + "}" * n)


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()  # NaN and Infinity as Python writes them


def mutated(fields: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """``fields`` with some dropped and some given junk values, and other junk keys."""
    def build(drop: list[str], changes: dict[str, Any], extra: dict[str, Any]) -> bytes:
        body = {k: v for k, v in fields.items() if k not in drop} | changes | extra
        return dumps(body)
    names = sorted(fields)
    return st.builds(build, st.lists(st.sampled_from(names), max_size=len(names)),
                     st.dictionaries(st.sampled_from(names), JUNK, max_size=3),
                     st.dictionaries(st.text(max_size=6), JUNK, max_size=2))


def objects(fields: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """What a reader of an object shaped like ``fields`` may find instead."""
    return st.one_of(
        st.binary(max_size=300),
        JUNK.map(dumps),
        DEEP.map(str.encode),
        mutated(fields),
        st.just(dumps(fields)),
    )


BEACON = {"pid": 4242, "host": "h", "pod": "run-preempted-worker-1", "podUid": "u", "rank": 0,
          "attempt": 0, "step": 3, "microstep": 1, "at": "microbatch", "armedAt": 1.0}
KILL_ORDER = {"rank": 0, "attempt": 0, "pid": 4242, "podUid": None, "mode": "hard",
              "graceSeconds": 5, "issuedAt": 1.0}
FAILED = {"reason": "rank 0: out of memory", "at": 1.0}
STEP_RECORD = {"kind": "step", "step": 3, "attempt": 1, "rank": 0, "finished_at": 2.0}
VERDICT = {"schema_version": 1, "result": "PASS"}
RUN_FILE = {"spec_digest": "abc", "spec": {"workload": {"name": "tiny-gpt"}}, "created_at": 1}
MANIFEST_BODY = {"format": 1, "name": CKPT, "step": 4, "microstep": 0, "world_size": 1,
                 "attempt": 0, "created_at": 1.0,
                 "files": {"dcp/0.distcp": {"size": 3, "sha256": "0" * 64}}, "info": {}}

TRACE_LINES = st.lists(objects(STEP_RECORD), max_size=5)

# ----------------------------------------------------------------------------- places


@pytest.fixture
def places() -> Iterator[Callable[[], RunLocation]]:
    """A fresh run location (a folder) per call."""
    made: list[str] = []

    def fresh() -> RunLocation:
        root = tempfile.mkdtemp(prefix="rq-fuzz-")
        made.append(root)
        store = FileStore(root)
        return RunLocation(store.uri(), store)

    yield fresh
    for root in made:
        shutil.rmtree(root, ignore_errors=True)


def ours_or_result(read: Callable[[], Any]) -> Any:
    """Call ``read``; our own error is a fine answer, anything else fails the test."""
    try:
        return read()
    except ResumequalError:
        return None


# ----------------------------------------------------------------------------- markers


@fuzz
@given(data=objects(BEACON))
def test_beacons(places: Callable[[], RunLocation], data: bytes) -> None:
    loc = places()
    loc.store.put_bytes(f"{LEG}/beacons/attempt-0-rank-0.json", data)

    # The parsed beacon the state machine gets: ours or an error of ours.
    ours_or_result(lambda: loc.read_beacon(LEG, 0))


@fuzz
@given(data=objects(KILL_ORDER))
def test_kill_orders(places: Callable[[], RunLocation], data: bytes) -> None:
    loc = places()
    loc.store.put_bytes(f"{LEG}/beacons/kill-attempt-0-rank-0.json", data)
    ours_or_result(lambda: loc.leg(LEG).read_kill_order(0, 0))


@fuzz
@given(data=objects(FAILED))
def test_failure_markers(places: Callable[[], RunLocation], data: bytes) -> None:
    loc = places()
    loc.store.put_bytes(f"{LEG}/{FAILED_MARKER}", data)
    reason = ours_or_result(lambda: loc.leg_failure(LEG))
    assert reason is None or isinstance(reason, str)


@fuzz
@given(data=objects(VERDICT))
def test_verdicts(places: Callable[[], RunLocation], data: bytes) -> None:
    loc = places()
    loc.store.put_bytes("verdict.json", data)
    ours_or_result(loc.read_verdict)


@fuzz
@given(data=objects(RUN_FILE), name=st.sampled_from(["run.json", "spec.json"]))
def test_run_and_spec_files(places: Callable[[], RunLocation], data: bytes,
                            name: str) -> None:
    from resumequal.spec import QualificationSpec

    loc = places()
    loc.store.put_bytes(name, data)
    loc.store.put_bytes(f"legs/{LEG}.spec.json", data)
    ours_or_result(loc.read_spec)
    ours_or_result(lambda: loc.read_leg_spec(LEG))
    ours_or_result(lambda: loc.check_claim(QualificationSpec()))


# ----------------------------------------------------------------------------- traces


SEGMENT_NAMES = st.sampled_from(["00000000.jsonl", "00000001.jsonl", "00000003.jsonl",
                                 "0000000x.jsonl", "x.jsonl", "00000000.json"])


@st.composite
def segments(draw: st.DrawFn) -> list[tuple[str, bytes]]:
    """Segment objects: well-formed ones of junk records, and raw junk under segment
    names (and under names that are none)."""
    out = []
    for _ in range(draw(st.integers(0, 3))):
        rank = draw(st.sampled_from([0, 1, 2, 10**30]))
        attempt = draw(st.sampled_from([0, 1, 99999, 10**30]))
        name = draw(SEGMENT_NAMES)
        seq = int(name[:8]) if name[:8].isdigit() else 0
        if draw(st.booleans()):
            body = segment_bytes([line.replace(b"\n", b" ") for line in draw(TRACE_LINES)], seq)
        else:
            body = draw(st.binary(max_size=200) | DEEP.map(lambda s: s.encode() + b"\n") |
                        JUNK.map(lambda v: dumps(v) + b"\n"))
        out.append((f"{LEG}/trace/rank-{rank}/attempt-{attempt}/{name}", body))
    return out


@fuzz
@given(objs=segments())
def test_trace_segments(places: Callable[[], RunLocation],
                        objs: list[tuple[str, bytes]]) -> None:
    loc = places()
    loc.store.put_bytes("run.json", b"{}")
    for key, body in objs:
        loc.store.put_bytes(key, body)
    progress = ours_or_result(lambda: loc.leg_progress(LEG, 2))
    if progress is not None:
        assert 0 <= progress.steps_done < 2**31 and 0 <= progress.attempts < 2**31
    ours_or_result(lambda: loc.traces(LEG).records_so_far(2))
    ours_or_result(lambda: loc.traces(LEG).records(1))
    started = ours_or_result(lambda: loc.attempts_started(LEG))
    assert started is None or 0 <= started < 2**31
    dest = Path(tempfile.mkdtemp(prefix="rq-fuzz-copy-"))
    try:
        ours_or_result(lambda: loc.materialize(dest))
    finally:
        shutil.rmtree(dest, ignore_errors=True)


# ----------------------------------------------------------------------------- checkpoints


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)


MANIFESTS = objects(MANIFEST_BODY)
# The MAC as written (valid, so the parse behind it is reached) or anything else.
MACS = st.sampled_from(["valid", "missing"]) | st.binary(max_size=80)


def mac_for(data: bytes, mac: str | bytes) -> bytes | None:
    if mac == "valid":
        return sign(data, KEY.encode()).encode()
    if mac == "missing":
        return None
    assert isinstance(mac, bytes)
    return mac


@fuzz
@given(data=MANIFESTS, mac=MACS)
def test_manifest_bytes(key: None, data: bytes, mac: str | bytes) -> None:
    ours_or_result(lambda: authenticate(data, mac_for(data, mac), CKPT))


@fuzz
@given(data=MANIFESTS, mac=MACS, committed=st.booleans())
def test_remote_manifests(key: None, places: Callable[[], RunLocation], data: bytes,
                          mac: str | bytes, committed: bool) -> None:
    loc = places()
    scratch = Path(tempfile.mkdtemp(prefix="rq-fuzz-scratch-"))
    try:
        root = RemoteRoot(loc.store, f"{LEG}/checkpoints", scratch)
        loc.store.put_bytes(root.key(CKPT, MANIFEST), data)
        signature = mac_for(data, mac)
        if signature is not None:
            loc.store.put_bytes(root.key(CKPT, MANIFEST_MAC), signature)
        loc.store.put_bytes(root.key(CKPT, "dcp/0.distcp"), b"abc")
        if committed:
            loc.store.put_bytes(root.key(CKPT, COMMITTED), b"")
        ours_or_result(lambda: newest_verified(root, 1))
        ours_or_result(lambda: _read_in_place(root))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _read_in_place(root: RemoteRoot) -> list[bytes]:
    """Every file of the checkpoint, as the comparator reads a final one: in place."""
    checkpoint = root.final(CKPT)
    return [checkpoint.read(rel) for rel in sorted(checkpoint.manifest.files)]


@fuzz
@given(data=MANIFESTS, mac=MACS)
def test_folder_manifests(key: None, data: bytes, mac: str | bytes) -> None:
    folder = Path(tempfile.mkdtemp(prefix="rq-fuzz-ckpt-")) / CKPT
    try:
        (folder / "dcp").mkdir(parents=True)
        (folder / "dcp" / "0.distcp").write_bytes(b"abc")
        (folder / MANIFEST).write_bytes(data)
        signature = mac_for(data, mac)
        if signature is not None:
            (folder / MANIFEST_MAC).write_bytes(signature)
        ours_or_result(lambda: read_manifest(folder))
        ours_or_result(lambda: verify(folder))
    finally:
        shutil.rmtree(folder.parent, ignore_errors=True)


def test_an_oversized_manifest_is_refused_unread(key: None, tmp_path: Path) -> None:
    folder = tmp_path / CKPT
    folder.mkdir()
    (folder / MANIFEST).write_bytes(b" " * ((16 << 20) + 1))
    with pytest.raises(CheckpointError, match="larger than the 16777216 bytes"):
        read_manifest(folder)


# ----------------------------------------------------------------------------- the backends


@fuzz
@given(reason=st.text(max_size=50) | JUNK | st.sampled_from(["x" * (1 << 20)]))
def test_failure_reasons_as_written(places: Callable[[], RunLocation], reason: Any) -> None:
    loc = places()
    loc.store.put_bytes(f"{LEG}/{FAILED_MARKER}", dumps({"reason": reason, "at": 1.0}))
    got = ours_or_result(lambda: loc.leg_failure(LEG))
    assert got is None or isinstance(got, str)
