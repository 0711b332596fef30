"""Benchmark: what the full checksum written at commit costs, next to the GEMM floor.

One partition's matrices at N (``corr`` float32 and ``overlap`` uint16: 6·N² bytes) are
allocated in a store on disk, filled, and committed; the commit (msync, fsync, sampled
fingerprint, full SHA-256, sidecar, rename) is timed as a whole and the full checksum of the
same files alone, in the same run as the floor ``R0.T @ R0`` over a T × N float32 matrix (best
of 7)::

    python benchmarks/bench_store_checksum.py --n 24000 --t 252 --dir /var/tmp

Prints seconds, GB/s and the ratios to the floor, and the peak RSS and RssAnon of the commits
(the checksum reads through one 8 MiB buffer: RssAnon stays flat).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
from common import PeakMemory, gemm_floor, machine_line

from corr_pipeline.store.checksum import full_checksum
from corr_pipeline.store.matrix_store import MatrixStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=24_000)
    parser.add_argument("--t", type=int, default=252)
    parser.add_argument("--dir", default=None, help="where the store goes (default: $TMPDIR)")
    args = parser.parse_args()
    print(machine_line())
    rng = np.random.default_rng(1)
    r0 = rng.standard_normal((args.t, args.n), dtype=np.float32)
    floor = gemm_floor(r0)
    del r0
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        store = MatrixStore(directory)
        commit_s, files = 0.0, []
        with PeakMemory() as memory:
            for name, dtype in (("corr", np.float32), ("overlap", np.uint16)):
                with store.allocate("snapshot_corr", "2026-11-27", name, (args.n,) * 2, dtype) as p:
                    for start in range(0, args.n, 1024):  # fill in row blocks, as the kernel
                        p.array[start : start + 1024] = start % 251
                    start_commit = time.perf_counter()
                    stored = p.commit()
                    commit_s += time.perf_counter() - start_commit
                files.append(stored.path)
        size = sum(f.stat().st_size for f in files)
        start_sum = time.perf_counter()
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                full_checksum(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
        checksum_s = time.perf_counter() - start_sum
    print(f"N = {args.n:,}, T = {args.t}: {size / 1e9:.2f} GB in corr + overlap")
    print(f"floor R0.T @ R0 (best of 7): {floor:.2f} s")
    print(f"commit of both (with full checksum): {commit_s:.2f} s = {commit_s / floor:.2f} floors")
    print(
        f"full checksum alone: {checksum_s:.2f} s = {checksum_s / floor:.2f} floors, "
        f"{size / checksum_s / 1e9:.2f} GB/s"
    )
    print(
        f"commits: peak RSS {memory.peak_rss / 1024:,.0f} MiB, "
        f"peak RssAnon {memory.peak_anon / 1024:,.0f} MiB (entry {memory.base_anon / 1024:,.0f})"
    )


if __name__ == "__main__":
    main()
