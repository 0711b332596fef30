"""Small pieces shared by the ``corr-pipeline`` command modules: printing, argument types, the
project database, and the usage error."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from corr_pipeline.dates import date_problem
from corr_pipeline.db import engine as db_engine
from corr_pipeline.db.migrate import ensure_schema

if TYPE_CHECKING:
    from corr_pipeline.db.synth import SynthReport

__all__ = [
    "UsageError",
    "echo",
    "iso_date",
    "open_engine",
    "positive_float",
    "positive_int",
    "write_synthetic",
]


class UsageError(ValueError):
    """Invalid command-line usage detected after argparse (exit status 2)."""


def echo(message: str = "") -> None:
    """Print ``message`` on stdout and flush (the commands' output)."""
    print(message, flush=True)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer > 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def iso_date(text: str) -> dt.date:
    """argparse type: a date ``YYYY-MM-DD``; otherwise the text and what is wrong with it
    (:func:`corr_pipeline.dates.date_problem`: ``2024-02-30: not a date (February 2024 has 29
    days)``)."""
    problem = date_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text}: {problem}")
    return dt.date.fromisoformat(text)


def parse_params(items: list[str]) -> dict[str, Any]:
    """``["lookback_days=60", "linkage_method=single"]`` → ``{"lookback_days": 60, ...}``
    (numbers as numbers, ``none`` as None); ValueError naming a malformed item."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--param {item!r}: expected NAME=VALUE")
        text = raw.strip()
        value: Any = text
        if text.lower() == "none":
            value = None
        else:
            for kind in (int, float):
                try:
                    value = kind(text)
                    break
                except ValueError:
                    continue
        out[name.strip()] = value
    return out


def open_engine(*, create_if_fresh: bool = True) -> sa.Engine:
    """The project database (:func:`corr_pipeline.db.engine.get_engine`), its schema at the
    code's revision: a fresh database (none of our tables) is created when ``create_if_fresh``
    (the commands that load data); an older or newer schema raises
    :class:`~corr_pipeline.db.migrate.SchemaVersionError` naming the command to run (existing
    tables are migrated only by ``corr-pipeline db upgrade``)."""
    engine = db_engine.get_engine()
    ensure_schema(engine, create_if_fresh=create_if_fresh)
    return engine


def write_synthetic(
    engine: sa.Engine, *, symbols: int, days: int, seed: int, end_date: dt.date | None
) -> SynthReport:
    """Replace ``prices`` with a synthetic universe
    (:func:`corr_pipeline.db.synth.write_synthetic_universe`), its progress lines on stderr;
    returns its report."""
    from corr_pipeline.db.synth import write_synthetic_universe  # heavy; only when needed

    return write_synthetic_universe(
        engine,
        n_symbols=symbols,
        n_days=days,
        seed=seed,
        end_date=end_date,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
