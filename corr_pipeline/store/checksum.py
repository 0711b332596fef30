"""The two content checks of a stored array file: sampled on every load, full on demand.

- :func:`sampled_fingerprint`: SHA-256 of the file size and of 17 blocks of 64 KiB spread evenly
  over the file (the whole file when it is smaller). Cheap enough for every
  :meth:`~corr_pipeline.store.matrix_store.MatrixStore.load`: it tells one version's data from
  another's and catches truncation and most damage, but a change between the sampled blocks
  (one value in the middle of ``corr``) passes it.
- :func:`full_checksum`: a SHA-256 tree over every byte (256 MiB segments hashed in parallel,
  read in 8 MiB chunks: O(threads) memory).
  Written into the sidecar when a version is committed, checked by
  :func:`corr_pipeline.store.verify.verify_store` (``corr-pipeline store verify``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

__all__ = [
    "SAMPLE_BLOCKS",
    "SAMPLE_BYTES",
    "full_checksum",
    "sample_offsets",
    "sampled_fingerprint",
]

#: Blocks the sampled fingerprint reads, and their size.
SAMPLE_BLOCKS = 17
SAMPLE_BYTES = 1 << 16
#: The segments of the full checksum, hashed in parallel.
SEGMENT_BYTES = 256 << 20
_CHUNK_BYTES = 8 << 20


def sample_offsets(size: int) -> Sequence[int]:
    """Where the sampled fingerprint reads its blocks in a file of ``size`` bytes."""
    if size <= SAMPLE_BLOCKS * SAMPLE_BYTES:
        return range(0, size, SAMPLE_BYTES)
    last = size - SAMPLE_BYTES
    return [round(i * last / (SAMPLE_BLOCKS - 1)) for i in range(SAMPLE_BLOCKS)]


def sampled_fingerprint(fd: int, size: int) -> str:
    """``sha256:`` + SHA-256 of ``size`` (8 bytes, little-endian) and of the blocks at
    :func:`sample_offsets` of the open file ``fd``."""
    h = hashlib.sha256(size.to_bytes(8, "little"))
    for offset in sample_offsets(size):
        h.update(os.pread(fd, SAMPLE_BYTES, offset))
    return "sha256:" + h.hexdigest()


def _segment_digest(fd: int, start: int, stop: int) -> bytes:
    """SHA-256 of bytes ``start:stop`` of ``fd``, read with ``pread`` into one 8 MiB buffer."""
    h = hashlib.sha256()
    buffer = bytearray(min(_CHUNK_BYTES, max(stop - start, 1)))
    view = memoryview(buffer)
    offset = start
    while offset < stop:
        got = os.preadv(fd, [view[: min(len(buffer), stop - offset)]], offset)
        if got <= 0:
            raise OSError(f"short read at byte {offset} of {stop}")
        h.update(view[:got])
        offset += got
    return h.digest()


def full_checksum(fd: int, size: int, *, workers: int | None = None) -> str:
    """``sha256-tree:`` + hex SHA-256 of ``size`` (8 bytes, little-endian) followed by the
    SHA-256 digests (32 bytes each, in file order) of the consecutive 256 MiB segments of the
    first ``size`` bytes of ``fd`` (the last one shorter; none for an empty file).

    The segments are hashed by ``workers`` threads (default: the CPUs this process may use;
    ``hashlib`` releases the GIL), each through its own 8 MiB buffer: about 2.5 GB/s on two
    cores. Equal to ``sha256(size || sha256(seg_1) || ... || sha256(seg_k))``, which any tool
    recomputes (e.g. ``split -b 256M`` and ``sha256sum``)."""
    segments = [(a, min(a + SEGMENT_BYTES, size)) for a in range(0, size, SEGMENT_BYTES)]
    workers = workers or len(os.sched_getaffinity(0))
    if workers > 1 and len(segments) > 1:
        with ThreadPoolExecutor(min(workers, len(segments))) as pool:
            digests = list(pool.map(lambda seg: _segment_digest(fd, *seg), segments))
    else:
        digests = [_segment_digest(fd, a, b) for a, b in segments]
    top = hashlib.sha256(size.to_bytes(8, "little"))
    for digest in digests:
        top.update(digest)
    return "sha256-tree:" + top.hexdigest()
