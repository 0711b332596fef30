"""A configurable price source (issue 14, item 1): names, catalog checks, the window read from a
team's own table and a view on it, bit for bit against the same data in the native table.

The "not ours" schema is ``market.eod_prices(ticker text, dt date, adj_close numeric(18,6),
volume bigint)`` with a listing table, and ``market.xnys_closes``, a view renaming the columns
and filtering one exchange. ``numeric(18,6)`` rounds the prices, so the native table is loaded
with the SAME rounded values (``adj_close::float8``) before comparing.
"""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pytest
import sqlalchemy as sa

from corr_pipeline import settings
from corr_pipeline.db.price_reads import count_trade_dates, latest_trade_date, prices_extent
from corr_pipeline.db.price_source import (
    NATIVE_PRICES,
    PriceSource,
    PriceSourceError,
    configured_price_source,
    parse_identifiers,
    resolve_price_source,
)
from corr_pipeline.db.window import load_returns_window
from corr_pipeline_tests.fixtures.price_source import (
    EOD,
    LAST,
    LOOKBACK,
    MIN_HISTORY,
    VIEW,
)


def _window(engine: sa.Engine, source: PriceSource, day: dt.date = LAST):
    return load_returns_window(
        engine, day, lookback_days=LOOKBACK, min_history_days=MIN_HISTORY, source=source
    )


def assert_same_window(a, b) -> None:
    assert a.symbols == b.symbols
    assert a.dates == b.dates and a.as_of_trade_date == b.as_of_trade_date
    assert a.returns.dtype == b.returns.dtype == np.float32
    assert a.returns.tobytes() == b.returns.tobytes()  # bit for bit, NaN pattern included
    assert a.dropped == b.dropped
    assert a.bad_prices == b.bad_prices and a.n_price_rows == b.n_price_rows
    assert a.drop_counts == b.drop_counts


# --------------------------------------------------------------------------------------------
# names
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "separator", "expected"),
    [
        ("prices", ".", ["prices"]),
        ("market.eod_prices", ".", ["market", "eod_prices"]),
        ("Market.EOD_Prices", ".", ["market", "eod_prices"]),
        (' "Market Data" . "EOD ""raw"" Prices" ', ".", ["Market Data", 'EOD "raw" Prices']),
        ('"a.b"', ".", ["a.b"]),
        ("ticker,dt,adj_close", ",", ["ticker", "dt", "adj_close"]),
        ('Ticker, "Trade Date" ,"x; DROP TABLE prices; --"', ",",
         ["ticker", "Trade Date", "x; DROP TABLE prices; --"]),
        ("émission_$1", ".", ["émission_$1"]),
    ],
)  # fmt: skip
def test_identifiers_follow_postgresql(engine, text, separator, expected):
    assert parse_identifiers(text, separator, "X") == expected
    if separator == ".":  # the server's own parser agrees
        with engine.connect() as conn:
            assert (
                conn.execute(sa.text("SELECT parse_ident(:t)"), {"t": text.strip()}).scalar_one()
                == expected
            )


@pytest.mark.parametrize(
    ("table", "columns", "message"),
    [
        ("", "a,b,c", "expected a name at position 1"),
        ("a.b.c", "a,b,c", "expected name or schema.name, got 3 parts"),
        ("a;b", "a,b,c", "expected '.' or the end at position 2, found ';'"),
        ('"open', "a,b,c", "unterminated quoted identifier"),
        ('""', "a,b,c", "empty quoted identifier"),
        ("1abc", "a,b,c", "expected a name at position 1"),
        ("t", "a,b", "expected 3 columns (symbol, trade date, price, in that order), got 2"),
        ("t", "a,b,A", "the 3 columns must be different"),
        ("t", "a,b,c d", "expected ',' or the end"),
        ("x" * 64, "a,b,c", "longer than 63 bytes"),
    ],
)
def test_malformed_settings_name_the_variable(table, columns, message):
    with pytest.raises(PriceSourceError) as err:
        PriceSource.parse(table, columns)
    text = str(err.value)
    assert message in text and "\n" not in text
    assert settings.ENV_PRICES_TABLE in text or settings.ENV_PRICES_COLUMNS in text


