"""Secrets taken out of text before anyone reads it: the one redaction both sides use.

Every message we build from something a user or the environment gave us — an error, a
status field, an Event, a log line — goes through :func:`redact` where it may hold a URL
or a credential: ``http://user:pass@host`` becomes ``http://***@host``, an access key id
``AKIA…`` keeps only its kind, and the values of ``aws_secret_access_key=``,
``X-Amz-Security-Token:``, ``Signature=`` and the like, and of STS's
``<SecretAccessKey>`` / ``<SessionToken>`` elements, become ``***``.

Text bound for a terminal also goes through :func:`printable`: a store key or an object's
content is anyone's who can write to the store, and an escape sequence in it (a title
change, a cleared screen, a hyperlink) would act on the reader's terminal.

It is a backstop, not the plan: credentials come only from the AWS chain and are never
put into messages on purpose, and third-party loggers that print requests stay above
DEBUG (:mod:`resumequal.logs`). Imports nothing of ours and no torch: the operator uses it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

MASK = "***"

# scheme://userinfo@ — userinfo is whatever precedes an '@' before the first '/'. (A
# scheme of at most 32 characters keeps the scan linear in the text's length.)
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]{0,31}://)[^\s/@]+@")
# AWS access key ids (AKIA: long-term, ASIA: temporary).
_ACCESS_KEY_ID = re.compile(r"(?<![A-Z0-9])(?P<kind>AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")
# name = value, name: value, "name": "value", 'name': b'value' (env, headers as botocore
# prints them, query strings, JSON).
_NAMED = re.compile(
    r"(?i)(?P<name>aws_secret_access_key|aws_session_token|aws_security_token|"
    r"x-amz-security-token|x-amz-signature|x-amz-credential|secret_?access_?key|"
    r"session_?token)"
    r"(?P<sep>[\"']?\s*[:=]\s*b?[\"']?)(?P<value>[^\s\"',&;<>]+)"
)
# An Authorization header's whole value, and a SigV4 signature wherever it appears.
_AUTHORIZATION = re.compile(
    r"(?i)(?P<name>authorization)(?P<sep>[\"']?\s*[:=]\s*b?[\"']?)(?P<value>[^\"'\r\n]+)")
_SIGNATURE = re.compile(r"(?P<name>Signature)(?P<sep>=)(?P<value>[0-9a-f]{16,})")
# STS / IMDS answers: <SecretAccessKey>…</SecretAccessKey>, "SecretAccessKey": "…".
_ELEMENT = re.compile(r"<(?P<tag>SecretAccessKey|SessionToken|Token)>[^<]*</(?P=tag)>")


def redact(text: str) -> str:
    """``text`` with URL userinfo and anything that looks like an AWS secret masked."""
    if not text:
        return text
    if "@" in text:
        text = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    text = _ELEMENT.sub(lambda m: f"<{m['tag']}>{MASK}</{m['tag']}>", text)
    for pattern in (_AUTHORIZATION, _NAMED, _SIGNATURE):
        text = pattern.sub(lambda m: f"{m['name']}{m['sep']}{MASK}", text)
    return _ACCESS_KEY_ID.sub(lambda m: f"{m['kind']}{MASK}", text)


# Control characters but newline and tab (C0, DEL, C1), and the bidirectional overrides
# that make text read otherwise than it is stored.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every control character but newline and tab shown as an escape
    (``\\x1b``), so that nothing in it acts on a terminal."""
    return _UNPRINTABLE.sub(lambda m: ascii(m[0])[1:-1], text)


def printable_tree(value: Any) -> Any:
    """Every string in a JSON-like value (dicts, lists) made :func:`printable`."""
    return _map_strings(value, printable)


def redact_tree(value: Any) -> Any:
    """Every string in a JSON-like value (dicts, lists) redacted; other values as they are."""
    return _map_strings(value, redact)


def _map_strings(value: Any, change: Callable[[str], str]) -> Any:
    """``value`` with ``change`` applied to every string value (keys stay); tuples become
    lists, other values stay as they are."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {k: _map_strings(v, change) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_map_strings(v, change) for v in value]
    return value
