"""The kernel's dirty-page write-back threshold, for steps that keep rewriting a large file.

Linux starts writing dirty page-cache pages back to disk once they exceed
``vm.dirty_background_bytes`` or, when that is 0, ``vm.dirty_background_ratio`` per cent of the
memory it counts as dirtyable (about ``MemAvailable``). A page written back is write-protected
again, so a step that rewrites a file far larger than that threshold (the clustering step's
scratch distances) faults on every page once per write-back round and can run ten times as
long (``docs/operations.md``, "Writing the matrices").
"""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def background_threshold(proc: Path | None = None) -> int | None:
    """Bytes of dirty page cache at which write-back starts: ``vm.dirty_background_bytes`` if
    set, else ``vm.dirty_background_ratio`` % of ``MemAvailable``; None where ``proc`` (default
    :data:`PROC`) does not tell (not Linux, unreadable)."""
    proc = PROC if proc is None else proc
    try:
        fixed = int((proc / "sys/vm/dirty_background_bytes").read_text())
        if fixed > 0:
            return fixed
        ratio = int((proc / "sys/vm/dirty_background_ratio").read_text())
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return ratio * int(line.split()[1]) * 1024 // 100
    except (OSError, ValueError, IndexError):
        return None
    return None


def rewrite_warning(
    what: str, nbytes: int, *, or_else: str = "", proc: Path | None = None
) -> str | None:
    """A one-line warning when a file of ``nbytes`` that is rewritten in place is more than
    twice the write-back threshold (:func:`background_threshold`), else None. ``or_else``: the
    caller's other remedy, offered after the setting (", or ...")."""
    threshold = background_threshold(proc)
    if threshold is None or nbytes <= 2 * threshold:
        return None
    return (
        f"{what} ({nbytes / 1e9:.1f} GB) are rewritten in a file while Linux writes dirty pages"
        f" back from {threshold / 1e9:.1f} GB on (vm.dirty_background_*): this step may run many"
        f" times longer: raise vm.dirty_background_bytes above {nbytes / 1e9:.1f} GB"
        f"{f', or {or_else}' if or_else else ''} (docs/operations.md, 'Writing the matrices')"
    )