def test_bad_time_zone_and_the_environment(monkeypatch):
    with pytest.raises(PriceSourceError, match="CORR_PIPELINE_PRICES_TIMEZONE='Mars/Olympus'"):
        PriceSource.parse("t", "a,b,c", "Mars/Olympus")
    assert configured_price_source() == NATIVE_PRICES and NATIVE_PRICES.is_native
    monkeypatch.setenv(settings.ENV_PRICES_TABLE, "Market.EOD_Prices")
    monkeypatch.setenv(settings.ENV_PRICES_COLUMNS, "Ticker,DT,Adj_Close")
    source = configured_price_source()
    assert (source.schema, source.table, source.symbol, source.price) == (
        "market", "eod_prices", "ticker", "adj_close")  # fmt: skip
    assert not source.is_native
    assert str(source) == "market.eod_prices (ticker, dt, adj_close)"


# --------------------------------------------------------------------------------------------
# catalog checks
# --------------------------------------------------------------------------------------------


def _resolve(engine: sa.Engine, source: PriceSource):
    with engine.connect() as conn:
        return resolve_price_source(conn, source)


@pytest.mark.parametrize(
    ("table", "columns", "message"),
    [
        ("nowhere.eod_prices", "ticker,dt,adj_close", "schema nowhere does not exist"),
        ("market.eod", "ticker,dt,adj_close", "table or view market.eod does not exist"),
        ("eod_prices", "ticker,dt,adj_close", "no table or view eod_prices on the search_path"),
        ("market.eod_prices_pkey", "ticker,dt,adj_close", "is not a table or view"),
        ("market.eod_prices", "symbol,dt,adj_close",
         "has no column symbol (the symbol column; its columns: ticker, dt, adj_close, volume)"),
        ("market.eod_prices", "volume,dt,adj_close",
         "the symbol column volume is bigint; expected a string type"),
        ("market.eod_prices", "ticker,volume,adj_close",
         "the trade date column volume is bigint; expected date, timestamp or timestamp with time zone"),
        ("market.eod_prices", "ticker,dt,ticker2", "has no column ticker2"),
        ("market.listings", "ticker,exchange,ticker",
         "the 3 columns must be different"),
        ("market.listings", "exchange,ticker,ticker2", "the trade date column ticker is text"),
        ("pg_catalog.pg_authid", "rolname,rolvaliduntil,oid",
         "pg_catalog.pg_authid is in the system schema pg_catalog, never a price source"),
        ("pg_authid", "rolname,rolvaliduntil,oid",  # found on every search_path
         "pg_authid is in the system schema pg_catalog"),
        ("information_schema.tables", "table_name,table_schema,table_catalog",
         "is in the system schema information_schema"),
    ],
)  # fmt: skip
def test_unusable_sources_fail_in_one_line(market, table, columns, message):
    with pytest.raises(PriceSourceError) as err:
        _resolve(market, PriceSource.parse(table, columns))
    text = str(err.value)
    assert message in text, text
    assert "\n" not in text


def test_price_column_type_is_checked(market):
    with market.begin() as conn:
        conn.execute(sa.text("CREATE VIEW market.texty AS SELECT ticker, dt, adj_close::text AS px "
                             "FROM market.eod_prices"))  # fmt: skip
    with pytest.raises(PriceSourceError, match="the price column px is text; expected numeric"):
        _resolve(market, PriceSource.parse("market.texty", "ticker,dt,px"))


