"""CSV import (SPEC §1): all-or-nothing, errors name file and line, bad closes counted."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import pytest
import sqlalchemy as sa

from corr_pipeline.db.bulk import copy_text, create_prices_staging, upsert_prices_from_staging
from corr_pipeline.db.prices_import import (
    MAX_LINE_BYTES,
    ImportReport,
    PricesImportError,
    checked_lines,
    import_prices_csv,
)
from corr_pipeline.db.schema import prices

HEADER = "symbol,trade_date,close\n"


def _write(tmp_path: Path, text: str | bytes, name: str = "prices.csv") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _rows(engine: sa.Engine) -> dict[tuple[str, dt.date], float]:
    with engine.connect() as conn:
        result = conn.execute(sa.select(prices.c.symbol, prices.c.trade_date, prices.c.close))
        return {(s, d): c for s, d, c in result}


def _prices_indexes(engine: sa.Engine) -> dict[str, tuple[str, bool]]:
    """name -> (definition, is primary) of every index on prices."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisprimary FROM pg_index i "
                "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = 'prices'::regclass"
            )
        )
        return {name: (definition, primary) for name, definition, primary in rows}


def _seed(engine: sa.Engine) -> dict[tuple[str, dt.date], float]:
    """Pre-existing rows that a failed import must leave untouched."""
    with engine.begin() as conn:
        conn.execute(
            prices.insert(),
            [
                {"symbol": "OLD", "trade_date": dt.date(2023, 12, 29), "close": 10.0},
                {"symbol": "AAA", "trade_date": dt.date(2024, 1, 2), "close": 99.0},
            ],
        )
    return _rows(engine)


def test_import_inserts_then_reimport_updates(clean_db: sa.Engine, tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        HEADER + "AAA,2024-01-02,10.5\nAAA,2024-01-03,11.25\nBBB,2024-01-02,20\n",
    )
    indexes = _prices_indexes(clean_db)
    assert len(indexes) == 2 and any(primary for _, primary in indexes.values())
    report = import_prices_csv(clean_db, path)  # into an empty table: indexes rebuilt after
    assert _prices_indexes(clean_db) == indexes
    assert isinstance(report, ImportReport)
    assert (report.rows, report.inserted, report.updated, report.bad_closes) == (3, 3, 0, 0)
    assert _rows(clean_db) == {
        ("AAA", dt.date(2024, 1, 2)): 10.5,
        ("AAA", dt.date(2024, 1, 3)): 11.25,
        ("BBB", dt.date(2024, 1, 2)): 20.0,
    }

    # Overlapping file: two existing keys (one with a new close), one new key.
    path2 = _write(
        tmp_path,
        HEADER + "AAA,2024-01-02,10.5\nBBB,2024-01-02,21\nCCC,2024-01-03,30\n",
        "more.csv",
    )
    report2 = import_prices_csv(clean_db, path2)
    assert (report2.rows, report2.inserted, report2.updated, report2.unchanged) == (3, 1, 1, 1)
    rows = _rows(clean_db)
    assert len(rows) == 4
    assert rows[("BBB", dt.date(2024, 1, 2))] == 21.0
    assert rows[("CCC", dt.date(2024, 1, 3))] == 30.0
    assert "1 inserted, 1 updated, 1 unchanged" in report2.summary()

    # The same file again: everything is unchanged, nothing is rewritten.
    report3 = import_prices_csv(clean_db, path2)
    assert (report3.inserted, report3.updated, report3.unchanged) == (0, 0, 3)
    assert _rows(clean_db) == rows


def test_columns_in_any_order_quotes_crlf_and_bom(clean_db: sa.Engine, tmp_path: Path) -> None:
    text = '\ufeffclose,symbol,trade_date\r\n1.5,"BRK.B",2024-01-02\r\n2.5e1,"X,Y",2024-01-02\r\n'
    report = import_prices_csv(clean_db, _write(tmp_path, text.encode("utf-8")))
    assert (report.rows, report.inserted) == (2, 2)
    assert _rows(clean_db) == {
        ("BRK.B", dt.date(2024, 1, 2)): 1.5,
        ("X,Y", dt.date(2024, 1, 2)): 25.0,
    }


