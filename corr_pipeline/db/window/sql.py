"""The statements that read a window (see :mod:`corr_pipeline.db.window`): the loose index
scans of the dates and the grouped per-symbol query, for any price source."""

from __future__ import annotations

from psycopg import sql

from corr_pipeline.db.price_source import ResolvedPriceSource

#: ``work_mem`` for the window transaction (SET LOCAL): the per-symbol hash aggregate needs
#: ~400 MB at N = 24,000 × 253 dates; the server default (4 MB) would spill it to disk.
WINDOW_WORK_MEM = "1GB"


def dates_sql(src: ResolvedPriceSource) -> sql.Composable:
    """Window dates by a loose index scan of the trade-date column (see the module docstring):
    the last date ``<= %(d)s``, then each previous distinct date, ``%(n)s`` of them."""
    col, p_col = src.column_sql(src.source.trade_date), src.column_sql(src.source.trade_date, "p")
    next_day = sql.SQL("(%(d)s::date + 1)")
    return sql.SQL(
        """
WITH RECURSIVE d(trade_date) AS (
    (SELECT {day} FROM {rel} WHERE {col} < {upper} ORDER BY {col} DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT {p_day} FROM {rel} p WHERE {p_col} < {p_upper}
            ORDER BY {p_col} DESC LIMIT 1)
    FROM d WHERE d.trade_date IS NOT NULL
)
SELECT trade_date FROM d WHERE trade_date IS NOT NULL LIMIT %(n)s
"""
    ).format(
        rel=src.relation_sql(),
        col=col,
        day=src.day_sql(col),
        upper=src.day_start_sql(next_day),
        p_col=p_col,
        p_day=src.day_sql(p_col),
        p_upper=src.day_start_sql(sql.SQL("d.trade_date")),
    )


def union_dates_sql(src: ResolvedPriceSource) -> sql.Composable:
    """The dates of every window whose snapshot date lies in ``%(lo)s..%(hi)s``: the loose
    index scan of :func:`dates_sql` from the last date ``<= %(hi)s`` down, one distinct date
    per probe, until ``%(n)s`` dates ``<= %(lo)s`` have been read (or none are left). So every
    distinct date from the first window's start to the last window's end is read once."""
    col, p_col = src.column_sql(src.source.trade_date), src.column_sql(src.source.trade_date, "p")
    return sql.SQL(
        """
WITH RECURSIVE d(trade_date, k) AS (
    (SELECT {day}, CASE WHEN {day} <= %(lo)s::date THEN 1 ELSE 0 END
     FROM {rel} WHERE {col} < {upper} ORDER BY {col} DESC LIMIT 1)
    UNION ALL
    SELECT s.trade_date, d.k + CASE WHEN s.trade_date <= %(lo)s::date THEN 1 ELSE 0 END
    FROM d CROSS JOIN LATERAL (
        SELECT (SELECT {p_day} FROM {rel} p WHERE {p_col} < {p_upper}
                ORDER BY {p_col} DESC LIMIT 1) AS trade_date) s
    WHERE d.trade_date IS NOT NULL AND d.k < %(n)s
)
SELECT trade_date FROM d WHERE trade_date IS NOT NULL
"""
    ).format(
        rel=src.relation_sql(),
        col=col,
        day=src.day_sql(col),
        upper=src.day_start_sql(sql.SQL("(%(hi)s::date + 1)")),
        p_col=p_col,
        p_day=src.day_sql(p_col),
        p_upper=src.day_start_sql(sql.SQL("d.trade_date")),
    )


def grouped_sql(src: ResolvedPriceSource, n_runs: int = 0) -> sql.Composable:
    """One row per symbol of the window ``%(a)s..%(b)s``: the symbol, its day offsets and its
    prices as header-stripped binary arrays (see the module docstring), and its NULL prices.

    ``n_runs > 0`` (:func:`load_returns_windows`): the rows of the date ranges
    ``%(a0)s..%(b0)s``, ``%(a1)s..%(b1)s``, ... (offsets still from ``%(a)s``), and the fourth
    column holds the day offsets of the NULL-price rows (a blob like the second) instead of
    their count, so that each window of the union counts its own."""
    col = src.column_sql(src.source.trade_date)
    symbol_not_null = (
        sql.SQL(" AND {} IS NOT NULL").format(src.column_sql(src.source.symbol))
        if src.symbol.nullable
        else sql.SQL("")
    )
    price = src.price_sql()
    day_offset = sql.SQL("int4send({} - %(a)s::date)").format(src.day_sql(col))
    days_filter: sql.Composable
    null_prices: sql.Composable
    if src.price.nullable:
        # a NULL price: no element in either blob (string_agg skips NULL, the FILTER keeps the
        # day blob aligned), counted in the fourth column as a bad price
        days_filter = sql.SQL(" FILTER (WHERE {} IS NOT NULL)").format(price)
        null_prices = (
            sql.SQL("string_agg({}, ''::bytea) FILTER (WHERE {} IS NULL)").format(day_offset, price)
            if n_runs
            else sql.SQL("count(*) - count({})").format(price)
        )
    else:
        days_filter = sql.SQL("")
        null_prices = sql.SQL("NULL::bytea" if n_runs else "0::int8")

    def day_range(lo: str, hi: str) -> sql.Composable:
        return sql.SQL("{col} >= {lower} AND {col} < {upper}").format(
            col=col,
            lower=src.day_start_sql(sql.SQL(f"%({lo})s::date")),
            upper=src.day_start_sql(sql.SQL(f"(%({hi})s::date + 1)")),
        )

    where = (
        sql.SQL("({})").format(
            sql.SQL(" OR ").join(
                sql.SQL("({})").format(day_range(f"a{i}", f"b{i}")) for i in range(n_runs)
            )
        )
        if n_runs
        else day_range("a", "b")
    )
    return sql.SQL(
        """
SELECT {symbol},
       string_agg({day_offset}, ''::bytea){days_filter},
       string_agg(float8send({price}), ''::bytea),
       {null_prices}
FROM {rel}
WHERE {where}{symbol_not_null}
GROUP BY 1
"""
    ).format(
        symbol=src.symbol_sql(),
        day_offset=day_offset,
        price=price,
        days_filter=days_filter,
        null_prices=null_prices,
        rel=src.relation_sql(),
        where=where,
        symbol_not_null=symbol_not_null,
    )


def earliest_sql(src: ResolvedPriceSource) -> sql.Composable:
    col = src.column_sql(src.source.trade_date)
    return sql.SQL("SELECT {} FROM {}").format(
        src.day_sql(sql.SQL("min({})").format(col)), src.relation_sql()
    )
