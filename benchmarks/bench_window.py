"""Benchmark: the window load (SPEC §2) at N = 24,000 from each kind of price source, same run.

    python benchmarks/bench_window.py --n 24000 --t 252 --repeats 3 [--database-url URL]

Writes the synthetic universe (``n`` symbols x ``t + 1`` weekdays) into ``prices`` of a scratch
embedded PostgreSQL under ``--home`` (or of ``--database-url``; its ``prices`` and a schema
``bench_market`` are REPLACED), then builds, over the same rows:

- ``native``: the project's ``prices`` table;
- ``their table``: ``bench_market.eod_prices(ticker text, dt date, adj_close numeric(18,6),
  volume bigint)`` with a primary key and an index on ``dt`` (a schema that is not ours);
- ``view``: ``bench_market.eod_view``, renaming the columns of ``prices``;
- ``foreign table``: ``bench_market.eod_remote``, a ``postgres_fdw`` foreign table on
  ``prices`` through a loopback server (skipped, and said so, when the server has no
  ``postgres_fdw``: the embedded PostgreSQL ships without contrib modules).

and times :func:`corr_pipeline.db.window.load_returns_window` on each, ``--repeats`` times in
turn (round-robin, so a cache warms every source alike), printing the best and the median
total and the phases of the best run (catalog check, dates, grouped query, pivot).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import sqlalchemy as sa
from common import git_commit, machine_line

SCHEMA = "bench_market"


def build_sources(engine: sa.Engine) -> dict[str, tuple[str, str] | None]:
    """Create the non-native sources; returns label -> (table, columns) or None (skipped)."""
    url = engine.url
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}")
        conn.exec_driver_sql(
            f"""
            CREATE TABLE {SCHEMA}.eod_prices (ticker text, dt date, adj_close numeric(18,6),
                                              volume bigint, PRIMARY KEY (ticker, dt));
            INSERT INTO {SCHEMA}.eod_prices
                SELECT symbol, trade_date,
                       CASE WHEN close IN ('Infinity', '-Infinity') THEN 'NaN' ELSE close END,
                       1000
                FROM prices;
            CREATE INDEX ON {SCHEMA}.eod_prices (dt);
            CREATE VIEW {SCHEMA}.eod_view AS
                SELECT symbol AS ticker, trade_date AS dt, close AS adj_close FROM public.prices;
            """
        )
        has_fdw = conn.exec_driver_sql(
            "SELECT 1 FROM pg_available_extensions WHERE name = 'postgres_fdw'"
        ).first()
    sources: dict[str, tuple[str, str] | None] = {
        "native": ("prices", "symbol,trade_date,close"),
        "their table (numeric)": (f"{SCHEMA}.eod_prices", "ticker,dt,adj_close"),
        "view": (f"{SCHEMA}.eod_view", "ticker,dt,adj_close"),
        "foreign table": None,
    }
    if has_fdw:
        host = url.query.get("host") or url.host or ""
        if isinstance(host, tuple):
            host = host[0]
        options = {"dbname": url.database or "", "host": host, "fetch_size": "10000"}
        if url.port:
            options["port"] = str(url.port)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS postgres_fdw")
            conn.exec_driver_sql("DROP SERVER IF EXISTS bench_loopback CASCADE")
            opts = ", ".join(f"{k} '{v}'" for k, v in options.items() if v)
            conn.exec_driver_sql(
                f"CREATE SERVER bench_loopback FOREIGN DATA WRAPPER postgres_fdw OPTIONS ({opts})"
            )
            user = f", password '{url.password}'" if url.password else ""
            conn.exec_driver_sql(
                "CREATE USER MAPPING FOR CURRENT_USER SERVER bench_loopback "
                f"OPTIONS (user '{url.username}'{user})"
            )
            conn.exec_driver_sql(
                f"""
                CREATE FOREIGN TABLE {SCHEMA}.eod_remote (
                    ticker text OPTIONS (column_name 'symbol'),
                    dt date OPTIONS (column_name 'trade_date'),
                    adj_close double precision OPTIONS (column_name 'close'))
                SERVER bench_loopback OPTIONS (schema_name 'public', table_name 'prices')
                """
            )
        sources["foreign table"] = (f"{SCHEMA}.eod_remote", "ticker,dt,adj_close")
    with engine.begin() as conn:
        conn.exec_driver_sql(f"ANALYZE prices; ANALYZE {SCHEMA}.eod_prices")
    return sources


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=24000)
    parser.add_argument("--t", type=int, default=252)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--home", type=Path, default=Path("/tmp/corr_window_bench"))
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--skip-synth", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("CORR_PIPELINE_HOME", str(args.home))
    from corr_pipeline.db import engine as db_engine
    from corr_pipeline.db.price_source import PriceSource
    from corr_pipeline.db.schema import init_schema
    from corr_pipeline.db.synth import write_synthetic_universe
    from corr_pipeline.db.window import load_returns_window
    from corr_pipeline.synth import DEFAULT_END_DATE

    if args.database_url:
        url = db_engine.normalize_url(args.database_url)
        where = f"{db_engine.redact_url(url)} (--database-url)"
    else:
        server = db_engine.start_embedded_server(args.home.resolve() / "pgdata")
        url = server.url()
        where = f"scratch embedded PostgreSQL in {server.pgdata}"
    engine = db_engine.get_engine(url)
    init_schema(engine)
    with engine.connect() as conn:
        version = conn.exec_driver_sql("SHOW server_version").scalar()
    print(f"# {machine_line()}; commit {git_commit()}")
    print(f"# database: {where}, PostgreSQL {version}")
    if not args.skip_synth:
        start = time.perf_counter()
        report = write_synthetic_universe(
            engine, n_symbols=args.n, n_days=args.t + 1, seed=args.seed
        )
        print(f"synth   {report.rows_written:,} rows in {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    sources = build_sources(engine)
    print(f"sources built in {time.perf_counter() - start:.1f} s")
    parsed = {
        label: PriceSource.parse(*spec) for label, spec in sources.items() if spec is not None
    }
    runs: dict[str, list] = {label: [] for label in parsed}
    min_history = 2 * max(2, min(60, args.t // 4))
    for _ in range(args.repeats):
        for label, source in parsed.items():
            started = time.perf_counter()
            window = load_returns_window(
                engine,
                DEFAULT_END_DATE,
                lookback_days=args.t,
                min_history_days=min_history,
                source=source,
            )
            runs[label].append((time.perf_counter() - started, window))
    reference = runs["native"][0][1]
    print(
        f"\nwindow load at N = {args.n:,} symbols x {args.t + 1} dates "
        f"({reference.n_price_rows:,} rows), {args.repeats} runs each, round-robin\n"
    )
    print(
        "| source | best s | median s | catalog s | dates s | grouped query s | pivot s | kept | same R as native |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for label in sources:
        if label not in runs:
            print(
                f"| {label} | - | - | - | - | - | - | - | skipped: no postgres_fdw on this server |"
            )
            continue
        seconds = [s for s, _ in runs[label]]
        best_s, best = min(runs[label], key=lambda r: r[0])
        t = best.timings
        same = (
            best.returns.tobytes() == reference.returns.tobytes()
            and best.symbols == reference.symbols
        )
        note = "yes" if same else "no (numeric(18,6) rounds the prices)"
        print(
            f"| {label} | {best_s:.2f} | {statistics.median(seconds):.2f} | {t['source_s']:.3f} "
            f"| {t['dates_s'] - t['source_s']:.3f} | {t['query_s']:.2f} | {t['pivot_s']:.2f} "
            f"| {len(best.symbols):,} | {note} |"
        )


if __name__ == "__main__":
    main()