def test_bad_closes_are_loaded_and_counted(clean_db: sa.Engine, tmp_path: Path) -> None:
    text = HEADER + (
        "A,2024-01-02,0\nB,2024-01-02,-3.5\nC,2024-01-02,NaN\nD,2024-01-02,Infinity\n"
        "E,2024-01-02,-inf\nF,2024-01-02,1e-300\nG,2024-01-02,42\n"
    )
    report = import_prices_csv(clean_db, _write(tmp_path, text))
    assert report.rows == 7
    assert report.bad_closes == 5  # 0, negative, NaN, +inf, -inf; tiny positive is fine
    assert "5 non-positive/NaN/infinite closes" in report.summary()
    rows = _rows(clean_db)
    assert math.isnan(rows[("C", dt.date(2024, 1, 2))])
    assert rows[("D", dt.date(2024, 1, 2))] == math.inf
    assert rows[("E", dt.date(2024, 1, 2))] == -math.inf
    assert rows[("F", dt.date(2024, 1, 2))] == 1e-300

    # Re-import (upsert path): still counted over the whole file; NaN equals NaN (unchanged).
    again = import_prices_csv(clean_db, tmp_path / "prices.csv")
    assert (again.bad_closes, again.unchanged, again.updated) == (5, 7, 0)


@pytest.mark.parametrize(
    ("content", "line", "fragment"),
    [
        pytest.param(
            "symbol,trade_date\nAAA,2024-01-02\n", 1, "missing column(s) close", id="missing-column"
        ),
        pytest.param(
            "symbol,date,close\nAAA,2024-01-02,1\n", 1, "unexpected column(s) 'date'", id="renamed"
        ),
        pytest.param(
            "symbol,trade_date,close,volume\nAAA,2024-01-02,1,5\n",
            1,
            "unexpected column(s) 'volume'",
            id="extra-column",
        ),
        pytest.param(
            HEADER + "AAA,2024-01-02,1\nAAA,2024-01-03,2\nBBB,2024-13-01,3\nBBB,2024-01-02,x\n",
            4,
            "trade_date '2024-13-01' is not a date (there is no month 13)",
            id="bad-date",
        ),
        pytest.param(
            HEADER + "AAA,2024-01-02,1\nAAA,2023-02-29,2\n",
            3,
            "trade_date '2023-02-29' is not a date (February 2023 has 28 days)",
            id="no-such-day",
        ),
        pytest.param(
            HEADER + "AAA,2024-01-02,1\nAAA,02/01/2024,2\n",
            3,
            "unparsable trade_date '02/01/2024' (expected YYYY-MM-DD)",
            id="non-iso-date",
        ),
        pytest.param(
            HEADER + "AAA,2024-01-02,1\nAAA,2024-01-03,12.3.4\n",
            3,
            "unparsable close '12.3.4'",
            id="text-in-number",
        ),
        pytest.param(
            HEADER + "AAA,2024-01-02,1\nAAA,2024-01-03,abc\n",
            3,
            "unparsable close 'abc'",
            id="word-in-number",
        ),
        pytest.param(
            HEADER + "AAA,2024-01-02,1\nBBB,2024-01-02,2\nAAA,2024-01-02,1\nCCC,2024-99-99,1\n",
            4,
            "duplicate (symbol, trade_date) ('AAA', '2024-01-02'), first seen on line 2",
            id="duplicate-key",
        ),
        pytest.param(
            HEADER + "AAA,2024-01-02,1\n,2024-01-03,2\n", 3, "empty symbol", id="no-symbol"
        ),
        pytest.param(
            HEADER + "AAA,2024-01-02,1\n AAA,2024-01-03,2\n",
            3,
            "leading or trailing whitespace",
            id="symbol-whitespace",
        ),
        pytest.param(HEADER + "AAA,2024-01-02,\n", 2, "empty close", id="empty-close"),
        pytest.param(
            HEADER + "AAA,2024-01-02,1\nAAA,2024-01-03,2\nAAA,2024-01-04,1.5e",
            4,
            "unparsable close '1.5e'",
            id="truncated-last-line-in-number",
        ),
        pytest.param(
            HEADER + "AAA,2024-01-02,1\nAAA,2024-01-03,2\nAAA,2024-01-04",
            4,
            'missing data for column "close"',
            id="truncated-last-line-missing-field",
        ),
        pytest.param(
            HEADER + "AAA,2024-01-02,1\n\nAAA,2024-01-03,2\n", 3, "empty line", id="blank-line"
        ),
        pytest.param(
            HEADER + "AAA,2024-01-02,1,7\n", 2, "extra data after last expected column", id="extra"
        ),
    ],
)
def test_rejections_name_file_and_line_and_load_nothing(
    clean_db: sa.Engine, tmp_path: Path, content: str, line: int, fragment: str
) -> None:
    before = _seed(clean_db)
    path = _write(tmp_path, content)
    with pytest.raises(PricesImportError) as info:
        import_prices_csv(clean_db, path)
    error = info.value
    assert error.line == line
    assert str(error).startswith(f"{path} line {line}: ")
    assert fragment in str(error)
    assert _rows(clean_db) == before  # nothing loaded, nothing changed


