"""Shared names of the matrix store's tests: the partition they write, what a partition
directory holds, and writer processes to kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

P = "2024-03-28"


def final_files(directory: Path) -> list[str]:
    """The visible (committed) files of a partition directory."""
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def temp_files(directory: Path) -> list[str]:
    """The temp files of unfinished writes in a partition directory."""
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name)


CRASH_WRITER = """
import sys, time, numpy as np
from corr_pipeline.store.matrix_store import MatrixStore
store = MatrixStore(sys.argv[1])
n_rows, n_cols = 2048, 4096                     # 32 MiB of float32
pending = store.allocate("corr", "2024-03-28", "corr", (n_rows, n_cols), np.float32,
                         labels={"version": "new"})
for start in range(0, n_rows // 2, 128):        # fill half, tile by tile
    pending.array[start:start + 128] = 7.0
pending.array.flush()
print(pending.temp_path, flush=True)
time.sleep(120)                                  # killed here
"""


def start_script(script: str, *args: str) -> subprocess.Popen:
    """A Python process running ``script`` with ``args``, its output piped as text."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def sigkill(proc: subprocess.Popen) -> None:
    """Kill ``proc`` with SIGKILL (if still running) and reap it."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
