"""``corr-pipeline bench``: the whole chain on a tiny universe, as a real subprocess
against the test database, the GEMM floor it compares the stages with, and the memory sampler
it uses."""

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

from corr_pipeline import settings
from corr_pipeline.bench import (
    FLOOR_REPEAT,
    PIPELINE_STAGES,
    GemmFloor,
    PipelineBenchReport,
    ProcessTreePeaks,
    StageResult,
    measure_floor,
    synthetic_results,
)
from corr_pipeline.bench import floor as floor_module
from corr_pipeline.bench.processes import descendants
from corr_pipeline.compute.tiling import overlap_dtype
from corr_pipeline.db.publish import read_snapshot_counts
from corr_pipeline.snapshot.chain import STEPS
from corr_pipeline.synth import DEFAULT_END_DATE, ragged_returns

FLOOR_LINE = re.compile(
    r"^# floor: R0\.T @ R0 float32, N = ([\d,]+), T = (\d+): ([\d.]+) s \(best of (\d+)\); "
    r"load average ([\d.]+) ([\d.]+) ([\d.]+)$",
    re.M,
)


def _bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "corr_pipeline.cli", "bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _table(stdout: str) -> dict[str, list[str]]:
    """Rows of the printed markdown table, by stage name."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 7 and cells[0] not in ("stage",):
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
        "--param", "max_q_value=1",  # every symbol's best pairs: rows to publish at N = 60
    )  # fmt: skip
    out = result.stdout
    assert "lead_lag_market_modes = 1, max_q_value = 1.0" in out
    assert re.search(r"^# .*\d+ cores, \d+ GiB, numpy .*; commit \w+", out, re.M), out
    assert "n = 60, t = 40, max_lag = 3, k = 5, working_memory_mb = 1.0" in out
    table = _table(out)
    assert list(table)[: len(PIPELINE_STAGES)] == list(PIPELINE_STAGES), out
    for stage in PIPELINE_STAGES:
        seconds, rss, anon = (float(table[stage][i].replace(",", "")) for i in (0, 2, 3))
        assert seconds >= 0 and rss > 0 and anon > 0, (stage, table[stage])
        assert rss >= anon  # RSS includes RssAnon
    assert table["load window"][4] == "-" and table["correlation"][4] == "-"

    counts = read_snapshot_counts(clean_db, DEFAULT_END_DATE)
    assert counts["snapshots"] == 1
    assert _int(table["neighbors"][4]) == counts["peer_neighbors"] > 0
    assert _int(table["clusters"][4]) == counts["symbol_clusters"] > 0
    assert _int(table["lead-lag"][4]) == counts["lead_lag_pairs"] > 0
    assert _int(table["publish"][4]) == sum(counts.values())
    n_kept = int(re.search(r"T x N = 40 x (\d+)", table["load window"][5]).group(1))
    assert counts["symbol_clusters"] == n_kept and 40 <= n_kept <= 60

    # the floor: timed on the benchmarked window's N and T, printed above the table (and as
    # soon as it is measured), every stage in floors = its seconds / the floor's
    floors = FLOOR_LINE.findall(out)
    assert len(floors) == 2 and floors[0] == floors[1], out
    n, t, floor_s, repeat = floors[0][:4]
    assert (_int(n), int(t), int(repeat)) == (n_kept, 40, FLOOR_REPEAT)
    assert float(floor_s) > 0
    for stage in PIPELINE_STAGES:
        seconds, ratio = float(table[stage][0]), float(table[stage][1].replace(",", ""))
        # the table shows seconds to 0.1 s and the floor to 1 µs: equal within that rounding
        assert abs(ratio * float(floor_s) - seconds) <= 0.05 + 1e-6 * ratio, (stage, ratio)
    per_lag = float(
        re.search(r"([\d,.]+) floors per lag", table["lead-lag"][5]).group(1).replace(",", "")
    )
    assert per_lag == pytest.approx(float(table["lead-lag"][1].replace(",", "")) / 3, abs=0.01)
    # the memory maps were deleted afterwards (default), the store directory is all that is left
    assert not list((tmp_path / "store").rglob("*.npy"))


def test_bench_no_floor_prints_no_floor(
    clean_db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    result = _bench(
        "--n", "40", "--t", "30", "--max-lag", "2", "--k", "3", "--no-floor",
        "--database-url", database_url, "--home", str(tmp_path),
    )  # fmt: skip
    assert "# floor:" not in result.stdout and "floors per lag" not in result.stdout
    assert all(cells[1] == "-" for cells in _table(result.stdout).values()), result.stdout


#: The session's steps, each an asset with its own row.
SNAPSHOT_STAGES = STEPS


def test_bench_through_dagster_measures_every_stage(
    clean_db: sa.Engine, database_url: str, tmp_path: Path
) -> None:
    """``--through-dagster``: snapshot_job as the nightly run executes it; every stage's row has
    its time and memory, the publication's rows are the database's, the total is the run's wall
    time, the floor is timed on the published window's N and T, and the run's matrices are
    deleted afterwards."""
    result = _bench(
        "--through-dagster", "--n", "80", "--t", "40", "--max-lag", "3", "--k", "4",
        "--database-url", database_url, "--home", str(tmp_path), timeout=400,
    )  # fmt: skip
    out = result.stdout
    table = _table(out)
    assert set(SNAPSHOT_STAGES) <= set(table), out
    for stage in SNAPSHOT_STAGES:
        seconds, _, rss, anon = (float(c.replace(",", "")) for c in table[stage][:4])
        assert seconds >= 0 and rss >= anon > 50, (stage, table[stage])  # an interpreter at least
    counts = read_snapshot_counts(clean_db, DEFAULT_END_DATE)
    assert _int(table["snapshot_publication"][4]) == sum(counts.values()) - counts["snapshots"]
    total = table["**total**"]
    assert float(total[0].strip("*")) >= sum(float(table[s][0]) for s in SNAPSHOT_STAGES)
    assert float(total[3].replace(",", "").removesuffix(" (max)")) > 50
    assert total[5] == "run wall time"
    floors = FLOOR_LINE.findall(out)
    assert len(floors) == 1
    assert (_int(floors[0][0]), int(floors[0][1])) == (counts["symbol_clusters"], 40)
    assert "floors per lag" in table["lead_lag_pairs"][5]
    assert not list((tmp_path / "store").rglob("*.npy"))


def test_process_tree_peaks_sees_a_grandchild_s_anonymous_memory() -> None:
    """A grandchild touching 300 MiB of anonymous memory: found among the descendants and its
    sampled peak RssAnon (and VmHWM) at least that."""
    code = (
        "import subprocess, sys; subprocess.run([sys.executable, '-c', "
        '\'import time; b = bytearray(300 * 2**20); b[::4096] = b"x" * len(b[::4096]); '
        "print(flush=True); time.sleep(1.5)'])"
    )
    with ProcessTreePeaks(interval=0.01, rescan=0.05) as peaks:
        child = subprocess.Popen([sys.executable, "-c", code])
        deadline = time.monotonic() + 60
        while not descendants(child.pid):  # (this process may have other descendants)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        (grandchild,) = descendants(child.pid)
        assert descendants(os.getpid()) >= {child.pid, grandchild}
        child.wait(timeout=60)
    assert peaks.peaks[grandchild].peak_anon_mib >= 300
    assert peaks.peaks[grandchild].peak_rss_mib >= peaks.peaks[grandchild].peak_anon_mib
    assert peaks.peaks[child.pid].peak_anon_mib < 300


def test_the_floor_times_the_zero_filled_float32_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """What is timed is numpy's ``R0.T @ R0`` on the returns with NaN -> 0, float32, best of 7;
    the measurement records the returns' N and T."""
    timed: list[np.ndarray] = []

    def wall_and_cpu_times(fn, repeat):  # run what would be timed once, keep its result
        timed.append(fn())
        assert repeat == FLOOR_REPEAT == 7
        return [0.5, 0.25], [1.0, 0.5]

    monkeypatch.setattr(floor_module, "wall_and_cpu_times", wall_and_cpu_times)
    returns = ragged_returns(37, 53, seed=3)
    assert np.isnan(returns).any()
    floor = measure_floor(returns)
    r0 = np.where(np.isnan(returns), 0.0, returns).astype(np.float32)
    assert timed[0].dtype == np.float32 and np.array_equal(timed[0], r0.T @ r0)
    assert (floor.n, floor.t, floor.seconds, floor.repeat) == (53, 37, 0.25, 7)
    assert floor.ratio(1.0) == 4.0


