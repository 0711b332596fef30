"""What the ``corr-pipeline`` command says when the input is wrong, and what its help lists:
every query in the top-level help, one way of saying a date is not a date, one line for an
out-of-range ``--max-q``, and a backwards backfill range refused before anything slow."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from corr_pipeline import settings
from corr_pipeline.cli import main
from corr_pipeline.cli.common import iso_date
from corr_pipeline.dates import DateTextError, date_problem, missing_day, parse_date_text
from corr_pipeline.db.dates import as_iso_date

REPO = Path(__file__).resolve().parents[2]


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return capsys.readouterr().out


def test_top_level_help_names_every_query(capsys: pytest.CaptureFixture[str]) -> None:
    """``corr-pipeline --help`` names every query ``corr-pipeline query --help`` lists, and so
    does the README's command table."""
    queries = re.findall(r"^    ([a-z-]+)", _help(["query"], capsys), re.MULTILINE)
    assert {"snapshots", "peers", "lead-lag", "changes", "quality"} <= set(queries)
    text = " ".join(_help([], capsys).split())
    line = text[text.index(" query ") : text.index(" store ")]
    for name in queries:
        assert re.search(rf" {name}(,|$)", line), (name, line)
    readme = (REPO / "README.md").read_text()
    for name in queries:
        assert f"| `corr-pipeline query {name}" in readme or f"`query {name}" in readme, name


# --------------------------------------------------------------------------------------------
# dates
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("2024-02-30", "not a date (February 2024 has 29 days)"),
        ("2023-02-29", "not a date (February 2023 has 28 days)"),
        ("2024-04-31", "not a date (April 2024 has 30 days)"),
        ("2024-13-01", "not a date (there is no month 13)"),
        ("2024-00-10", "not a date (there is no month 0)"),
        ("2024-01-00", "not a date (there is no day 0)"),
        ("0000-01-01", "not a date (there is no year 0)"),
        ("02/01/2024", "expected a date YYYY-MM-DD"),
        ("2024-1-5", "expected a date YYYY-MM-DD"),
        ("20240105", "expected a date YYYY-MM-DD"),
        ("２０２４-01-05", "expected a date YYYY-MM-DD"),  # full-width digits
        ("", "expected a date YYYY-MM-DD"),
    ],
)
def test_date_problem_says_what_is_wrong(text: str, problem: str) -> None:
    assert date_problem(text) == problem
    assert (missing_day(text) is None) == problem.startswith("expected")
    with pytest.raises(DateTextError) as info:
        parse_date_text(text, "--from")
    assert str(info.value) == f"--from {text}: {problem}"


def test_dates_parse() -> None:
    assert parse_date_text("2024-02-29") == dt.date(2024, 2, 29)
    assert date_problem("2000-02-29") is None and date_problem("1900-02-29") is not None
    assert iso_date("2024-12-31") == dt.date(2024, 12, 31)


def test_every_date_parser_says_not_a_date(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line's options, a query's --date, the first partition's variable and the
    database boundary all say the same of the same text."""
    with pytest.raises(argparse.ArgumentTypeError, match=r"^2024-02-30: not a date \(February"):
        iso_date("2024-02-30")
    with pytest.raises(ValueError) as info:
        as_iso_date("2024-02-30", "snapshot date")
    assert str(info.value) == "snapshot date '2024-02-30': not a date (February 2024 has 29 days)"
    monkeypatch.setenv(settings.ENV_PARTITION_START, "2024-02-30")
    with pytest.raises(ValueError) as info:
        settings.partition_start()
    assert str(info.value) == (
        f"{settings.ENV_PARTITION_START}='2024-02-30': not a date (February 2024 has 29 days)"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["calendar", "--from", "2024-02-30"],
        ["db", "prune", "--before", "2024-02-30"],
        ["backfill", "--from", "2024-02-30", "--to", "2024-03-01"],
        ["prices", "synth", "--end-date", "2024-02-30"],
    ],
)
def test_date_options_say_not_a_date(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    option = argv[-2] if argv[0] != "backfill" else "--from"
    assert f"argument {option}: 2024-02-30: not a date (February 2024 has 29 days)" in err
    assert "unparsable" not in err and "expected a date" not in err


def test_query_date_is_one_line_before_the_database(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["query", "peers", "AAA", "--date", "2024-02-30"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err == (
        "corr-pipeline query: --date 2024-02-30: not a date (February 2024 has 29 days)\n"
    )


# --------------------------------------------------------------------------------------------
# --max-q
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["0", "1.5", "-1"])
def test_max_q_out_of_range_is_one_line(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["query", "lead-lag", "AAA", "--max-q", bad])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err == (
        f"corr-pipeline query: --max-q {bad}: out of range: a q-value bound Q must satisfy "
        "0 < Q <= 1\n"
    )


# --------------------------------------------------------------------------------------------
# backfill
# --------------------------------------------------------------------------------------------


def test_backwards_backfill_range_is_refused_before_anything_slow(tmp_path: Path) -> None:
    """Refused in one line before Dagster is imported, an instance or a database opened (the
    home stays empty)."""
    home = tmp_path / "home"
    script = textwrap.dedent(
        """
        import sys
        from corr_pipeline.cli import main
        code = main(["backfill", "--from", "2024-03-01", "--to", "2024-02-01"])
        print("dagster imported" if "dagster" in sys.modules else "dagster not imported")
        sys.exit(code)
        """
    )
    env = dict(os.environ, CORR_PIPELINE_HOME=str(home), DAGSTER_HOME=str(tmp_path / "dh"))
    env.pop(settings.ENV_DATABASE_URL, None)
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == "corr-pipeline: error: --to 2024-02-01 is before --from 2024-03-01\n"
    assert result.stdout == "dagster not imported\n"
    assert not home.exists()
