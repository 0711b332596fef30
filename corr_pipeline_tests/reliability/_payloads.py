"""Publication payloads for the reliability tests, importable without Dagster (the publisher
child processes import only this and :mod:`corr_pipeline.db`, so they start fast)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np

from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE


def publish_arguments(
    day: dt.date, *, n: int, k: int, version: int, n_pairs: int | None = None
) -> dict[str, Any]:
    """SPEC-shaped results of ``n`` symbols for :func:`publish_snapshot` (vectorised, so large
    payloads build in milliseconds); ``version`` changes every value and is recorded in
    ``params``, so two versions are told apart row by row."""
    rng = np.random.default_rng(version)
    rows = np.arange(n)[:, None]
    index = ((rows + 1 + np.arange(k)[None, :] * (version % 3 + 1)) % n).astype(np.int32)
    corr = -np.sort(-rng.uniform(0.05, 0.99, (n, k)), axis=1).astype(np.float32)
    overlap = rng.integers(20, 250, (n, k)).astype(np.int16)
    m = n if n_pairs is None else n_pairs
    pairs = np.zeros(m, dtype=LEAD_LAG_DTYPE)
    pairs["leader"] = np.arange(m) % n
    pairs["lagger"] = (pairs["leader"] + 1 + np.arange(m) // n) % n
    pairs["lag"] = rng.integers(1, 4, m)
    pairs["lagged_corr"] = rng.uniform(0.3, 0.9, m)
    pairs["sync_corr"] = rng.uniform(-0.1, 0.1, m)
    pairs["improvement"] = np.abs(pairs["lagged_corr"]) - np.abs(pairs["sync_corr"])
    pairs["overlap"] = rng.integers(20, 250, m)
    pairs["p_value"] = 10.0 ** -rng.uniform(0, 12, m)
    pairs["q_value"] = np.minimum(1.0, pairs["p_value"] * 1e3)
    return dict(
        snapshot_date=day,
        as_of_trade_date=day,
        symbols=[f"V{version}_{i:06d}" for i in range(n)],
        n_dropped=version,
        lookback_days=40,
        params={"version": version},
        neighbor_index=index,
        neighbor_corr=corr,
        neighbor_overlap=overlap,
        cluster_labels=(np.arange(n) % 7).astype(np.int32),
        lead_lag_pairs=pairs,
    )


def expected_counts(arguments: dict[str, Any]) -> dict[str, int]:
    """Rows per table that publishing ``arguments`` writes."""
    return {
        "snapshots": 1,
        "peer_neighbors": int(np.count_nonzero(arguments["neighbor_index"] >= 0)),
        "symbol_clusters": len(arguments["symbols"]),
        "lead_lag_pairs": int(arguments["lead_lag_pairs"].shape[0]),
    }


def with_application_name(url: str, name: str) -> str:
    """``url`` with libpq's ``application_name`` set, so the test finds the child's backend in
    ``pg_stat_activity``."""
    from sqlalchemy.engine import make_url

    return (
        make_url(url)
        .update_query_dict({"application_name": name})
        .render_as_string(hide_password=False)
    )
