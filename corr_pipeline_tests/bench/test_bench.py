"""``corr-pipeline bench``: the whole chain on a tiny universe, as a real subprocess
against the test database, and the memory sampler it uses."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from corr_pipeline.bench import PIPELINE_STAGES, synthetic_results
from corr_pipeline.compute.tiling import overlap_dtype
from corr_pipeline.db.publish import read_snapshot_counts
from corr_pipeline.synth import DEFAULT_END_DATE


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "corr_pipeline.cli", "bench", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _table(stdout: str) -> dict[str, list[str]]:
    """Rows of the printed markdown table, by stage name."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 6 and cells[0] not in ("stage",):
            rows[cells[0]] = cells[1:]
    return rows


def _int(cell: str) -> int:
    return int(cell.replace(",", ""))


def test_bench_runs_every_stage_and_publishes_real_rows(
    clean_db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    result = _bench(
        "--n", "60", "--t", "40", "--max-lag", "3", "--k", "5",
        "--working-memory-mb", "1", "--database-url", database_url, "--home", str(tmp_path),
    )  # fmt: skip
    out = result.stdout
    assert re.search(r"^# .*\d+ cores, \d+ GiB, numpy .*; commit \w+", out, re.M), out
    assert "n = 60, t = 40, max_lag = 3, k = 5, working_memory_mb = 1.0" in out
    table = _table(out)
    assert list(table)[: len(PIPELINE_STAGES)] == list(PIPELINE_STAGES), out
    for stage in PIPELINE_STAGES:
        seconds, rss, anon = (float(c.replace(",", "")) for c in table[stage][:3])
        assert seconds >= 0 and rss > 0 and anon > 0, (stage, table[stage])
        assert float(table[stage][1].replace(",", "")) >= anon  # RSS includes RssAnon
    assert table["load window"][3] == "-" and table["correlation"][3] == "-"

    counts = read_snapshot_counts(clean_db, DEFAULT_END_DATE)
    assert counts["snapshots"] == 1
    assert _int(table["neighbors"][3]) == counts["peer_neighbors"] > 0
    assert _int(table["clusters"][3]) == counts["symbol_clusters"] > 0
    assert _int(table["lead-lag"][3]) == counts["lead_lag_pairs"] > 0
    assert _int(table["publish"][3]) == sum(counts.values())
    n_kept = int(re.search(r"T x N = 40 x (\d+)", table["load window"][4]).group(1))
    assert counts["symbol_clusters"] == n_kept and 40 <= n_kept <= 60
    # the memory maps were deleted afterwards (default), the store directory is all that is left
    assert not list((tmp_path / "store").rglob("*.npy"))


def test_bench_publish_only_leaves_no_snapshot_behind(
    clean_db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    result = _bench(
        "--publish-only", "--n", "200", "--k", "4",
        "--database-url", database_url, "--home", str(tmp_path),
    )  # fmt: skip
    expected = synthetic_results(200, k=4, seed=11).n_rows
    assert f"peer_neighbors {expected['peer_neighbors']:,}" in result.stdout
    for label in ("previous date (setup)", "new date", "replace same date"):
        line = next(x for x in result.stdout.splitlines() if x.strip().startswith(label))
        assert "copy_lead_lag_pairs_s" in line and "commit_s" in line, line
    with clean_db.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM snapshots")).scalar() == 0
        assert conn.execute(sa.text("SELECT count(*) FROM lead_lag_pairs")).scalar() == 0


def test_synthetic_results_have_the_pipeline_shapes() -> None:
    res = synthetic_results(500, k=7, t=100, seed=3)
    assert res.neighbor_index.dtype == np.int32 and res.neighbor_index.shape == (500, 7)
    assert res.neighbor_corr.dtype == np.float32
    assert res.neighbor_overlap.dtype == overlap_dtype(100)  # what the overlap matrix holds
    rows = np.arange(500)[:, None]
    assert not np.any(res.neighbor_index == rows)
    assert all(np.unique(r).size == 7 for r in res.neighbor_index)
    assert np.all(np.diff(np.abs(res.neighbor_corr), axis=1) <= 0)  # |corr| descending
    assert res.labels.dtype == np.int32 and np.unique(res.labels).size == round(500 / 6.7)
    key = res.pairs["leader"].astype(np.int64) * 500 + res.pairs["lagger"]
    assert np.unique(key).size == key.size and np.all(res.pairs["leader"] != res.pairs["lagger"])
    assert 0.9 * 2 * 500 * 7 <= res.pairs.size <= 2 * 500 * 7
    assert np.all(np.diff(res.pairs["improvement"]) <= 0)
    assert res.symbols == sorted(res.symbols)


@pytest.mark.parametrize("moment", ["during correlation", "after correlation"])
def test_ctrl_c_leaves_no_matrix_behind(
    clean_db: sa.Engine, database_url: str, tmp_path: Path, moment: str
) -> None:
    """Ctrl-C (SIGINT) while the correlation is being written (temp files, gigabytes at large
    N) or after it was committed (during the later stages): the command exits 130 and the
    store holds no matrix and no temp file afterwards."""
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "corr_pipeline.cli", "bench", "--n", "3000", "--t", "252",
            "--working-memory-mb", "1", "--max-lag", "5", "--database-url", database_url,
            "--home", str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )  # fmt: skip
    store = tmp_path / "store"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            if moment == "during correlation":
                if any(".tmp-" in p.name for p in store.rglob("*.npy.tmp-*")):
                    break
                time.sleep(0.01)
            else:
                line = proc.stdout.readline()
                if line.strip().startswith("correlation"):
                    assert any(p.suffix == ".npy" for p in store.rglob("*.npy")), line
                    break
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out + err
    assert "corr-pipeline: interrupted" in err
    leftovers = [p for p in store.rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    assert leftovers == []
