"""The whole snapshot from a schema that is not ours (issue 14, item 1), bit for bit against the
native ``prices`` table holding the same (rounded) values: the returns matrix, corr, overlap,
neighbors, clusters, lead-lag pairs and the published rows; through the steps and through
Dagster (``price_source`` resource), and the one-line, non-retried failure of a bad source.

The ``market`` fixture (``corr_pipeline_tests/fixtures/price_source.py``) builds
``market.eod_prices(ticker text, dt date, adj_close numeric(18,6), volume bigint)``, the
``market.xnys_closes`` view (renamed columns, XLON listings filtered out) and loads ``prices``
with ``adj_close::float8`` of the same rows.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
import sqlalchemy as sa

from corr_pipeline import settings
from corr_pipeline.compute.tiling import overlap_dtype
from corr_pipeline.db.price_source import NATIVE_PRICES, PriceSource
from corr_pipeline.db.publish import publish_snapshot
from corr_pipeline.defs.assets import snapshot_assets
from corr_pipeline.defs.resources import SnapshotParams
from corr_pipeline.query import peers
from corr_pipeline.query.errors import UnknownSymbolError
from corr_pipeline.snapshot import steps
from corr_pipeline.snapshot.params import SnapshotParameters
from corr_pipeline.store.matrix_store import MatrixStore
from corr_pipeline_tests.defs.events import materializations
from corr_pipeline_tests.fixtures.commands import run_cli
from corr_pipeline_tests.fixtures.deployment import resources_at
from corr_pipeline_tests.fixtures.pipeline import SIXTY_DAYS
from corr_pipeline_tests.fixtures.price_source import EOD, LAST, VIEW

PARAMS = {**SIXTY_DAYS, "max_q_value": 0.05}  # the default q-value condition
PUBLISHED = {
    "snapshots": "SELECT snapshot_date, as_of_trade_date, n_symbols, n_dropped, lookback_days, "
    "params FROM snapshots WHERE snapshot_date = :d",
    "peer_neighbors": "SELECT * FROM peer_neighbors WHERE snapshot_date = :d ORDER BY 2, 3",
    "symbol_clusters": "SELECT * FROM symbol_clusters WHERE snapshot_date = :d ORDER BY 2",
    "lead_lag_pairs": "SELECT * FROM lead_lag_pairs WHERE snapshot_date = :d ORDER BY 2, 3",
}


def published_rows(engine: sa.Engine, day: dt.date) -> dict[str, str]:
    """The published rows of ``day``, as ``repr`` (exact floats, NaN == NaN)."""
    with engine.connect() as conn:
        return {t: repr(conn.execute(sa.text(q), {"d": day}).all()) for t, q in PUBLISHED.items()}


def snapshot_through_steps(engine: sa.Engine, source: PriceSource) -> dict:
    """The chain of snapshot/steps.py on ``source``, published; every array and row."""
    params = SnapshotParameters(**PARAMS)
    window = steps.load_returns(engine, LAST, params, source=source)
    R = window.returns
    n = R.shape[1]
    corr = np.empty((n, n), np.float32)
    overlap = np.empty((n, n), overlap_dtype(R.shape[0]))
    steps.correlation(R, params.correlation, out_corr=corr, out_overlap=overlap)
    found = steps.neighbors(corr, overlap, params.neighbors)
    labels = steps.clusters(corr, params.clusters)
    pairs = steps.lead_lag(R, corr, params.lead_lag)
    publish_snapshot(
        engine,
        steps.results_for_publication(
            LAST,
            as_of_trade_date=window.as_of_trade_date,
            symbols=window.symbols,
            n_dropped=len(window.dropped),
            params=params,
            found=found,
            labels=labels,
            pairs=pairs,
            recorded={"bad_prices": window.bad_prices},
        ),
    )
    return {
        "symbols": window.symbols,
        "dates": window.dates,
        "dropped": window.dropped,
        "R": R.tobytes(),
        "corr": corr.tobytes(),
        "overlap": overlap.tobytes(),
        "neighbors": (
            found.index.tobytes(),
            found.corr.tobytes(),
            np.asarray(found.overlap).tobytes(),
        ),
        "clusters": labels.tobytes(),
        "lead_lag": pairs.tobytes(),
        "published": published_rows(engine, LAST),
    }


def test_snapshot_from_their_table_and_a_view_equals_the_native_table_bit_for_bit(market):
    native = snapshot_through_steps(market, NATIVE_PRICES)
    theirs = snapshot_through_steps(market, EOD)
    assert len(native["symbols"]) > 50 and native["dropped"]
    assert theirs == native
    # the view keeps the XNYS listings: the native table with the same rows
    with market.begin() as conn:
        conn.execute(sa.text("DELETE FROM prices WHERE right(symbol, 1) IN ('3', '7')"))
    native_xnys = snapshot_through_steps(market, NATIVE_PRICES)
    view = snapshot_through_steps(market, VIEW)
    assert view == native_xnys
    assert len(view["symbols"]) < len(native["symbols"])


def _materialize(store: Path, **source: str) -> dg.ExecuteInProcessResult:
    """A run on the store ``store`` with the price source settings ``source`` (names of
    :mod:`corr_pipeline.settings`' variables → values): deployment configuration."""
    for name, value in source.items():
        os.environ[name] = value
    resources = resources_at(store)
    resources["snapshot_params"] = SnapshotParams(**PARAMS)
    return dg.materialize(
        snapshot_assets,
        partition_key=LAST.isoformat(),
        resources=resources,
        raise_on_error=False,
    )


def test_dagster_runs_on_the_view_equal_the_native_run(market, tmp_path):
    with market.begin() as conn:
        conn.execute(sa.text("DELETE FROM prices WHERE right(symbol, 1) IN ('3', '7')"))
    native = _materialize(tmp_path / "native")
    assert native.success
    native_rows = published_rows(market, LAST)
    view = _materialize(
        tmp_path / "view",
        **{
            settings.ENV_PRICES_TABLE: "market.xnys_closes",
            settings.ENV_PRICES_COLUMNS: "sym,session,px",
        },
    )
    assert view.success
    assert published_rows(market, LAST) == native_rows
    meta = materializations(view, "returns_matrix")[0].metadata
    assert meta["price_source"].value == "view market.xnys_closes (sym, session, px)"
    for asset, names in {
        "returns_matrix": ["returns"],
        "correlation_matrix": ["corr"],
        "overlap_matrix": ["overlap"],
        "top_k_neighbors": ["index", "corr", "overlap"],
        "clusters": ["labels"],
        "lead_lag_pairs": ["pairs"],
    }.items():
        a = MatrixStore(tmp_path / "native").load_bundle(asset, LAST.isoformat())
        b = MatrixStore(tmp_path / "view").load_bundle(asset, LAST.isoformat())
        assert a.labels == b.labels, asset
        for name in names:
            if name in a.arrays:
                assert np.asarray(a[name]).tobytes() == np.asarray(b[name]).tobytes(), (asset, name)

    # the dropped-symbol hint of the queries reads the configured source
    with pytest.raises(UnknownSymbolError) as err:
        peers(market, "S00003", LAST, price_source=EOD)
    assert err.value.has_prices  # listed in their table, filtered out of the view
    with pytest.raises(UnknownSymbolError) as err:
        peers(market, "S00003", LAST, price_source=VIEW)
    assert not err.value.has_prices
    env = {**__import__("os").environ, settings.ENV_PRICES_TABLE: "market.eod_prices",
           settings.ENV_PRICES_COLUMNS: "ticker,dt,adj_close"}  # fmt: skip
    cli = run_cli("query", "peers", "S00003", "--date", LAST.isoformat(), env=env)
    assert cli.returncode == 2 and "it has prices but was dropped" in cli.stderr, cli.stderr


@pytest.mark.parametrize(
    ("env", "fields", "line"),
    [
        ({}, {settings.ENV_PRICES_TABLE: "market.nope"},
         "price source market.nope (symbol, trade_date, close): table or view market.nope does not exist"),
        ({settings.ENV_PRICES_TABLE: "market.eod_prices", settings.ENV_PRICES_COLUMNS: "ticker,dt"}, {},
         "CORR_PIPELINE_PRICES_COLUMNS='ticker,dt': expected 3 columns (symbol, trade date, price, in that order), got 2"),
        ({settings.ENV_PRICES_TABLE: "market.eod_prices", settings.ENV_PRICES_COLUMNS: "ticker,volume,adj_close"}, {},
         "price source market.eod_prices (ticker, volume, adj_close): the trade date column volume is bigint; "
         "expected date, timestamp or timestamp with time zone"),
    ],
)  # fmt: skip
def test_a_bad_source_fails_the_run_in_one_line_not_retried(
    market,
    tmp_path,
    monkeypatch,
    env,
    fields,
    line,
):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = published_rows(market, LAST)
    result = _materialize(tmp_path / "store", **fields)
    assert not result.success
    kinds = [e.event_type_value for e in result.all_events]
    assert "STEP_UP_FOR_RETRY" not in kinds
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_key == "snapshot"
    assert failure.event_specific_data.error.message.strip().endswith(line)
    assert failure.event_specific_data.user_failure_data.description == line
    assert published_rows(market, LAST) == before


def test_the_cli_refuses_a_bad_source_in_one_line(market):
    env = {**__import__("os").environ, settings.ENV_PRICES_TABLE: "market.eod_prices",
           settings.ENV_PRICES_COLUMNS: "ticker,dt,volume2"}  # fmt: skip
    result = run_cli("demo", env=env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "corr-pipeline: error: price source market.eod_prices (ticker, dt, volume2): table "
        "market.eod_prices has no column volume2 (the price column; its columns: ticker, dt, "
        "adj_close, volume)"
    )
    with market.connect() as conn:  # nothing was seeded into prices or written to theirs
        assert conn.execute(sa.text("SELECT count(*) FROM market.eod_prices")).scalar() > 0