def test_accepted_types_and_notes(market):
    resolved = _resolve(market, EOD)
    assert (resolved.kind, resolved.schema) == ("table", "market")
    assert (resolved.symbol.base, resolved.trade_date.base, resolved.price.declared) == (
        "text", "date", "numeric(18,6)")  # fmt: skip
    assert resolved.notes == ()
    view = _resolve(market, VIEW)
    assert view.kind == "view" and view.describe() == "view market.xnys_closes (sym, session, px)"
    with market.begin() as conn:
        conn.exec_driver_sql(
            "CREATE DOMAIN market.ticker_t AS varchar(12);"
            "CREATE TABLE market.odd (t market.ticker_t, ts timestamptz, p real, q char(8));"
        )
    odd = _resolve(market, PriceSource.parse("market.odd", "t,ts,p"))
    assert (odd.symbol.base, odd.trade_date.base, odd.price.base) == (
        "varchar",
        "timestamptz",
        "float4",
    )
    assert len(odd.notes) == 1 and "no index leading with ts" in odd.notes[0]
    assert _resolve(market, PriceSource.parse("market.odd", "q,ts,p")).symbol.base == "bpchar"


# --------------------------------------------------------------------------------------------
# the window from another source: bit for bit
# --------------------------------------------------------------------------------------------


def test_window_from_their_table_equals_the_native_table(market):
    native = _window(market, NATIVE_PRICES)
    theirs = _window(market, EOD)
    assert native.bad_prices > 0 and native.dropped  # the synthetic data has bad prints, gaps
    assert_same_window(native, theirs)
    assert theirs.source == "table market.eod_prices (ticker, dt, adj_close)"
    assert native.source == "table prices (symbol, trade_date, close)"


def test_window_from_a_view_equals_the_native_table_of_its_rows(market):
    with market.begin() as conn:
        conn.execute(sa.text("DELETE FROM prices WHERE right(symbol, 1) IN ('3', '7')"))
    assert_same_window(_window(market, NATIVE_PRICES), _window(market, VIEW))


def test_odd_identifiers_are_quoted_never_pasted(market):
    with market.begin() as conn:
        conn.exec_driver_sql(
            'CREATE SCHEMA "Odd ""Schema""";'
            'CREATE TABLE "Odd ""Schema"""."EOD Prices; DROP TABLE prices; --" '
            '("Ticker" varchar(16), "Trade Date" date, "x; DROP TABLE prices; --" double precision);'
            'INSERT INTO "Odd ""Schema"""."EOD Prices; DROP TABLE prices; --" '
            "SELECT symbol, trade_date, close FROM prices;"
        )
    source = PriceSource.parse(
        '"Odd ""Schema"""."EOD Prices; DROP TABLE prices; --"',
        '"Ticker","Trade Date","x; DROP TABLE prices; --"',
    )
    assert_same_window(_window(market, NATIVE_PRICES), _window(market, source))
    assert prices_extent(market, source) == prices_extent(market)
    with market.connect() as conn:
        assert conn.execute(sa.text("SELECT to_regclass('prices')")).scalar() is not None


def test_percent_signs_in_names_are_not_placeholders(market):
    """psycopg reads ``%s`` and ``%(name)s`` in a statement with parameters as placeholders;
    a ``%`` inside a quoted table or column name is a character of the name."""
    with market.begin() as conn:
        ddl = (
            'CREATE TABLE "EOD %(d)s 100% Prices" '
            '("Ticker %s" varchar(16), "Trade % Date" date, "px %(tz)s" double precision);'
            'INSERT INTO "EOD %(d)s 100% Prices" SELECT symbol, trade_date, close FROM prices;'
        )
        conn.exec_driver_sql(ddl.replace("%", "%%"))  # the names as written: one % each
    source = PriceSource.parse('"EOD %(d)s 100% Prices"', '"Ticker %s","Trade % Date","px %(tz)s"')
    assert_same_window(_window(market, NATIVE_PRICES), _window(market, source))
    assert prices_extent(market, source) == prices_extent(market)


