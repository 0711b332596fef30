"""The PostgreSQL schema (SQLAlchemy Core) at the newest migration: input prices (SPEC §1),
published snapshots (SPEC §7), and the synthetic data's ground truth apart.

The database is created and changed only by the versioned migrations in ``db/migrations``
(:mod:`corr_pipeline.db.migrate`; ``corr-pipeline db upgrade``): these Table objects describe what
the newest revision creates, for the queries and inserts; ``corr_pipeline_tests/db/test_migrations``
checks that the two agree.

Tables
------
``prices``                   (symbol, trade_date) -> close. Index on trade_date for the window query
                             (SPEC §2 filters by a date range).
``snapshots``                one row per snapshot_date; params is the jsonb of the run config;
                             matrix_versions (jsonb, NULL-able) the matrix-store versions the
                             snapshot was computed from, ``{asset: {array: version}}`` (SPEC §8).
``peer_neighbors``           (snapshot_date, symbol, rank) -> neighbor, corr, overlap; rank starts at 1.
                             Padding entries (fewer than k finite neighbors, SPEC §4) are not stored.
``symbol_clusters``          (snapshot_date, symbol) -> cluster_id; indexed by (snapshot_date, cluster_id)
                             for "members of this cluster".
``lead_lag_pairs``           (snapshot_date, leader, lagger) -> lag, lagged_corr, sync_corr (NULL-able,
                             NaN allowed), improvement, overlap, p_value and q_value (double
                             precision: the Šidák p-value of the best lag and its
                             Benjamini–Hochberg q-value, SPEC §6 "Significance"; NULL in
                             snapshots published before migration 0007), reverse_lag,
                             reverse_lagged_corr and reverse_q_value (the best lag, its lagged
                             correlation and q-value of the ordered pair the other way,
                             (lagger, leader), SPEC §6 "Direction": NULL when that pair has no
                             best lag, and in snapshots published before migration 0008);
                             indexed by (snapshot_date, lagger) for "who leads this symbol".
``change_summaries``         one row per snapshot_date whose changes against the previous
                             published session were computed (SPEC §10): the market-level drift,
                             the parts skipped, the publications (``created_at``) of both dates
                             it was computed from (stale when either was re-published), the
                             calendar's sessions between the two (0: overnight); parent
                             of the four ``change_*`` tables below
                             (``FOREIGN KEY ... ON DELETE CASCADE``: a few thousand rows a date).
``change_pairs``             (snapshot_date, rank) -> the top moves by |Δcorr|.
``change_symbols``           (snapshot_date, symbol) -> kept/entered/left, cluster move, neighbor
                             turnover; one row per symbol of either day.
``change_clusters``          (snapshot_date, line) -> a cluster matched, appeared or vanished.
``change_lead_lag``          (snapshot_date, leader, lagger) -> appeared/vanished/lag changed.
``suspect_prices``           (snapshot_date, symbol) -> zero_return_share, max_abs_return,
                             reason, dropped: the snapshot's suspect prices (SPEC §2; migration
                             0010), written in the publication's transaction
                             (``FOREIGN KEY ... ON DELETE CASCADE``: a handful of rows a date).
``synthetic.lead_lag_truth`` (leader, lagger) -> lag, seed: the lead-lag pairs the synthetic
                             universe generator injected, so tests and the demo can check
                             recovery. In its own PostgreSQL schema ``synthetic``, apart from the
                             production tables (empty in a production database).

The three per-snapshot child tables reference ``snapshots`` (every child row's ``snapshot_date``
has a ``snapshots`` row; deleting a ``snapshots`` row deletes its children) through
statement-level triggers, not a ``FOREIGN KEY`` (migration 0002 says why). Replacing a snapshot
is a delete + inserts in one transaction (:func:`corr_pipeline.db.publish.publish_snapshot`;
SPEC §7: never duplicated, never half-written).

Symbol columns use ``COLLATE "C"`` (code-point order, see ``SYMBOL``).
Correlations are float32 in the pipeline (SPEC §3), so they are stored as ``real``: exact, and half
the size of ``double precision``. The p- and q-values are float64 (a strong pair's p-value is far
below float32's range) and stored as ``double precision``.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

metadata = sa.MetaData()

#: Symbols are text compared byte-wise (``COLLATE "C"``): for UTF-8 that is code-point order, the
#: order SPEC §2 uses for matrix columns, whatever the server's default locale; it is also the
#: cheapest comparison for the primary-key B-trees.
SYMBOL = sa.Text(collation="C")

prices = sa.Table(
    "prices",
    metadata,
    sa.Column("symbol", SYMBOL, primary_key=True),
    sa.Column("trade_date", sa.Date, primary_key=True),
    sa.Column("close", sa.Double, nullable=False),
    sa.Index("ix_prices_trade_date", "trade_date"),
)

snapshots = sa.Table(
    "snapshots",
    metadata,
    sa.Column("snapshot_date", sa.Date, primary_key=True),
    sa.Column("as_of_trade_date", sa.Date, nullable=False),
    sa.Column("n_symbols", sa.Integer, nullable=False),
    sa.Column("n_dropped", sa.Integer, nullable=False),
    sa.Column("lookback_days", sa.Integer, nullable=False),
    sa.Column("params", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    # {asset: {array: version}} pinned in the matrix store; NULL: published without a store
    # (or before versions were recorded), readers then use the store's current versions
    sa.Column("matrix_versions", JSONB, nullable=True),
)


peer_neighbors = sa.Table(
    "peer_neighbors",
    metadata,
    sa.Column("snapshot_date", sa.Date, primary_key=True),
    sa.Column("symbol", SYMBOL, primary_key=True),
    sa.Column("rank", sa.SmallInteger, primary_key=True),
    sa.Column("neighbor", SYMBOL, nullable=False),
    sa.Column("corr", sa.REAL, nullable=False),
    sa.Column("overlap", sa.Integer, nullable=False),
    sa.CheckConstraint("rank >= 1", name="ck_peer_neighbors_rank_positive"),
)

symbol_clusters = sa.Table(
    "symbol_clusters",
    metadata,
    sa.Column("snapshot_date", sa.Date, primary_key=True),
    sa.Column("symbol", SYMBOL, primary_key=True),
    sa.Column("cluster_id", sa.Integer, nullable=False),
    sa.Index("ix_symbol_clusters_cluster", "snapshot_date", "cluster_id"),
)

lead_lag_pairs = sa.Table(
    "lead_lag_pairs",
    metadata,
    sa.Column("snapshot_date", sa.Date, primary_key=True),
    sa.Column("leader", SYMBOL, primary_key=True),
    sa.Column("lagger", SYMBOL, primary_key=True),
    sa.Column("lag", sa.SmallInteger, nullable=False),
    sa.Column("lagged_corr", sa.REAL, nullable=False),
    sa.Column("sync_corr", sa.REAL, nullable=True),
    sa.Column("improvement", sa.REAL, nullable=False),
    sa.Column("overlap", sa.Integer, nullable=False),
    sa.Index("ix_lead_lag_pairs_lagger", "snapshot_date", "lagger"),
    # the significance of the best lag (SPEC §6; migration 0007; NULL before)
    sa.Column("p_value", sa.Double, nullable=True),
    sa.Column("q_value", sa.Double, nullable=True),
    # the reverse direction, (lagger, leader) (SPEC §6 "Direction"; migration 0008; NULL when
    # that pair has no best lag, and before)
    sa.Column("reverse_lag", sa.SmallInteger, nullable=True),
    sa.Column("reverse_lagged_corr", sa.REAL, nullable=True),
    sa.Column("reverse_q_value", sa.Double, nullable=True),
)

# ---- the changes against the previous session (SPEC §10, migration 0005) ----------------------

change_summaries = sa.Table(
    "change_summaries",
    metadata,
    sa.Column("snapshot_date", sa.Date, primary_key=True),
    sa.Column("previous_date", sa.Date, nullable=False),
    sa.Column("n_symbols", sa.Integer, nullable=False),
    sa.Column("n_previous_symbols", sa.Integer, nullable=False),
    sa.Column("n_common", sa.Integer, nullable=False),
    sa.Column("n_entered", sa.Integer, nullable=False),
    sa.Column("n_left", sa.Integer, nullable=False),
    sa.Column("n_pairs", sa.BigInteger, nullable=True),
    sa.Column("mean_corr", sa.Double, nullable=True),
    sa.Column("previous_mean_corr", sa.Double, nullable=True),
    sa.Column("mean_abs_corr", sa.Double, nullable=True),
    sa.Column("previous_mean_abs_corr", sa.Double, nullable=True),
    sa.Column("mean_change", sa.Double, nullable=True),
    sa.Column("mean_abs_change", sa.Double, nullable=True),
    sa.Column("quantiles", JSONB, nullable=True),
    sa.Column("change_histogram", JSONB, nullable=True),
    sa.Column("skipped", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column("params", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    ),
    sa.CheckConstraint("previous_date < snapshot_date", name="ck_change_summaries_previous"),
    # the snapshots.created_at of the two publications compared (migration 0006; NULL before)
    sa.Column("snapshot_published_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("previous_published_at", sa.DateTime(timezone=True), nullable=True),
    # the calendar's sessions strictly between the two dates (migration 0009; NULL before)
    sa.Column("sessions_between", sa.Integer, nullable=True),
    sa.CheckConstraint("sessions_between >= 0", name="ck_change_summaries_sessions_between"),
)


def _change_date() -> sa.Column:
    return sa.Column(
        "snapshot_date",
        sa.Date,
        sa.ForeignKey("change_summaries.snapshot_date", ondelete="CASCADE"),
        primary_key=True,
    )


change_pairs = sa.Table(
    "change_pairs",
    metadata,
    _change_date(),
    sa.Column("rank", sa.SmallInteger, primary_key=True),
    sa.Column("symbol_a", SYMBOL, nullable=False),
    sa.Column("symbol_b", SYMBOL, nullable=False),
    sa.Column("corr", sa.REAL, nullable=False),
    sa.Column("previous_corr", sa.REAL, nullable=False),
    sa.Column("overlap", sa.Integer, nullable=False),
    sa.Column("previous_overlap", sa.Integer, nullable=False),
    sa.Column("change", sa.Double, nullable=False),
    sa.CheckConstraint("rank >= 1", name="ck_change_pairs_rank_positive"),
)

change_symbols = sa.Table(
    "change_symbols",
    metadata,
    _change_date(),
    sa.Column("symbol", SYMBOL, primary_key=True),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("cluster_id", sa.Integer, nullable=True),
    sa.Column("previous_cluster_id", sa.Integer, nullable=True),
    sa.Column("moved", sa.Boolean, nullable=True),
    sa.Column("n_neighbors", sa.Integer, nullable=True),
    sa.Column("new_neighbors", sa.Integer, nullable=True),
    sa.CheckConstraint("status IN ('kept', 'entered', 'left')", name="ck_change_symbols_status"),
)

change_clusters = sa.Table(
    "change_clusters",
    metadata,
    _change_date(),
    sa.Column("line", sa.Integer, primary_key=True),
    sa.Column("cluster_id", sa.Integer, nullable=True),
    sa.Column("previous_cluster_id", sa.Integer, nullable=True),
    sa.Column("size", sa.Integer, nullable=False),
    sa.Column("previous_size", sa.Integer, nullable=False),
    sa.Column("shared", sa.Integer, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("split", sa.Boolean, nullable=False),
    sa.Column("merged", sa.Boolean, nullable=False),
    sa.CheckConstraint(
        "status IN ('matched', 'appeared', 'vanished')", name="ck_change_clusters_status"
    ),
)

change_lead_lag = sa.Table(
    "change_lead_lag",
    metadata,
    _change_date(),
    sa.Column("leader", SYMBOL, primary_key=True),
    sa.Column("lagger", SYMBOL, primary_key=True),
    sa.Column("change", sa.Text, nullable=False),
    sa.Column("lag", sa.SmallInteger, nullable=True),
    sa.Column("previous_lag", sa.SmallInteger, nullable=True),
    sa.Column("improvement", sa.REAL, nullable=True),
    sa.Column("previous_improvement", sa.REAL, nullable=True),
    sa.CheckConstraint(
        "change IN ('appeared', 'vanished', 'lag_changed')", name="ck_change_lead_lag_change"
    ),
)

#: The market-level drift of a change summary (SPEC §10.1): means of today and the previous
#: session and the mean (absolute) change over the pairs compared.
DRIFT_COLUMNS = (
    "mean_corr",
    "previous_mean_corr",
    "mean_abs_corr",
    "previous_mean_abs_corr",
    "mean_change",
    "mean_abs_change",
)

#: The tables a publication of changes writes, parent first (SPEC §10).
CHANGE_TABLES = (
    "change_summaries",
    "change_pairs",
    "change_symbols",
    "change_clusters",
    "change_lead_lag",
)

#: The PostgreSQL schema of the synthetic data, apart from the production tables.
SYNTHETIC_SCHEMA = "synthetic"

synthetic_lead_lag_truth = sa.Table(
    "lead_lag_truth",
    metadata,
    sa.Column("leader", SYMBOL, primary_key=True),
    sa.Column("lagger", SYMBOL, primary_key=True),
    sa.Column("lag", sa.SmallInteger, nullable=False),
    sa.Column("seed", sa.Integer, nullable=False),
    schema=SYNTHETIC_SCHEMA,
)

# ---- the snapshot's suspect prices (SPEC §2, migration 0010) ----------------------------------

suspect_prices = sa.Table(
    "suspect_prices",
    metadata,
    sa.Column(
        "snapshot_date",
        sa.Date,
        sa.ForeignKey("snapshots.snapshot_date", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("symbol", SYMBOL, primary_key=True),
    sa.Column("zero_return_share", sa.Double, nullable=False),
    sa.Column("max_abs_return", sa.Double, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("dropped", sa.Boolean, nullable=False),
    sa.CheckConstraint(
        "zero_return_share >= 0 AND zero_return_share <= 1",
        name="ck_suspect_prices_zero_return_share",
    ),
    sa.CheckConstraint("max_abs_return >= 0", name="ck_suspect_prices_max_abs_return"),
)

#: The production tables, children before parents (safe order for TRUNCATE/DELETE).
PRODUCTION_TABLES: tuple[sa.Table, ...] = (
    change_pairs,
    change_symbols,
    change_clusters,
    change_lead_lag,
    change_summaries,
    peer_neighbors,
    symbol_clusters,
    lead_lag_pairs,
    suspect_prices,
    snapshots,
    prices,
)

#: Every table holding data: the production tables, then the synthetic ground truth.
ALL_TABLES: tuple[sa.Table, ...] = (*PRODUCTION_TABLES, synthetic_lead_lag_truth)

#: The per-snapshot tables that reference ``snapshots``.
SNAPSHOT_CHILD_TABLES = ("peer_neighbors", "symbol_clusters", "lead_lag_pairs")

#: Every table a snapshot publication writes, parent first.
PUBLISHED_TABLES = ("snapshots", *SNAPSHOT_CHILD_TABLES)


def init_schema(engine: sa.Engine) -> None:
    """Create the schema of a fresh database, or upgrade an older one, to the newest revision:
    ``corr-pipeline db init`` (:func:`corr_pipeline.db.migrate.upgrade`). Idempotent, safe to
    call from several processes at once. The pipeline and the queries never call it: they
    refuse a database that is not at the newest revision
    (:func:`corr_pipeline.db.migrate.require_current`)."""
    from corr_pipeline.db.migrate import upgrade

    upgrade(engine)


def truncate_all(engine: sa.Engine) -> None:
    """Empty every table of the schema (tests and ``demo --reset`` style tooling)."""
    names = ", ".join(table.fullname for table in ALL_TABLES)
    with engine.begin() as conn:
        conn.execute(sa.text(f"TRUNCATE {names}"))
