"""A trace record written before a SIGKILL is on disk: the writer flushes each record as it
returns, in a real process killed right after the write."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from resumequal.trace.records import ArmRecord, read_trace

_KILL_AFTER_WRITE = """
import os, signal, sys
from resumequal.store.log import FileSink
from resumequal.trace.records import ArmRecord, TraceWriter
writer = TraceWriter(FileSink(sys.argv[1]))
writer.write(ArmRecord(rank=1, attempt=0, step=6, microstep=1, pid=os.getpid(), armed_at=1.0))
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_record_survives_sigkill_right_after_write(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", _KILL_AFTER_WRITE, str(path)], timeout=120, check=False
    )
    assert proc.returncode == -9
    (record,) = read_trace(path)
    assert isinstance(record, ArmRecord)
    assert record.step == 6
