"""``corr-pipeline demo``: seed an empty database, materialize the latest partition, summarize."""

from __future__ import annotations

import os

import sqlalchemy as sa

from corr_pipeline import settings
from corr_pipeline.cli.demo import DemoContext, demo_params, run_demo


def test_demo_seeds_materializes_and_explains_the_ui(clean_db: sa.Engine, monkeypatch) -> None:
    lines: list[str] = []
    monkeypatch.setenv(settings.ENV_DATABASE_URL, os.environ[settings.ENV_DATABASE_URL])
    ctx = DemoContext(symbols=200, days=80, seed=11, echo=lines.append)
    run_demo(ctx)
    text = "\n".join(lines)
    assert "seeding a synthetic universe of 200 symbols" in text
    assert "pipeline: materializing snapshot_job for partition 2026-11-27" in text
    assert "short price history: using {'lookback_days': 79" in text
    assert "snapshot 2026-11-27 succeeded" in text
    assert "checks: 9/9 passed" in text
    assert "DAGSTER_HOME=" in text and " dg dev" in text and " corr-pipeline ui" in text
    with clean_db.connect() as conn:
        row = conn.execute(
            sa.text("SELECT n_symbols, lookback_days FROM snapshots WHERE snapshot_date = :d"),
            {"d": "2026-11-27"},
        ).one()
        clusters = conn.execute(
            sa.text("SELECT count(*) FROM symbol_clusters WHERE snapshot_date = :d"),
            {"d": "2026-11-27"},
        ).scalar_one()
    assert row.lookback_days == 79
    assert clusters == row.n_symbols > 150
    assert f"{row.n_symbols} symbols kept" in text


def test_demo_params_keep_defaults_for_a_full_window(clean_db: sa.Engine) -> None:
    from corr_pipeline.db.synth import write_synthetic_universe

    write_synthetic_universe(clean_db, n_symbols=20, n_days=260, seed=1)
    assert demo_params(clean_db, "2026-11-27") == {}
    shorter = demo_params(clean_db, "2026-06-01")
    assert shorter["lookback_days"] < 252
    assert shorter["min_overlap"] <= shorter["min_history_days"] <= shorter["lookback_days"]