@pytest.mark.parametrize("kind", ["timestamp", "timestamptz"])
def test_timestamp_trade_dates_become_their_date_deterministically(market, kind):
    """A close stamped 16:00 New York: a ``timestamp`` keeps its written date; a
    ``timestamptz`` is dated in the configured zone, whatever the session's TimeZone."""
    with market.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE market.stamped (ticker text, at {kind}, px float8)")
        conn.exec_driver_sql("SET LOCAL TimeZone = 'America/New_York'")
        conn.exec_driver_sql(
            f"INSERT INTO market.stamped SELECT symbol, (trade_date + time '16:00')::{kind}, close "
            "FROM prices"
        )
        conn.exec_driver_sql("CREATE INDEX ON market.stamped (at)")
    zone = "America/New_York" if kind == "timestamptz" else "UTC"
    source = PriceSource.parse("market.stamped", "ticker,at,px", zone)
    native = _window(market, NATIVE_PRICES)
    # a session in another zone gives the same dates
    tokyo_session = sa.create_engine(market.url, connect_args={"options": "-c TimeZone=Asia/Tokyo"})
    try:
        with tokyo_session.connect() as conn:
            assert conn.exec_driver_sql("SHOW TimeZone").scalar() == "Asia/Tokyo"
        assert_same_window(native, _window(tokyo_session, source))
        assert latest_trade_date(tokyo_session, source) == LAST
        assert count_trade_dates(tokyo_session, LAST, 10, source) == 10
    finally:
        tokyo_session.dispose()
    if kind == "timestamptz":  # in UTC, 16:00 New York is still the same date ...
        assert_same_window(
            native, _window(market, PriceSource.parse("market.stamped", "ticker,at,px"))
        )
        # ... but in Tokyo it is the next day: the zone setting decides, nothing else
        tokyo = _window(
            market,
            PriceSource.parse("market.stamped", "ticker,at,px", "Asia/Tokyo"),
            LAST + dt.timedelta(days=1),
        )
        assert tokyo.dates == [d + dt.timedelta(days=1) for d in native.dates]


def test_duplicates_nulls_and_an_empty_source(market):
    with market.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE market.loose (ticker text, dt date, px numeric);"
            "INSERT INTO market.loose SELECT ticker, dt, adj_close FROM market.eod_prices;"
            "INSERT INTO market.loose VALUES (NULL, DATE '2026-11-27', 5);"
        )
    loose = PriceSource.parse("market.loose", "ticker,dt,px")
    assert_same_window(
        _window(market, NATIVE_PRICES), _window(market, loose)
    )  # NULL symbol ignored
    with market.begin() as conn:  # a NULL price is a bad price, like NaN
        conn.exec_driver_sql(
            "UPDATE market.loose SET px = NULL WHERE ticker = 'S00002' AND dt = DATE '2026-11-26';"
            "UPDATE prices SET close = 'NaN' WHERE symbol = 'S00002' AND trade_date = DATE '2026-11-26'"
        )
    assert_same_window(_window(market, NATIVE_PRICES), _window(market, loose))
    with market.begin() as conn:  # a symbol whose prices in the window are all NULL (or NaN)
        conn.exec_driver_sql(
            "INSERT INTO market.loose SELECT DISTINCT 'ZNULL', dt, NULL::numeric FROM market.loose "
            "WHERE dt >= DATE '2026-11-20';"
            "INSERT INTO prices SELECT DISTINCT 'ZNULL', trade_date, 'NaN'::float8 FROM prices "
            "WHERE trade_date >= DATE '2026-11-20'"
        )
    with_nulls = _window(market, loose)
    assert_same_window(_window(market, NATIVE_PRICES), with_nulls)
    assert "ZNULL" in dict(with_nulls.dropped)
    with market.begin() as conn:
        conn.exec_driver_sql("INSERT INTO market.loose VALUES ('S00005', DATE '2026-11-20', 1)")
    with pytest.raises(PriceSourceError) as err:
        _window(market, loose)
    assert "1 duplicate row(s) in the window" in str(err.value)
    assert "symbol 'S00005' on 2026-11-20" in str(err.value)
    with market.begin() as conn:
        conn.exec_driver_sql("TRUNCATE market.loose")
    with pytest.raises(
        ValueError, match="no prices at all: the price source market.loose is empty"
    ):
        _window(market, loose)


