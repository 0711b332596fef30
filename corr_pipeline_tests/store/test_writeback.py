"""The write-back threshold read from /proc, and the warning for files rewritten above it."""

from __future__ import annotations

from pathlib import Path

import pytest

from corr_pipeline.store import writeback


def _proc(tmp_path: Path, *, fixed: int, ratio: int, available_kb: int | None) -> Path:
    proc = tmp_path / "proc"
    (proc / "sys/vm").mkdir(parents=True)
    (proc / "sys/vm/dirty_background_bytes").write_text(f"{fixed}\n")
    (proc / "sys/vm/dirty_background_ratio").write_text(f"{ratio}\n")
    lines = ["MemTotal:       24000000 kB", "MemFree:        20000000 kB"]
    if available_kb is not None:
        lines.append(f"MemAvailable:   {available_kb} kB")
    (proc / "meminfo").write_text("\n".join(lines) + "\n")
    return proc


def test_unknown_where_proc_does_not_tell():
    proc = Path("/nonexistent")
    assert writeback.background_threshold(proc) is None
    assert writeback.rewrite_warning("x", 10**12, proc=proc) is None  # unknown: no warning


def test_bytes_when_set_else_ratio_of_available(tmp_path):
    proc = _proc(tmp_path, fixed=3_000_000_000, ratio=10, available_kb=20_000_000)
    assert writeback.background_threshold(proc) == 3_000_000_000
    (proc / "sys/vm/dirty_background_bytes").write_text("0\n")
    assert writeback.background_threshold(proc) == 10 * 20_000_000 * 1024 // 100


def test_no_available_memory_line_means_unknown(tmp_path):
    proc = _proc(tmp_path, fixed=0, ratio=10, available_kb=None)
    assert writeback.background_threshold(proc) is None


@pytest.mark.parametrize(
    ("nbytes", "warns"), [(4_000_000_000, False), (4_000_000_001, True), (8 * 10**9, True)]
)
def test_warning_above_twice_the_threshold(tmp_path, nbytes, warns):
    proc = _proc(tmp_path, fixed=2_000_000_000, ratio=10, available_kb=20_000_000)
    message = writeback.rewrite_warning("the distances", nbytes, or_else="use the heap", proc=proc)
    assert (message is not None) == warns
    if message is not None:
        assert message.startswith(f"the distances ({nbytes / 1e9:.1f} GB)")
        assert "2.0 GB" in message and "vm.dirty_background_bytes" in message
        assert message.endswith(", or use the heap (docs/operations.md, 'Writing the matrices')")


def test_the_default_is_this_machines_proc(tmp_path, monkeypatch):
    proc = _proc(tmp_path, fixed=123, ratio=10, available_kb=1)
    monkeypatch.setattr(writeback, "PROC", proc)
    assert writeback.background_threshold() == 123
