"""No secret in any log at any level: third-party loggers stay at INFO or above whatever
``-v`` / ``--log-level`` asks for, every root handler redacts, and the messages we build
(status, Events, store errors) carry no userinfo."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from resumequal import cli
from resumequal.logs import THIRD_PARTY, RedactFilter, configure_logging, third_party_level
from resumequal.redact import redact, redact_tree
from resumequal_operator import main as operator_main
from resumequal_operator import service
from resumequal_operator.events import EventRecorder
from resumequal_operator.runstatus import Condition, QualificationRunStatus
from resumequal_operator.validation import Problem

KEY_ID = "AKIARQTESTDUMMYKEY00"
SECRET = "rq-dummy-secret-for-tests-only"
TOKEN = "rq-dummy-session-token-xyz"


@pytest.fixture
def bare_logging() -> Iterator[io.StringIO]:
    """The root logger as a fresh process has it (no handlers: pytest's own are added
    after fixtures, so a test calls :func:`_bare` first), restored afterwards; what is
    logged goes to the returned buffer once an entry point has configured logging."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    saved = {name: logging.getLogger(name).level for name in (*THIRD_PARTY, "resumequal")}
    out = io.StringIO()
    real_handler = logging.StreamHandler

    def to_buffer(stream: Any = None) -> logging.StreamHandler[Any]:
        return real_handler(out)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(logging, "StreamHandler", to_buffer)
        yield out
    root.handlers, root.level = saved_handlers, saved_level
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


def _bare() -> None:
    logging.getLogger().handlers = []


def _levels() -> dict[str, int]:
    return {name: logging.getLogger(name).getEffectiveLevel()
            for name in ("botocore", "botocore.endpoint", "boto3", "s3transfer", "urllib3",
                         "kubernetes.client.rest")}


# --- levels --------------------------------------------------------------------------------


def test_third_party_levels() -> None:
    assert third_party_level(logging.DEBUG) == logging.INFO
    assert third_party_level(logging.INFO) == logging.WARNING
    assert third_party_level(logging.ERROR) == logging.ERROR


