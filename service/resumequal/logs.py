"""Logging set up once at each entry point (``resumequal``, ``resumequal-operator``).

Two rules hold whatever level is asked for:

- Libraries that log requests — botocore, boto3, s3transfer, urllib3, the Kubernetes
  client — never log below INFO: at DEBUG botocore prints signed requests and STS answers
  (secret keys, session tokens) and the Kubernetes client prints response bodies. They
  log at WARNING by default, so a run's progress is not interleaved with botocore's
  "Found credentials in environment variables".
- Every handler of the root logger redacts (:class:`RedactFilter`), and shows control
  characters as escapes (a store key on a terminal acts on nothing): a backstop for a
  credential that reaches a message anyway, e.g. userinfo in ``AWS_ENDPOINT_URL_S3``.

Imports nothing of ours but :mod:`resumequal.redact`, and no torch.
"""

from __future__ import annotations

import logging

from resumequal.redact import printable, redact

# Loggers of libraries that see credentials or raw HTTP traffic.
THIRD_PARTY: tuple[str, ...] = ("botocore", "boto3", "s3transfer", "urllib3", "kubernetes")


def third_party_level(level: int) -> int:
    """INFO when debugging, else WARNING or whatever stricter level was asked for."""
    return logging.INFO if level <= logging.DEBUG else max(level, logging.WARNING)


class RedactFilter(logging.Filter):
    """Redacts a record's message, traceback and stack before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True  # the handler reports a malformed record as it always does
        # Printable too: a log line on a terminal must not carry its escape sequences.
        record.msg, record.args = printable(redact(message)), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = printable(redact(record.exc_text))
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def configure_logging(level: int, fmt: str) -> None:
    """Log ``level`` and up to stderr (unless the root logger has handlers already), with
    third-party loggers held at :func:`third_party_level` and every root handler redacting."""
    root = logging.getLogger()
    if not root.handlers:
        stderr = logging.StreamHandler()
        stderr.setFormatter(logging.Formatter(fmt))
        root.addHandler(stderr)
    for handler in root.handlers:
        if not any(isinstance(f, RedactFilter) for f in handler.filters):
            handler.addFilter(RedactFilter())
    root.setLevel(level)
    for name in THIRD_PARTY:
        logging.getLogger(name).setLevel(third_party_level(level))
