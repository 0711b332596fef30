"""``corr-pipeline query snapshots|peers|cluster|lead-lag|corr|changes|quality``: the answers of
:mod:`corr_pipeline.query` on the command line.

Each prints a fixed-width table (:func:`corr_pipeline.query.to_text`), or JSON with ``--json``
(``to_json()``, NaN as ``null``) and exits 0. A :class:`~corr_pipeline.query.QueryError` exits
with status 2, its message on stderr prefixed ``corr-pipeline query:`` and, with ``--json``,
also ``{"error": {...}}`` on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

import sqlalchemy as sa

from corr_pipeline.query import (
    Answer,
    QueryError,
    changes,
    cluster,
    corr,
    lead_lag,
    parse_date,
    parse_max_q,
    peers,
    quality,
    snapshots,
    symbol_changes,
    to_text,
)

__all__ = ["QUERIES", "add_query_commands", "run_query"]

#: The ``query`` subcommands, in the order ``corr-pipeline query --help`` lists them (the
#: top-level help names them all).
QUERIES = ("snapshots", "peers", "cluster", "lead-lag", "corr", "changes", "quality")


def _limit(text: str) -> int | None:
    """A count argument: a whole number >= 0, where 0 means no limit (None)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return None if value == 0 else value


def _emit(result: Answer, as_json: bool, out: TextIO) -> None:
    if as_json:
        out.write(json.dumps(result.to_json(), ensure_ascii=False, indent=2) + "\n")
    else:
        out.write(to_text(result) + "\n")
    out.flush()