def test_a_role_that_may_only_select_is_enough(market):
    """Read-only: the window and the reads need nothing but SELECT on the source."""
    with market.begin() as conn:
        conn.exec_driver_sql(
            "DROP ROLE IF EXISTS corr_reader; CREATE ROLE corr_reader LOGIN;"
            "GRANT USAGE ON SCHEMA market TO corr_reader;"
            "GRANT SELECT ON market.eod_prices, market.listings, market.xnys_closes TO corr_reader;"
        )
    url = market.url.set(username="corr_reader", password=None)
    reader = sa.create_engine(url)
    try:
        try:
            reader.connect().close()
        except sa.exc.OperationalError:  # e.g. peer/password authentication on a shared server
            pytest.skip("this server does not let a new role log in without a password")
        assert_same_window(_window(market, VIEW), _window(reader, VIEW))
        with pytest.raises(PriceSourceError, match="no SELECT privilege on table prices"):
            _window(reader, NATIVE_PRICES)
    finally:
        reader.dispose()
        with market.begin() as conn:
            conn.exec_driver_sql(
                "REVOKE ALL ON ALL TABLES IN SCHEMA market FROM corr_reader;"
                "REVOKE ALL ON SCHEMA market FROM corr_reader; DROP ROLE corr_reader"
            )


def test_reads_follow_the_source(market):
    extent = prices_extent(market, EOD)
    assert extent == prices_extent(market)
    assert latest_trade_date(market, VIEW) == LAST
    assert count_trade_dates(market, "2026-11-25", 5, VIEW) == count_trade_dates(
        market, "2026-11-25", 5
    )
    assert not math.isnan(float(extent.rows))


def test_a_case_insensitive_collation_does_not_merge_symbols(market):
    """Symbols group byte-wise: 'S00001' and 's00001' stay two symbols even when the source's
    collation calls them equal (a nondeterministic ICU collation)."""
    try:
        with market.begin() as conn:
            conn.exec_driver_sql(
                "CREATE COLLATION market.ci (provider = icu, locale = 'und-u-ks-level2', "
                "deterministic = false)"
            )
    except sa.exc.NotSupportedError:
        pytest.skip("this PostgreSQL is built without ICU (no nondeterministic collations)")
    with market.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE market.ci_prices (ticker text COLLATE market.ci, dt date, px float8);"
            "INSERT INTO prices SELECT lower(symbol), trade_date, close * 1.5 FROM prices WHERE symbol = 'S00001';"
            "INSERT INTO market.ci_prices SELECT symbol, trade_date, close FROM prices;"
        )
    source = PriceSource.parse("market.ci_prices", "ticker,dt,px")
    assert not _resolve(market, source).symbol.deterministic
    window = _window(market, source)
    assert "S00001" in window.symbols and "s00001" in window.symbols
    assert_same_window(_window(market, NATIVE_PRICES), window)


def test_the_checked_relation_stays_locked_until_the_read_ends(market):
    """The catalog checks and the read happen in one transaction that holds the relation's
    ACCESS SHARE lock from the checks on: a view recreated by another session in between
    waits (here: times out) instead of changing what is read after it was checked."""
    replace = (
        "CREATE OR REPLACE VIEW market.checked AS "
        "SELECT ticker, dt, (adj_close * 2)::numeric(18,6) AS adj_close FROM market.eod_prices"
    )
    with market.begin() as conn:
        conn.exec_driver_sql(
            "CREATE VIEW market.checked AS SELECT ticker, dt, adj_close FROM market.eod_prices"
        )
    source = PriceSource.parse("market.checked", "ticker,dt,adj_close")
    with market.connect() as reader, reader.begin():
        resolve_price_source(reader, source)
        with (
            market.connect() as other,
            pytest.raises(sa.exc.OperationalError, match="lock timeout"),
        ):
            other.exec_driver_sql("SET lock_timeout = '300ms'")
            other.exec_driver_sql(replace)
    with market.begin() as conn:  # once the reader's transaction ends, it goes through
        conn.exec_driver_sql(replace)
