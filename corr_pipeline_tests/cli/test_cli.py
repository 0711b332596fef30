"""The ``corr-pipeline`` command, run as a real subprocess against the test database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from corr_pipeline import settings
from corr_pipeline.cli.demo import DemoContext, demo_step_database, demo_step_prices, run_demo
from corr_pipeline.db.schema import prices
from corr_pipeline_tests.fixtures.commands import run_cli


def _count(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(prices)).scalar_one())


def test_db_init_and_url(clean_db: sa.Engine) -> None:
    result = run_cli("db", "init")
    assert result.returncode == 0, result.stderr
    assert "schema ready" in result.stdout
    url = run_cli("db", "url")
    assert url.returncode == 0, url.stderr
    assert url.stdout.startswith("postgresql+psycopg://")
    assert settings.ENV_DATABASE_URL in url.stdout


def test_prices_import_success_and_rejection(clean_db: sa.Engine, tmp_path: Path) -> None:
    good = tmp_path / "good.csv"
    good.write_text("symbol,trade_date,close\nAAA,2024-01-02,1\nAAA,2024-01-03,0\n")
    result = run_cli("prices", "import", str(good))
    assert result.returncode == 0, result.stderr
    assert "2 rows (2 inserted, 0 updated, 0 unchanged)" in result.stdout
    assert "1 non-positive/NaN/infinite closes" in result.stdout
    assert _count(clean_db) == 2

    bad = tmp_path / "bad.csv"
    bad.write_text("symbol,trade_date,close\nBBB,2024-01-02,1\nBBB,2024-02-30,2\n")
    result = run_cli("prices", "import", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"corr-pipeline: error: {bad} line 3: trade_date '2024-02-30' is not a date "
        "(February 2024 has 29 days)"
    )
    assert "Traceback" not in result.stderr
    assert _count(clean_db) == 2  # nothing from the bad file

    missing = run_cli("prices", "import", str(tmp_path / "absent.csv"))
    assert missing.returncode == 2
    assert "absent.csv: no such file" in missing.stderr


def test_unreachable_database_is_one_line_without_password(tmp_path: Path) -> None:
    env = dict(os.environ)
    env[settings.ENV_DATABASE_URL] = "postgresql://carol:Sup3rS3cret@127.0.0.1:1/prices"
    result = run_cli("db", "init", env=env)
    assert result.returncode == 2
    assert "Sup3rS3cret" not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("corr-pipeline: error: cannot connect")
    assert "carol:***@127.0.0.1:1/prices" in lines[0]


def test_usage_errors_exit_2() -> None:
    result = run_cli("prices", "synth", "--symbols", "0")
    assert result.returncode == 2
    assert "expected a positive integer" in result.stderr
    assert run_cli().returncode == 2  # no command


def test_help_answers_without_dagster_numba_or_scipy() -> None:
    """``corr-pipeline --help`` (and a command's ``--help``) imports none of the heavy
    libraries: only what argparse needs to describe the commands."""
    probe = (
        "import sys\n"
        "from corr_pipeline.cli import main\n"
        "for argv in (['--help'], ['query', '--help'], ['backfill', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = ('dagster', 'numba', 'scipy', 'pandas', 'matplotlib')\n"
        "print('LOADED', sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "COMMAND" in result.stdout and "LOADED []" in result.stdout, result.stdout[-400:]


def test_prices_synth_small(clean_db: sa.Engine) -> None:
    result = run_cli("prices", "synth", "--symbols", "12", "--days", "40", "--seed", "3")
    assert result.returncode == 0, result.stderr
    assert "seed=3" in result.stdout
    assert _count(clean_db) > 0


def test_demo_steps_seed_once(clean_db: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The database + prices steps of the demo: seed when empty, keep data afterwards."""
    lines: list[str] = []
    steps = [demo_step_database, demo_step_prices]
    ctx = DemoContext(symbols=15, days=30, seed=5, echo=lines.append)
    monkeypatch.setenv(settings.ENV_DATABASE_URL, os.environ[settings.ENV_DATABASE_URL])
    run_demo(ctx, steps=steps)
    assert any("seeding a synthetic universe of 15 symbols" in line for line in lines)
    seeded = _count(clean_db)
    assert seeded > 0

    lines.clear()
    run_demo(DemoContext(symbols=15, days=30, seed=5, echo=lines.append), steps=steps)
    assert any("keeping the existing" in line for line in lines)
    assert _count(clean_db) == seeded