@pytest.mark.parametrize(("args", "ours", "theirs"), [
    (["-v"], logging.DEBUG, logging.INFO),
    ([], logging.INFO, logging.WARNING),
])
def test_resumequal_verbose_never_lets_libraries_log_requests(
        bare_logging: io.StringIO, tmp_path: Path, args: list[str], ours: int,
        theirs: int, trial_builds: list[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("{}")
    _bare()
    result = CliRunner().invoke(cli.main, [*args, "validate", str(spec)])
    assert result.exit_code == 0, result.output
    assert logging.getLogger("resumequal").getEffectiveLevel() == ours
    assert set(_levels().values()) == {theirs}


@pytest.mark.parametrize(("level", "ours", "theirs"), [
    ("DEBUG", logging.DEBUG, logging.INFO),
    ("INFO", logging.INFO, logging.WARNING),
    ("ERROR", logging.ERROR, logging.ERROR),
])
def test_operator_log_level_never_lets_libraries_log_requests(
        bare_logging: io.StringIO, monkeypatch: pytest.MonkeyPatch, level: str, ours: int,
        theirs: int) -> None:
    monkeypatch.setattr(service, "serve", lambda opts: None)
    _bare()
    result = CliRunner().invoke(operator_main.main, ["run", f"--log-level={level}"])
    assert result.exit_code == 0, result.output
    assert logging.getLogger("resumequal_operator").getEffectiveLevel() == ours
    assert set(_levels().values()) == {theirs}


def test_every_root_handler_redacts_once(bare_logging: io.StringIO) -> None:
    _bare()
    configure_logging(logging.DEBUG, "%(levelname)s %(name)s: %(message)s")
    configure_logging(logging.DEBUG, "%(levelname)s %(name)s: %(message)s")
    handlers = logging.getLogger().handlers
    assert len(handlers) == 1
    assert sum(isinstance(f, RedactFilter) for f in handlers[0].filters) == 1
    log = logging.getLogger("resumequal.test")
    log.debug("cannot reach %s", "http://user:pa55@minio:9000")
    logging.getLogger("botocore.endpoint").info("headers %s", {
        "Authorization": f"AWS4-HMAC-SHA256 Credential={KEY_ID}/x, Signature=abcdef0123456789",
        "X-Amz-Security-Token": TOKEN})
    try:
        raise RuntimeError(f"AWS_SECRET_ACCESS_KEY={SECRET}")
    except RuntimeError:
        log.exception("failed with %s", "https://k:pa55@h/")
    logging.getLogger("botocore.endpoint").debug("never shown: %s", SECRET)
    text = bare_logging.getvalue()
    assert "cannot reach http://***@minio:9000" in text
    assert "headers" in text and "Traceback" in text and "RuntimeError" in text
    for secret in ("pa55", KEY_ID, SECRET, TOKEN, "abcdef0123456789", "never shown"):
        assert secret not in text


def test_a_malformed_record_is_left_to_the_handler(bare_logging: io.StringIO) -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "%d", ("not a number",), None)
    assert RedactFilter().filter(record) is True  # the handler reports it as it always does


# --- redaction -----------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "shown"), [
    ("cannot reach http://user:pass@h:9000 to read s3://b/k", "http://***@h:9000"),
    ("AWS_ENDPOINT_URL_S3=https://u@h/", "https://***@h/"),
    ("s3://bucket/a@b stays", "s3://bucket/a@b stays"),
    (f"key {KEY_ID} used", "key AKIA*** used"),
    (f"aws_secret_access_key = {SECRET}", "aws_secret_access_key = ***"),
    (f"'X-Amz-Security-Token': b'{TOKEN}'", "'X-Amz-Security-Token': b'***'"),
    (f"<SessionToken>{TOKEN}</SessionToken>", "<SessionToken>***</SessionToken>"),
    (f'"SecretAccessKey": "{SECRET}"', '"SecretAccessKey": "***"'),
    ("https://h/k?X-Amz-Signature=abc&X-Amz-Credential=x",
     "X-Amz-Signature=***&X-Amz-Credential=***"),
    ("nothing to hide", "nothing to hide"),
])
def test_redact(text: str, shown: str) -> None:
    assert shown in redact(text)
    assert redact(redact(text)) == redact(text)


def test_redact_is_linear_on_long_text() -> None:
    assert redact("a." * 200_000 + "@") == "a." * 200_000 + "@"
    assert redact_tree({"a": ["http://u:p@h", 1, None], "b": {"c": "ok"}}) == {
        "a": ["http://***@h", 1, None], "b": {"c": "ok"}}


def test_status_and_problems_carry_no_userinfo() -> None:
    status = QualificationRunStatus(conditions=[Condition(
        type="Ready", status="False", reason="Error",
        message="cannot reach http://user:s3cr3t@minio:9000 to list s3://b/x")],
        machine={"errors": {"message": "http://user:s3cr3t@minio:9000"}})
    assert "s3cr3t" not in str(status.to_k8s())
    assert "s3cr3t" not in str(Problem(path="spec.store.uri", message="gs://u:s3cr3t@b"))


def test_events_carry_no_userinfo() -> None:
    created: list[dict[str, Any]] = []

    class Kube:
        def create(self, kind: Any, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
            created.append(obj)
            return obj

    obj = {"apiVersion": "resumequal.dev/v1alpha1", "kind": "QualificationRun",
           "metadata": {"name": "r", "namespace": "ns", "uid": "u"}}
    recorder = EventRecorder(Kube(), "op-0")  # type: ignore[arg-type]
    recorder.record(obj, "BackendError", "cannot reach http://user:s3cr3t@minio:9000",
                    warning=True)
    recorder.stop()  # writes what is queued
    assert created[0]["message"] == "cannot reach http://***@minio:9000"