def run_query(
    args: argparse.Namespace,
    *,
    engine_factory: Callable[[], sa.Engine] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run one ``query`` subcommand; prints the result (table or JSON) and returns the exit
    status (0, or 2 for a :class:`QueryError`, whose message goes to stderr — and, with
    ``--json``, also to stdout as ``{"error": {...}}``). ``--date`` and ``--max-q`` are checked
    before the database is opened (:func:`corr_pipeline.query.parse_date`,
    :func:`corr_pipeline.query.parse_max_q`: one line saying what is wrong).

    ``engine_factory`` defaults to the project's database (``get_engine()``), whose schema must
    be at the code's revision: an older, newer or absent schema raises
    :class:`~corr_pipeline.db.migrate.SchemaVersionError` (one line naming ``corr-pipeline db
    upgrade`` or ``db init``; exit status 2). A query never creates or changes the schema.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    if engine_factory is None:
        from corr_pipeline.db.engine import get_engine
        from corr_pipeline.db.migrate import require_current

        def engine_factory() -> sa.Engine:
            engine = get_engine()
            require_current(engine)
            return engine

    try:
        # the arguments first: a bad one is said before a database is opened
        date = parse_date(getattr(args, "date", None))
        max_q = parse_max_q(getattr(args, "max_q", None))
        engine = engine_factory()
        what = args.query_command
        result: Answer
        if what == "snapshots":
            result = snapshots(engine, limit=args.limit)
        elif what == "peers":
            result = peers(engine, args.symbol, date, limit=args.limit)
        elif what == "cluster":
            result = cluster(engine, args.symbol, date, members=args.members)
        elif what == "lead-lag":
            result = lead_lag(
                engine, args.symbol, date, limit=args.limit, max_q=max_q, one_way=args.one_way
            )
        elif what == "corr":
            result = corr(engine, args.a, args.b, date)
        elif what == "changes" and args.symbol is None:
            result = changes(engine, date, limit=args.limit)
        elif what == "changes":
            result = symbol_changes(engine, args.symbol, date, limit=args.limit)
        elif what == "quality":
            result = quality(engine, date)
        else:  # pragma: no cover - argparse restricts the choices
            raise QueryError(f"unknown query {what!r}")
    except QueryError as exc:
        if getattr(args, "json", False):
            out.write(json.dumps({"error": exc.to_json()}, ensure_ascii=False, indent=2) + "\n")
            out.flush()
        err.write(f"corr-pipeline query: {exc}\n")
        err.flush()
        return exc.exit_code
    _emit(result, getattr(args, "json", False), out)
    return 0


def add_query_commands(
    commands: Any, *, engine_factory: Callable[[], sa.Engine] | None = None
) -> None:
    """Register ``query snapshots|peers|cluster|lead-lag|corr|changes|quality`` on the
    ``corr-pipeline`` sub-command parser ``commands`` (each sets ``func`` to a handler returning the exit code).

    ``engine_factory`` is passed to :func:`run_query` (default: the project's database).
    """

    def handler(args: argparse.Namespace) -> int:
        return run_query(args, engine_factory=engine_factory)

    query = commands.add_parser(
        "query",
        help="answers from the published snapshots: " + ", ".join(QUERIES),
        description="Query the published correlation snapshot. Tables for humans, --json for "
        "scripts. Exit status 2 for an unknown symbol or a date without a snapshot.",
    )
    sub = query.add_subparsers(dest="query_command", metavar="QUERY", required=True)

    def common(p: argparse.ArgumentParser, *, date: bool = True) -> argparse.ArgumentParser:
        if date:
            p.add_argument(
                "--date",
                default=None,
                metavar="D",
                help="snapshot date YYYY-MM-DD (default: the latest snapshot)",
            )
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        p.set_defaults(func=handler)
        return p

    p = common(sub.add_parser("snapshots", help="list the newest published snapshots"), date=False)
    p.add_argument(
        "--limit", type=_limit, default=10, metavar="N", help="how many (default 10, 0 = all)"
    )

    p = common(sub.add_parser("peers", help="a symbol's strongest |corr| neighbors"))
    p.add_argument("symbol", metavar="SYMBOL")
    p.add_argument("--limit", type=_limit, default=None, metavar="N", help="at most N (0 = all)")

    p = common(sub.add_parser("cluster", help="a symbol's cluster: id, size, members"))
    p.add_argument("symbol", metavar="SYMBOL")
    p.add_argument(
        "--members",
        type=_limit,
        default=20,
        metavar="N",
        help="list the first N members by symbol (default 20, 0 = all)",
    )

    p = common(
        sub.add_parser(
            "lead-lag",
            help="pairs where a symbol leads or lags, with their p- and q-values and whether "
            "they are two-way",
        )
    )
    p.add_argument("symbol", metavar="SYMBOL")
    p.add_argument(
        "--limit",
        type=_limit,
        default=20,
        metavar="N",
        help="the N strongest by improvement (default 20, 0 = all)",
    )
    p.add_argument(
        "--max-q",
        default=None,
        metavar="Q",
        help="only pairs whose q-value (Benjamini-Hochberg, over all ordered pairs) is at most "
        "Q, 0 < Q <= 1 (default: every pair; a pair without a q-value never passes); also the "
        "threshold of two-way (default: the snapshot's max_q_value)",
    )
    p.add_argument(
        "--one-way",
        action="store_true",
        help="only one-way pairs: the reverse pair (lagger before leader) is not significant at "
        "that threshold or has no best lag (pairs of a snapshot published before the direction "
        "was recorded are left out)",
    )

    p = common(
        sub.add_parser(
            "corr",
            help="corr and overlap of two symbols, read from the stored matrix (not recomputed)",
        )
    )
    p.add_argument("a", metavar="A")
    p.add_argument("b", metavar="B")

    p = common(
        sub.add_parser(
            "changes",
            help="what changed since the previous session: drift, largest moves, clusters, "
            "lead-lag (or one symbol's changes)",
        )
    )
    p.add_argument(
        "symbol", metavar="SYMBOL", nargs="?", default=None, help="one symbol (default: market)"
    )
    p.add_argument(
        "--limit",
        type=_limit,
        default=20,
        metavar="N",
        help="the N largest correlation moves (default 20, 0 = all recorded)",
    )

    common(
        sub.add_parser(
            "quality",
            help="the snapshot's suspect prices: symbols with too many zero returns (stale "
            "closes) or a too large |log return| (a price error), with both figures",
        )
    )
