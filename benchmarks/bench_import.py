"""Benchmark: `corr-pipeline prices import` of a large CSV (6 M rows).

    python benchmarks/bench_import.py --symbols 20000 --days 300 --home /tmp/corr_import_bench

Writes a CSV of ``symbols × days`` rows (symbol, trade_date, close) with numpy, then times
``import_prices_csv`` twice in the same database: into an empty ``prices`` table, and the same
file again (every row already there, nothing changes).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from common import git_commit, machine_line


def write_csv(path: Path, n_symbols: int, n_days: int, seed: int = 0) -> int:
    """A deterministic CSV with ``n_symbols × n_days`` rows; returns the row count."""
    rng = np.random.default_rng(seed)
    dates = np.busday_offset("2025-01-01", np.arange(n_days), roll="forward").astype(str)
    symbols = np.char.add("S", np.char.zfill(np.arange(n_symbols).astype(str), 5))
    closes = 100 * np.exp(np.cumsum(rng.standard_normal((n_days, n_symbols)) * 0.01, axis=0))
    with path.open("w") as out:
        out.write("symbol,trade_date,close\n")
        for d, date in enumerate(dates):
            column = np.char.add(
                np.char.add(symbols, "," + date + ","), closes[d].round(4).astype(str)
            )
            out.write("\n".join(column.tolist()))
            out.write("\n")
    return n_symbols * n_days


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--symbols", type=int, default=20000)
    parser.add_argument("--days", type=int, default=300)
    parser.add_argument("--home", type=Path, default=Path("/tmp/corr_import_bench"))
    args = parser.parse_args()
    os.environ.setdefault("CORR_PIPELINE_HOME", str(args.home))
    from corr_pipeline.db.engine import get_engine
    from corr_pipeline.db.prices_import import import_prices_csv
    from corr_pipeline.db.schema import init_schema, truncate_all

    args.home.mkdir(parents=True, exist_ok=True)
    csv = args.home / "prices.csv"
    start = time.perf_counter()
    rows = write_csv(csv, args.symbols, args.days)
    print(f"# {machine_line()}; commit {git_commit()}")
    print(
        f"csv     {rows:,} rows, {csv.stat().st_size / 2**20:,.0f} MiB written in"
        f" {time.perf_counter() - start:.1f} s"
    )
    engine = get_engine()
    init_schema(engine)
    truncate_all(engine)
    for label in ("into an empty table", "same file again"):
        start = time.perf_counter()
        report = import_prices_csv(engine, csv)
        print(
            f"import  {label:<20} {time.perf_counter() - start:7.1f} s"
            f"  inserted {report.inserted:,}, updated {report.updated:,}"
        )


if __name__ == "__main__":
    main()