def test_duplicate_of_existing_key_with_same_values_is_still_rejected(
    clean_db: sa.Engine, tmp_path: Path
) -> None:
    before = _seed(clean_db)  # AAA 2024-01-02 = 99.0 exists
    path = _write(tmp_path, HEADER + "AAA,2024-01-02,99\nZZZ,2024-01-02,1\nAAA,2024-01-02,99\n")
    with pytest.raises(PricesImportError, match=r"line 4: duplicate .* first seen on line 2"):
        import_prices_csv(clean_db, path)
    assert _rows(clean_db) == before


def test_first_offending_line_wins_across_kinds(clean_db: sa.Engine, tmp_path: Path) -> None:
    # A bad value on line 3 comes before the duplicate on line 4.
    path = _write(tmp_path, HEADER + "A,2024-01-02,1\nB,2024-01-02,x\nA,2024-01-02,1\n")
    with pytest.raises(PricesImportError, match=r"line 3: unparsable close 'x'"):
        import_prices_csv(clean_db, path)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        pytest.param(b"", "the file is empty", id="zero-bytes"),
        pytest.param(HEADER.encode(), "no data rows after the header", id="header-only"),
    ],
)
def test_empty_files_are_rejected(
    clean_db: sa.Engine, tmp_path: Path, content: bytes, fragment: str
) -> None:
    before = _seed(clean_db)
    path = _write(tmp_path, content)
    with pytest.raises(PricesImportError, match=fragment) as info:
        import_prices_csv(clean_db, path)
    assert str(info.value).startswith(str(path))
    assert _rows(clean_db) == before


def test_invalid_utf8_is_rejected_with_line(clean_db: sa.Engine, tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER.encode() + b"AAA,2024-01-02,1\nB\xff,2024-01-02,1\n")
    with pytest.raises(PricesImportError, match=r"line 3: invalid byte sequence"):
        import_prices_csv(clean_db, path)


