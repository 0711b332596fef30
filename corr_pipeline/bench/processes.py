"""Peak memory of every process a run starts, sampled from ``/proc`` (Linux).

Dagster's multiprocess executor runs each step in its own process (started from a forkserver
that is a child of the process calling ``execute_job``). :class:`ProcessTreePeaks` samples, from
a thread of the calling process, ``RssAnon`` (anonymous memory, what the working-memory budget
governs; the kernel keeps no peak of it) and ``VmHWM`` (the process's own peak RSS, memory-mapped
pages included) of every descendant process, so a step's figures are its whole process's:
interpreter, Dagster, inputs, the step, its checks and pictures. The descendants are found again
every ``rescan`` seconds and sampled every ``interval`` seconds; a process that lives shorter
than ``rescan`` may be missed (a snapshot step lives seconds at least). Where ``/proc`` is
unavailable nothing is recorded, never invented.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from corr_pipeline.snapshot.measure import read_proc_status_kib

__all__ = ["ProcessPeak", "ProcessTreePeaks", "descendants", "written_bytes"]

_PROC = Path("/proc")


def _parent_pids() -> dict[int, int]:
    """pid → parent pid of every process visible in ``/proc``."""
    parents: dict[int, int] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(root: int) -> set[int]:
    """The pids of every process below ``root`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parent_pids().items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def _status_kib(pid: int) -> dict[str, int]:
    return read_proc_status_kib(("RssAnon", "VmHWM"), _PROC / str(pid) / "status")


def written_bytes(pid: int | str = "self") -> int | None:
    """Bytes a process has sent to storage so far: ``write_bytes − cancelled_write_bytes`` of
    ``/proc/<pid>/io`` (a dirty page of a file deleted before write-back is cancelled); None
    when unreadable."""
    try:
        text = (_PROC / str(pid) / "io").read_text()
    except OSError:
        return None
    fields = dict(line.split(": ") for line in text.splitlines() if ": " in line)
    return int(fields["write_bytes"]) - int(fields["cancelled_write_bytes"])


def _own(pid: int) -> bool:
    """Whether ``pid`` runs as this process's user (the embedded PostgreSQL runs as another)."""
    try:
        return (_PROC / str(pid)).stat().st_uid == os.geteuid()
    except OSError:
        return False


@dataclass
class ProcessPeak:
    """One process: the highest ``RssAnon`` and ``VmHWM`` sampled (KiB), and the bytes it had
    sent to storage when last sampled (:func:`written_bytes`; processes of this user only)."""

    pid: int
    peak_anon_kib: int = 0
    peak_rss_kib: int = 0
    written_bytes: int = 0

    @property
    def peak_anon_mib(self) -> float:
        return self.peak_anon_kib / 1024

    @property
    def peak_rss_mib(self) -> float:
        return self.peak_rss_kib / 1024


class ProcessTreePeaks:
    """Context manager sampling the descendants of ``root`` (default: this process) while the
    ``with`` body runs; :attr:`peaks` maps pid → :class:`ProcessPeak`."""

    def __init__(
        self, root: int | None = None, *, interval: float = 0.02, rescan: float = 0.2
    ) -> None:
        self.root = os.getpid() if root is None else root
        self.interval = interval
        self.rescan = rescan
        self.peaks: dict[int, ProcessPeak] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self, pids: set[int]) -> None:
        """Read the memory of ``pids`` once and keep the highest figures."""
        for pid in pids:
            status = _status_kib(pid)
            if not status:
                continue
            peak = self.peaks.setdefault(pid, ProcessPeak(pid))
            peak.peak_anon_kib = max(peak.peak_anon_kib, status.get("RssAnon", 0))
            peak.peak_rss_kib = max(peak.peak_rss_kib, status.get("VmHWM", 0))
            written = written_bytes(pid) if _own(pid) else None  # not the database server's
            if written is not None:
                peak.written_bytes = max(peak.written_bytes, written)

    def _run(self) -> None:
        pids: set[int] = set()
        scanned = float("-inf")
        while True:
            now = time.monotonic()
            if now - scanned >= self.rescan:
                pids = descendants(self.root)
                scanned = now
            self.sample(pids)
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> ProcessTreePeaks:
        if _PROC.is_dir():
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
