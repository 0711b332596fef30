"""What the ``corr-pipeline`` command says when the input is wrong: one way of saying a date
is not a date."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

import pytest

from corr_pipeline import settings
from corr_pipeline.cli import main
from corr_pipeline.cli.common import iso_date
from corr_pipeline.dates import DateTextError, date_problem, missing_day, parse_date_text
from corr_pipeline.db.dates import as_iso_date

REPO = Path(__file__).resolve().parents[2]


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