def test_the_report_gives_every_stage_in_floors() -> None:
    floor = GemmFloor(n=22465, t=252, seconds=0.4, repeat=7, load=(1.25, 1.5, 2.0))
    report = PipelineBenchReport("machine", "abc1234", {}, floor=floor)
    report.stages = [
        StageResult("correlation", 1.3, 900.0, 400.0),
        StageResult("lead-lag", 9.0, 900.0, 700.0, 5, "max_lag = 5"),
    ]
    lines = report.table().splitlines()
    assert lines[0] == (
        "# floor: R0.T @ R0 float32, N = 22,465, T = 252: 0.400000 s (best of 7); "
        "load average 1.25 1.50 2.00"
    )
    rows = _table(report.table())
    assert rows["correlation"][:2] == ["1.3", "3.25"]  # 1.3 / 0.4
    assert rows["lead-lag"][:2] == ["9.0", "22.50"]
    assert rows["**total**"][:2] == ["**10.3**", "25.75"]
    without = PipelineBenchReport("machine", "abc1234", {}, stages=report.stages)
    assert "# floor:" not in without.table() and _table(without.table())["correlation"][1] == "-"


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


def test_the_chain_with_checks_keeps_matrices_the_changes_can_read(
    clean_db: sa.Engine, tmp_path: Path
) -> None:
    """``checks``: the correlation's checks are a stage of their own, the others run (and
    pass) inside their stages; kept matrices are labelled with the window's symbols, so the
    changes of the next session compare them (nothing skipped), in the memory area with
    ``in_memory``: the backfill benchmark's chain."""
    import datetime as dt

    from corr_pipeline.bench.pipeline import CORRELATION_CHECKS, run_pipeline_benchmark
    from corr_pipeline.db.published_reads import published_head
    from corr_pipeline.snapshot.changes import compute_and_publish
    from corr_pipeline.store.matrix_store import MatrixStore

    days = (DEFAULT_END_DATE - dt.timedelta(days=1), DEFAULT_END_DATE)
    for i, day in enumerate(days):
        report = run_pipeline_benchmark(
            clean_db, tmp_path / "store", n=60, t=40, max_lag=3, k=5, synth=i == 0,
            floor=False, echo=lambda _line: None, day=day, checks=True, keep_matrices=True,
            in_memory=i == 0,
        )  # fmt: skip
        names = [stage.name for stage in report.stages]
        assert names == [*PIPELINE_STAGES[:2], CORRELATION_CHECKS, *PIPELINE_STAGES[2:]]
        assert "pairs defined" in report.stages[2].note
    store = MatrixStore(tmp_path / "store")
    # in_memory: the first day's matrices in the store's memory area (when there is one), as a
    # session that retention will not keep; the second's on disk
    first = store.load("correlation_matrix", days[0].isoformat(), "corr")
    in_area = not first.path.is_relative_to(store.base_dir)
    assert in_area == (settings.memory_dir() is not None)
    stored = store.load("correlation_matrix", days[1].isoformat(), "corr")
    assert stored.path.is_relative_to(store.base_dir)
    assert stored.labels["symbols"] == published_head(clean_db, days[1]).symbols
    published = compute_and_publish(clean_db, store, days[1])
    assert published is not None
    results = published[0]
    assert results.skipped == {} and results.correlation is not None
    assert results.correlation.n_pairs > 0