def test_missing_file(clean_db: sa.Engine, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        import_prices_csv(clean_db, tmp_path / "absent.csv")


def test_partial_overlap_upserts(clean_db: sa.Engine, tmp_path: Path) -> None:
    _seed(clean_db)  # AAA 2024-01-02 exists
    path = _write(tmp_path, HEADER + "AAA,2024-01-02,5\nAAA,2030-01-02,6\n")
    report = import_prices_csv(clean_db, path)
    assert (report.inserted, report.updated, report.unchanged) == (1, 1, 0)
    assert _rows(clean_db)[("AAA", dt.date(2024, 1, 2))] == 5.0


@pytest.mark.parametrize("seeded", [False, True], ids=["plain-insert-path", "upsert-path"])
def test_duplicate_new_keys_rejected_on_both_load_paths(
    clean_db: sa.Engine, tmp_path: Path, seeded: bool
) -> None:
    if seeded:  # a key inside the file's date range exists: the upsert path is taken
        with clean_db.begin() as conn:
            conn.execute(
                prices.insert().values(symbol="Q", trade_date=dt.date(2025, 1, 3), close=1)
            )
    before = _rows(clean_db)
    indexes = _prices_indexes(clean_db)
    path = _write(tmp_path, HEADER + "N,2025-01-02,1\nN,2025-01-03,2\nN,2025-01-02,3\n")
    with pytest.raises(PricesImportError, match=r"line 4: duplicate .* first seen on line 2"):
        import_prices_csv(clean_db, path)
    assert _rows(clean_db) == before
    assert _prices_indexes(clean_db) == indexes  # the rolled-back index drop left them intact


def test_bulk_helpers_copy_and_upsert_typed_staging(clean_db: sa.Engine) -> None:
    _seed(clean_db)
    with clean_db.begin() as conn:
        staging = create_prices_staging(conn, "test_staging", typed=True)
        chunks = ["AAA\t2024-01-02\t1.25\nNEW\t2024-01-", "02\tNaN\n"]  # boundaries mid-row
        assert copy_text(conn, staging, ["symbol", "trade_date", "close"], chunks) == 2
        assert upsert_prices_from_staging(conn, staging) == (1, 1)
    rows = _rows(clean_db)
    assert rows[("AAA", dt.date(2024, 1, 2))] == 1.25
    assert math.isnan(rows[("NEW", dt.date(2024, 1, 2))])


def test_progress_reports_bytes_up_to_the_file_size(clean_db: sa.Engine, tmp_path: Path) -> None:
    rows = "".join(f"S{i:04d},2024-01-02,{10 + i}.5\n" for i in range(3000))
    path = _write(tmp_path, "symbol,trade_date,close\n" + rows)
    calls: list[tuple[int, int]] = []
    report = import_prices_csv(
        clean_db, path, progress=lambda done, total: calls.append((done, total))
    )
    assert report.inserted == 3000
    size = path.stat().st_size
    assert calls and calls[-1] == (size, size)
    assert all(total == size for _, total in calls)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


# ---------------------------------------------------------------------------------------------
# Hostile input: symbols, line lengths, COPY's end-of-data marker
# ---------------------------------------------------------------------------------------------

ROW = "2024-01-02,1\n"


def _csv_field(symbol: str) -> str:
    """``symbol`` as one CSV field (quoted when it has to be)."""
    if any(c in symbol for c in ',"\r\n'):
        return '"' + symbol.replace('"', '""') + '"'
    return symbol


@pytest.mark.parametrize(
    ("symbol", "fragment"),
    [
        pytest.param("X" * 65, "longer than 64 characters", id="65-chars"),
        pytest.param("日" * 65, "longer than 64 characters", id="65-multibyte-chars"),
        pytest.param("Y" * 4_000, "... (4,000 characters) is longer than 64", id="4000-chars"),
        pytest.param("Y" * 100_000, "line longer than 4,096 bytes", id="100KB"),
        pytest.param("A\rB", "U+000D", id="CR"),
        pytest.param("A\nB", "U+000A", id="LF"),
        pytest.param("A\tB", "U+0009", id="TAB"),
        pytest.param("A\x1bB", "U+001B", id="ESC"),
        pytest.param("A\x7f", "U+007F", id="DEL"),
        pytest.param("A\x85", "U+0085", id="C1-NEL"),
        pytest.param("A\u200bB", "U+200B ZERO WIDTH SPACE", id="zero-width-space"),
        pytest.param("A\u202eB", "U+202E RIGHT-TO-LEFT OVERRIDE", id="bidi-override"),
        pytest.param("\ufeffA", "U+FEFF ZERO WIDTH NO-BREAK SPACE", id="BOM-inside"),
        pytest.param("A\u00adB", "U+00AD SOFT HYPHEN", id="soft-hyphen"),
        pytest.param("A\u2028B", "U+2028 LINE SEPARATOR", id="line-separator"),
        pytest.param("AAA\u00a0", "leading or trailing whitespace", id="trailing-NBSP"),
        pytest.param("\u00a0AAA", "leading or trailing whitespace", id="leading-NBSP"),
        pytest.param("AAA\u3000", "leading or trailing whitespace", id="ideographic-space"),
        pytest.param("AAA\u2009", "leading or trailing whitespace", id="thin-space"),
        pytest.param("AAA ", "leading or trailing whitespace", id="trailing-space"),
        pytest.param('""', "empty symbol", id="quoted-empty"),
    ],
)
def test_hostile_symbols_are_refused_with_their_line(
    clean_db: sa.Engine, tmp_path: Path, symbol: str, fragment: str
) -> None:
    before = _seed(clean_db)
    field = symbol if symbol == '""' else _csv_field(symbol)
    text = HEADER + "AAA,2024-01-02,1\nBBB," + ROW + f"{field},{ROW}" + "CCC," + ROW
    path = _write(tmp_path, text.encode("utf-8"))
    with pytest.raises(PricesImportError) as info:
        import_prices_csv(clean_db, path)
    assert info.value.line == 4, str(info.value)
    assert str(info.value).startswith(f"{path} line 4: ")
    assert fragment in str(info.value)
    assert len(str(info.value)) < len(str(path)) + 250  # a huge symbol is cut in the message
    assert _rows(clean_db) == before


def test_nul_byte_is_refused_by_copy_with_its_line(clean_db: sa.Engine, tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER.encode() + b"AAA,2024-01-02,1\nA\x00B,2024-01-02,1\n")
    with pytest.raises(PricesImportError, match=r"line 3: invalid byte sequence .* 0x00"):
        import_prices_csv(clean_db, path)


@pytest.mark.parametrize(
    "symbol",
    [
        "Z" * 64,
        "日" * 64,  # 64 characters, 192 bytes
        "BRK B",
        "BRK\u00a0B",  # inner whitespace of any kind is part of the name
        "📈 emoji",
        "\\.",  # COPY's end-of-data marker, inside a row: an ordinary symbol
        "Cafe\u0301",  # a combining accent is a letter (Mn), not a format character
    ],
)
def test_symbols_at_the_limits_are_accepted(
    clean_db: sa.Engine, tmp_path: Path, symbol: str
) -> None:
    path = _write(tmp_path, (HEADER + f"{_csv_field(symbol)},{ROW}ZZZ,{ROW}").encode("utf-8"))
    assert import_prices_csv(clean_db, path).inserted == 2
    assert set(_rows(clean_db)) == {(symbol, dt.date(2024, 1, 2)), ("ZZZ", dt.date(2024, 1, 2))}


def test_first_offending_line_wins_between_symbols_and_values(
    clean_db: sa.Engine, tmp_path: Path
) -> None:
    later_symbol = HEADER + "A,2024-01-02,1\nB,2024-13-01,1\nC\u200b,2024-01-02,1\n"
    with pytest.raises(PricesImportError, match=r"line 3: trade_date '2024-13-01' is not a date"):
        import_prices_csv(clean_db, _write(tmp_path, later_symbol.encode()))
    earlier_symbol = HEADER + "A\u200b,2024-01-02,1\nB,2024-13-01,1\nA,2024-01-02,1\n"
    with pytest.raises(PricesImportError, match=r"line 2: symbol .* U\+200B"):
        import_prices_csv(clean_db, _write(tmp_path, earlier_symbol.encode()))


def _line_of(n_bytes: int) -> bytes:
    """A valid price row of exactly ``n_bytes`` bytes (a close with many zeros)."""
    start = b"LONG,2024-01-02,1."
    return start + b"0" * (n_bytes - len(start))


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"], ids=["LF", "CRLF"])
def test_line_length_limit(clean_db: sa.Engine, tmp_path: Path, eol: bytes) -> None:
    """4096 bytes (line break not counted) load; 4097 are refused with the line number, in
    the header, in a data row, in the last row without a line break, and deep in the file
    (past the first 1 MiB chunk)."""
    assert MAX_LINE_BYTES == 4096
    header = HEADER.encode().replace(b"\n", eol)
    ok = _write(tmp_path, header + b"AAA,2024-01-02,1" + eol + _line_of(4096) + eol, "ok.csv")
    assert import_prices_csv(clean_db, ok).inserted == 2
    before = _rows(clean_db)

    cases = {
        "data": (header + b"AAA,2024-01-02,1" + eol + _line_of(4097) + eol, 3),
        "last": (header + b"AAA,2024-01-02,1" + eol + _line_of(4097), 3),
        "header": (b"symbol,trade_date,close" + b" " * 4080 + eol + b"A,2024-01-02,1" + eol, 1),
        "deep": (
            header
            + b"".join(b"D%06d,2024-01-02,1" % i + eol for i in range(60_000))  # ~1.1 MiB
            + _line_of(50_000)
            + eol,
            60_002,
        ),
    }
    for name, (content, line) in cases.items():
        path = _write(tmp_path, content, f"{name}.csv")
        with pytest.raises(PricesImportError) as info:
            import_prices_csv(clean_db, path)
        assert info.value.line == line, (name, str(info.value))
        assert str(info.value) == (
            f"{path} line {line}: line longer than 4,096 bytes (not a price row; a line ends "
            "with \\n or \\r\\n)"
        )
        assert _rows(clean_db) == before, name


def test_an_over_long_line_never_reaches_the_server(tmp_path: Path) -> None:
    """What the importer hands to COPY: whole lines only, checked first; an over-long first
    data line raises before a single byte is handed over, after reading one chunk."""
    path = _write(tmp_path, HEADER.encode() + b"A" * (5 << 20) + b"\nB,2024-01-02,1\n")
    sent: list[bytes] = []
    with path.open("rb") as stream:
        stream.readline()
        with pytest.raises(PricesImportError, match="line 2: line longer than"):
            for piece in checked_lines(path, stream):
                sent.append(piece)
        assert stream.tell() <= len(HEADER) + (1 << 20)  # one chunk read, not the line
    assert sent == []

    rows = b"".join(b"S%d,2024-01-02,1\n" % i for i in range(100_000))  # > 1 MiB
    path = _write(tmp_path, HEADER.encode() + rows + b"\\.\n" + rows, "marker.csv")
    with path.open("rb") as stream:
        stream.readline()
        with pytest.raises(PricesImportError, match="line 100002: a line holding only"):
            for piece in checked_lines(path, stream):
                sent.append(piece)
    assert b"".join(sent) == rows[: len(b"".join(sent))] and b"\\." not in b"".join(sent)


@pytest.mark.parametrize(
    ("content", "line"),
    [
        pytest.param(HEADER + "A,2024-01-02,1\n\\.\nB,2024-01-02,2\n", 3, id="middle"),
        pytest.param(HEADER + "A,2024-01-02,1\n\\.\n", 3, id="last-line"),
        pytest.param(HEADER + "A,2024-01-02,1\n\\.", 3, id="end-without-line-break"),
        pytest.param(
            (HEADER + "A,2024-01-02,1\n\\.\nB,2024-01-02,2\n").replace("\n", "\r\n"), 3, id="CRLF"
        ),
        pytest.param(HEADER + "\\.\n" + "A,2024-01-02,1\n", 2, id="first-row"),
    ],
)
def test_lone_end_of_data_marker_is_refused(
    clean_db: sa.Engine, tmp_path: Path, content: str, line: int
) -> None:
    """``\\.`` alone on a line (COPY's end-of-data marker; see test_prices_import_servers.py
    for what PostgreSQL 15-17 would do with it)."""
    before = _seed(clean_db)
    path = _write(tmp_path, content.encode())
    with pytest.raises(PricesImportError) as info:
        import_prices_csv(clean_db, path)
    assert str(info.value) == (
        f"{path} line {line}: a line holding only \\. (COPY's end-of-data marker: PostgreSQL "
        "17 and older would silently drop every line after it)"
    )
    assert _rows(clean_db) == before
