"""What the CLI prints comes partly from the store (keys, reasons, names), which anyone who
can write there chooses: no control character of it reaches the terminal, and no rich
markup in it is read as markup."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from resumequal import cli
from resumequal.logs import RedactFilter
from resumequal.redact import printable
from resumequal.report.terminal import print_summary
from resumequal.results.verdict import Result, ValidityCheck
from tests.unit.report_samples import make_report

EVIL = "\x1b]0;evil\x07"  # sets the terminal's title, if printed as it is
SHOWN = "\\x1b]0;evil\\x07"


def _clean(text: str) -> None:
    assert "\x1b]" not in text and "\x07" not in text, ascii(text)


def test_printable_shows_control_characters_as_escapes() -> None:
    assert printable(f"key {EVIL}") == f"key {SHOWN}"
    assert printable("a\x00b\x9bc\u202ed") == "a\\x00b\\x9bc\\u202ed"
    assert printable("lines\n\tstay") == "lines\n\tstay"


def test_the_summary_prints_store_text_inertly() -> None:
    report = make_report(Result.INVALID)
    report = report.model_copy(update={
        "run": f"q1{EVIL}",
        "verdict": report.verdict.model_copy(update={
            "reason": f"[bold red]marked[/] {EVIL}",
            "checks": [ValidityCheck(name=f"kill{EVIL}", ok=False, detail=f"key {EVIL}")],
        }),
    })
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200, color_system="truecolor")
    print_summary(report, console, files={"report": f"s3://b/runs/{EVIL}/report.html"})
    text = out.getvalue()
    _clean(text)
    assert SHOWN in text
    assert "[bold red]marked[/]" in text  # shown as written, not read as markup


def test_an_error_naming_a_key_prints_it_inertly(runner: CliRunner, tmp_path: Path) -> None:
    run = tmp_path / f"run{EVIL}"
    run.mkdir()
    result = runner.invoke(cli.main, ["compare", str(run)])
    assert result.exit_code == 2
    _clean(result.stderr)
    assert SHOWN in result.stderr


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def handler() -> Iterator[io.StringIO]:
    out = io.StringIO()
    h = logging.StreamHandler(out)
    h.addFilter(RedactFilter())
    log = logging.getLogger("resumequal.test.escapes")
    log.addHandler(h)
    log.propagate = False
    yield out
    log.removeHandler(h)
    log.propagate = True


def test_log_lines_carry_no_escape_sequences(handler: io.StringIO) -> None:
    log = logging.getLogger("resumequal.test.escapes")
    log.warning("progress: skipping %s: %s", f"s3://b/x/{EVIL}.jsonl", "corrupted")
    try:
        raise ValueError(f"bad key {EVIL}")
    except ValueError:
        log.exception("failed")
    _clean(handler.getvalue())
    assert SHOWN in handler.getvalue()
