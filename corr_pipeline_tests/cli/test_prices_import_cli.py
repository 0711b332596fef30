"""``corr-pipeline prices import`` on hostile files: one line ``corr-pipeline: error: FILE line N:
reason``, exit status 2, nothing loaded; a 1 GiB line is refused in bounded memory."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from corr_pipeline import cli
from corr_pipeline.db.schema import prices

HEADER = b"symbol,trade_date,close\n"
GOOD = b"AAA,2024-01-02,1\n"


def _count(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(prices)).scalar_one())


CASES = {
    "symbol-65-chars": (HEADER + GOOD + b"X" * 65 + b",2024-01-02,1\n", 3, "longer than 64"),
    "symbol-CR": (HEADER + GOOD + b'"A\rB",2024-01-02,1\n', 3, "U+000D"),
    "symbol-LF": (HEADER + GOOD + b'"A\nB",2024-01-02,1\n', 3, "U+000A"),
    "symbol-NUL": (HEADER + GOOD + b"A\x00B,2024-01-02,1\n", 3, "0x00"),
    "symbol-trailing-NBSP": (
        HEADER + GOOD + "AAA\u00a0,2024-01-03,1\n".encode(),
        3,
        "leading or trailing whitespace",
    ),
    "symbol-zero-width": (HEADER + GOOD + "A\u200b,2024-01-03,1\n".encode(), 3, "U+200B"),
    "long-line": (HEADER + GOOD + GOOD + b"B," + b"9" * 5000 + b"\n", 4, "longer than 4,096"),
    "long-header": (b"symbol,trade_date,close" + b" " * 5000 + b"\n" + GOOD, 1, "longer than"),
    "end-of-data-marker": (HEADER + GOOD + b"\\.\nBBB,2024-01-02,1\n", 3, "holding only \\."),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_file_one_line_exit_2_nothing_loaded(
    clean_db: sa.Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    content, line, fragment = CASES[case]
    path = tmp_path / f"{case}.csv"
    path.write_bytes(content)
    assert cli.main(["prices", "import", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"corr-pipeline: error: {path} line {line}: "), err[0]
    assert fragment in err[0]
    assert _count(clean_db) == 0


def _peak_rss_of_an_import(path: Path) -> float:
    """Peak RSS (MiB) of the same command importing a small valid file: the command's own
    footprint (interpreter, libraries), the baseline the 1 GiB line is measured against."""
    path.write_bytes(HEADER + GOOD)
    process = subprocess.Popen(
        [sys.executable, "-m", "corr_pipeline.cli", "prices", "import", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ),
    )
    _, status, usage = os.wait4(process.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return usage.ru_maxrss / 1024


def test_a_1_gib_line_is_refused_in_bounded_memory(clean_db: sa.Engine, tmp_path: Path) -> None:
    """A 1 GiB line without a line break (8 MiB of text, then a sparse hole: instant to
    create, no disk used), imported by the real command in a subprocess: refused with its line
    number in a few seconds, the process's peak memory (its own, from wait4) within 128 MiB of
    the same command importing a small file, nothing loaded."""
    path = tmp_path / "huge.csv"
    with path.open("wb") as handle:
        handle.write(HEADER + GOOD + b"B" * (8 << 20))
        handle.truncate(1 << 30)
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    started = time.monotonic()
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "corr_pipeline.cli", "prices", "import", str(path)],
            stdout=stdout,
            stderr=stderr,
            env=dict(os.environ),
        )
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.monotonic() - started
    lines = [
        line for line in err.read_text().splitlines() if not line.startswith("embedded PostgreSQL")
    ]
    assert process.returncode == 2, lines
    assert lines == [
        f"corr-pipeline: error: {path} line 3: line longer than 4,096 bytes (not a price row; "
        "a line ends with \\n or \\r\\n)"
    ]
    peak_mib = usage.ru_maxrss / 1024  # kilobytes on Linux
    assert elapsed < 60, elapsed
    assert _count(clean_db) == 0
    baseline_mib = _peak_rss_of_an_import(tmp_path / "small.csv")
    assert peak_mib < baseline_mib + 128, (
        f"peak RSS {peak_mib:.0f} MiB for a 1 GiB line, {baseline_mib:.0f} MiB for a small file"
    )
