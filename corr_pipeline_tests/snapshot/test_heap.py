"""``fix_mmap_threshold``: after a large block was freed, glibc would keep the next blocks of up
to that size in the heap; with the threshold fixed they are mapped on their own (and unmapped
when freed), in a fresh process each, with and without the fix."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from corr_pipeline.snapshot.measure import MMAP_THRESHOLD_BYTES

_PROBE = textwrap.dedent(
    """
    import ctypes, sys
    from corr_pipeline.snapshot.measure import fix_mmap_threshold
    if sys.argv[1] == "fixed":
        assert fix_mmap_threshold()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    big = libc.malloc(20 << 20)  # mapped, then freed: glibc's threshold rises to 20 MiB
    libc.free(big)
    block = libc.malloc(int(sys.argv[2]))
    for line in open("/proc/self/maps"):
        span, rest = line.split(" ", 1)
        lo, hi = (int(x, 16) for x in span.split("-"))
        if lo <= block < hi:
            print("heap" if "[heap]" in rest else "own", hi - lo)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc")
@pytest.mark.parametrize("how", ["dynamic", "fixed"])
def test_a_block_above_the_threshold_gets_a_mapping_of_its_own(how: str) -> None:
    size = MMAP_THRESHOLD_BYTES + (1 << 20)
    # glibc's defaults: any MALLOC_* setting in the environment turns its dynamic threshold off
    # (a Dask nanny started in this process sets MALLOC_TRIM_THRESHOLD_ in os.environ)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, how, str(size)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    ).stdout.split()
    where, length = out[0], int(out[1])
    if how == "fixed":
        assert where == "own" and size <= length < size + (1 << 20)
    else:  # the dynamic threshold keeps it in the heap, where it stays after the free
        assert where == "heap"
