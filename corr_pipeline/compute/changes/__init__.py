"""What changed between two snapshots: the previous session's and today's (SPEC §10).

Symbols are matched by name, never by index: the two universes differ (symbols enter and leave).
:func:`match_symbols` builds the index maps of the common symbols, in name order (code points, the
order of SPEC §2, so the maps are increasing in both universes when each is sorted by name).
Every function here works on those maps; "pair ``(p, q)``" means common symbols ``p < q``.

``correlation_changes`` (SPEC §10.1, 10.2) — one scan of the pairs ``p < q`` of common symbols,
row block by row block (:func:`corr_pipeline.compute.tiling.row_blocks`), reading the four N x N
inputs (corr and overlap of both days, typically read-only memory maps) in place: no N x N
temporary. A pair is *compared* iff both correlations are finite and both overlaps are
``>= min_overlap``. Over the compared pairs:

- sums for the means of ``corr``, ``|corr|`` of each day and of ``Δ = corr_today − corr_previous``
  and ``|Δ|`` (float64 accumulators, ``Δ`` in float64 from the float32 values);
- the exact quantiles of ``corr`` and ``|corr|`` of each day (numpy's default "linear" rule:
  ``x[lo] + (h − lo)(x[lo+1] − x[lo])`` with ``h = q (n − 1)``), by a radix select on the
  order-preserving 32-bit keys of the float32 values, in two reads of the matrices: the
  histograms of the top 16 key bits of ``corr`` of each day (2 x 2^16 uint32 per chunk,
  cache-resident; those of ``|corr|`` are the same counts folded, since the key of ``|x|`` is the
  key of ``x`` for ``x >= 0`` and its mirror ``2^32 − 1 − key`` for ``x < 0``), counted in the
  first read, tell which bin holds each wanted order statistic (rank ``r``, rank ``r − before``
  inside the bin, ``before`` the count of the lower bins); the second read collects the keys of
  exactly those bins (their counts known, so each chunk's buffers are sized exactly), and one
  ``np.partition`` of a bin's keys with all its wanted in-bin ranks selects them (exactly the
  values a sort would put there). Two reads, not one that guesses the bins from a sample of
  rows: the rows of a sector are alike, so a sample of rows places a quantile only to about
  1 % of rank, wider than the bins one read could afford to collect;
- a histogram of ``Δ`` (``change_bins`` equal bins over [−2, 2], counted at 1024 times that
  resolution, which the picture re-bins to fit the data);
- the top ``top_m`` pairs by ``|Δ|`` descending, ties to the smaller pair ``(p, q)``
  (lexicographic, i.e. by name): a running selection in that total order
  (:func:`corr_pipeline.compute.top_k.offer`), so the order the rows are scanned in does not
  matter.

Each row is read in runs of columns over which both index maps advance by one (:func:`column_runs`:
contiguous values in all four matrices), 512 pairs at a time: vectorised passes over the values
(validity, keys, bins, the sums), then a scalar pass over their buffers (the histogram counts,
the keys collected, the top-M offers). The rows are split into at most 4 interleaved chunks
(the selected rows of a block taken in turn), one task each on the worker threads of
:mod:`corr_pipeline.compute.workers` (a GIL-free numba kernel per chunk and row block); the
results do not depend on the number of chunks or the blocks: the counts are integers, the top M
of each chunk is exact and merged in the same order, and the sums are accumulated per row (in a
fixed order: :func:`_step_sums`) and added in row order.

``neighbor_turnover`` (10.3): for a common symbol, how many of today's top-k neighbors were not
among its previous top-k (by name).

``cluster_migrations`` (10.4): today's clusters matched one-to-one to the previous ones by a
maximum total member overlap (``scipy.optimize.linear_sum_assignment``).

``lead_lag_changes`` (10.5): the pairs (by name) that appeared, vanished or changed lag.

The package's rooms: :mod:`.matching`, :mod:`.drift` (with its kernels in :mod:`.drift_scan`),
:mod:`.turnover`, :mod:`.migrations` and :mod:`.lead_lag`.
"""

from __future__ import annotations

from corr_pipeline.compute.changes.drift import (
    DEFAULT_QUANTILES,
    DISTRIBUTIONS,
    CorrelationChanges,
    correlation_changes,
)
from corr_pipeline.compute.changes.lead_lag import LeadLagChanges, lead_lag_changes
from corr_pipeline.compute.changes.matching import SymbolMatch, match_symbols
from corr_pipeline.compute.changes.migrations import ClusterMigrations, cluster_migrations
from corr_pipeline.compute.changes.turnover import neighbor_turnover

__all__ = [
    "DEFAULT_QUANTILES",
    "DISTRIBUTIONS",
    "ClusterMigrations",
    "CorrelationChanges",
    "LeadLagChanges",
    "SymbolMatch",
    "cluster_migrations",
    "correlation_changes",
    "lead_lag_changes",
    "match_symbols",
    "neighbor_turnover",
]
