"""The steps of one snapshot, each one call: :class:`~corr_pipeline.snapshot.chain.SessionChain`
runs them in order for the Dagster op and the benchmark (where their outputs are stored, how
they are verified and published is the chain's).

::

    prices ─► load_returns ─┬─► correlation (corr + overlap) ─┬─► neighbors ─┐
                            │                                 ├─► clusters ──┼─► results_for_publication
                            └────────(with the sync corr)─────┴─► lead_lag ──┘

Each step maps its own record of the parameters (``params.lead_lag`` of a
:class:`~corr_pipeline.snapshot.params.SnapshotParameters` and so on; the window's, the whole
value) onto one function of :mod:`corr_pipeline.compute` (or the window query of
:mod:`corr_pipeline.db.window`) and returns its arrays; where the result goes (matrix store,
memory, database) is the caller's choice. Outside :mod:`corr_pipeline.snapshot` the package never calls the compute entry points
itself (``corr_pipeline_tests/test_layers.py``). :func:`matrix_versions` gathers the
matrix-store versions a publication pins (SPEC §8). Memory at N = 24,000 (T = 252, int16
overlap) per step:

- load_returns: the COPY buffer (~180 MB) and the close/returns pivots (~120 MB), then R 24 MB.
- correlation: R standardised plus one block of tiles (``working_memory_mb``); the outputs
  (2.3 GB float32 + 1.15 GB int16) are the caller's arrays, memory-mapped in the store.
- neighbors: row blocks of corr (``working_memory_mb``) + the N x k results (~2 MB).
- clusters: the float64 distances N(N-1)/2 (2.3 GB) in the linkage's tiled layout: in a
  scratch file of the matrix store when the caller passes ``scratch`` (page cache, not
  anonymous; the session's chain does), else on the heap; + O(N).
- lead_lag: the market residuals (T x N float32, 24 MB) when modes are removed, R (or them)
  standardised, one block per lag (``working_memory_mb``), the running per-symbol top-k
  (N x k), corr read as a map when no mode is removed.

With ``params.dask_scheduler`` set, :func:`stripe_runner` connects to that Dask cluster and
correlation, neighbors and lead_lag run as stripes of rows there
(``striped.py`` of each algorithm, :mod:`corr_pipeline.compute.parallel`), bit-identical to the threads: each worker holds R and
its standardised window and a stripe's temporaries; the step's process keeps only R and, for
lead_lag, its own standardised window and the stripes' lower-bound tables (N x k_leaders) and
column candidates, which it evaluates once every stripe is in (as the threaded scan evaluates
its pool). The correlation stripes write both triangles straight into the outputs (no
scratch file).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import sqlalchemy as sa

from corr_pipeline.compute import (
    find_lead_lag_pairs,
    hierarchical_clusters,
    market_residuals,
    pairwise_correlation,
    top_k_neighbors,
)
from corr_pipeline.compute.clusters import distance_buffer_length
from corr_pipeline.compute.market_modes import MarketModes
from corr_pipeline.compute.market_modes import market_modes as strongest_modes
from corr_pipeline.compute.neighbors import Neighbors
from corr_pipeline.compute.parallel.runners import StripeRunner
from corr_pipeline.compute.suspect import SuspectSymbol
from corr_pipeline.compute.tiling import Progress
from corr_pipeline.db.price_source import NATIVE_PRICES, PriceSource
from corr_pipeline.db.window import (
    ReturnsWindow,
    UnionWindows,
    load_returns_window,
    read_windows,
)
from corr_pipeline.snapshot.params import (
    ClustersParameters,
    CorrelationParameters,
    LeadLagParameters,
    NeighborsParameters,
    SnapshotParameters,
)
from corr_pipeline.snapshot.results import SnapshotResults
from corr_pipeline.snapshot.scheduler import scheduler_security
from corr_pipeline.store.matrix_store import MatrixBundle, MatrixStore

if TYPE_CHECKING:
    from corr_pipeline.compute.parallel.dask_runner import DaskRunner

#: ``scratch(name, shape, dtype)``: a context manager yielding a writable working array.
Scratch = Callable[[str, tuple[int, ...], np.dtype], AbstractContextManager[np.ndarray]]

#: Name of the clustering step's scratch array of distances (a temp file in the store).
CLUSTER_DISTANCES = "clusters_distances"

#: Rows compared per block when two versions of a matrix must be checked for equal contents.
_COMPARE_BLOCK_BYTES = 64 << 20


class InconsistentInputsError(ValueError):
    """The results to publish were computed from different store versions with different
    contents (concurrent runs of one partition with other inputs): re-materialize it whole."""


def load_returns(
    engine: sa.Engine,
    day: dt.date,
    params: SnapshotParameters,
    *,
    source: PriceSource = NATIVE_PRICES,
    session: bool = False,
) -> ReturnsWindow:
    """The returns matrix of the window ending at ``day`` (SPEC §2), read from ``source``
    (default the project's ``prices`` table; checked against the catalog first); ``session``:
    ``day`` is a session of the calendar, which must have prices dated ``day``
    (:class:`~corr_pipeline.db.window.StaleSessionError` otherwise). Suspect prices are
    screened by ``params.suspect_screen`` (SPEC §2)."""
    return load_returns_window(
        engine,
        day,
        lookback_days=params.lookback_days,
        min_history_days=params.min_history_days,
        source=source,
        session=session,
        suspect_screen=params.suspect_screen,
    )


def load_returns_range(
    engine: sa.Engine,
    days: Sequence[dt.date],
    params: SnapshotParameters,
    *,
    source: PriceSource = NATIVE_PRICES,
    session: bool = False,
) -> UnionWindows:
    """The returns matrices of the sessions of a range (a backfill run), read with one query
    for the union of the windows: ``.window(day)`` builds that session's, identical to
    :func:`load_returns` of it, or gives the :class:`WindowError` it raises."""
    return read_windows(
        engine,
        days,
        lookback_days=params.lookback_days,
        min_history_days=params.min_history_days,
        source=source,
        session=session,
        suspect_screen=params.suspect_screen,
    )


@contextmanager
def stripe_runner(params: SnapshotParameters) -> Iterator[DaskRunner | None]:
    """A runner on the Dask scheduler ``params.dask_scheduler`` (disconnected on exit), or None
    when it is unset (the steps then run on threads); only a ``tls://`` address, with the
    settings' certificates (:mod:`corr_pipeline.snapshot.scheduler`).
    Needs the ``dask`` extra."""
    if params.dask_scheduler is None:
        yield None
        return
    security = scheduler_security(params.dask_scheduler)  # refused: before connecting
    from corr_pipeline.compute.parallel.dask_runner import connect

    with connect(params.dask_scheduler, security) as runner:
        yield runner


def correlation(
    R: np.ndarray,
    params: CorrelationParameters,
    *,
    out_corr: np.ndarray,
    out_overlap: np.ndarray,
    progress: Progress | None = None,
    runner: StripeRunner | None = None,
) -> None:
    """Pairwise-complete correlation and overlap of the columns of ``R`` (SPEC §3), written
    into ``out_corr`` (N x N float32) and ``out_overlap`` (N x N,
    :func:`~corr_pipeline.compute.tiling.overlap_dtype` of T); on ``runner``'s stripes (the
    outputs then file-backed memory maps every worker can open) or, when None, on threads."""
    pairwise_correlation(
        R,
        min_overlap=params.min_overlap,
        working_memory_mb=params.working_memory_mb,
        out_corr=out_corr,
        out_overlap=out_overlap,
        progress=progress,
        runner=runner,
    )


def neighbors(
    corr: np.ndarray,
    overlap: np.ndarray | None,
    params: NeighborsParameters,
    *,
    progress: Progress | None = None,
    runner: StripeRunner | None = None,
) -> Neighbors:
    """The ``k_neighbors`` strongest |corr| neighbors of every symbol (SPEC §4); on
    ``runner``'s stripes (``progress`` after each) or, when None, in this thread."""
    return top_k_neighbors(
        corr,
        k=params.k_neighbors,
        overlap=overlap,
        working_memory_mb=params.working_memory_mb,
        progress=progress,
        runner=runner,
    )


def distance_bytes(n: int) -> int:
    """Bytes of the clustering step's float64 distances for ``n`` symbols (none below 2)."""
    return 8 * distance_buffer_length(n) if n >= 2 else 0


def distances_in_scratch(n: int, params: ClustersParameters) -> bool:
    """Whether :func:`clusters` puts the distances in its ``scratch`` (when given) rather than
    on the heap: when they exceed ``params.memory_mb`` (``clusters_memory_mb``) MiB."""
    return distance_bytes(n) > params.memory_mb * 2**20


#: Relative residual to which the market mode is found when it is only reported (``m = 0``):
#: ``λ_1`` is then exact to about its square, ~1e-12 relative.
REPORTED_MODE_TOLERANCE = 1e-6


def modes_needed(params: SnapshotParameters) -> int:
    """The eigenmodes a session finds (SPEC §5, §6): the ``market_modes_removed`` the clusters
    remove, the ``lead_lag_market_modes`` the lead-lag's residuals remove, and at least the
    market mode, whose share ``λ_1 / N`` every snapshot reports."""
    return max(1, params.market_modes_removed, params.lead_lag_market_modes)


def market_modes(corr: np.ndarray, params: SnapshotParameters) -> MarketModes:
    """The :func:`modes_needed` strongest eigenmodes of ``corr`` (SPEC §5), found once for the
    clusters and the lead-lag of a session (no modes for fewer than 2 symbols). A step that
    removes ``m`` of them needs more than ``m`` symbols: ``ValueError`` naming the parameter
    otherwise."""
    return modes_removing(
        corr,
        {
            "market_modes_removed": params.market_modes_removed,
            "lead_lag_market_modes": params.lead_lag_market_modes,
        },
    )


def modes_removing(corr: np.ndarray, removed: Mapping[str, int]) -> MarketModes:
    """The strongest eigenmodes of ``corr`` the parameters ``removed`` (``{name: modes it
    removes}``) need, and at least the market mode (:func:`market_modes`)."""
    n = corr.shape[0]
    if n < 2:
        return MarketModes(np.empty(0), np.empty((n, 0)))
    for name, m in removed.items():
        if m >= n:
            raise ValueError(f"{name} = {m} needs more than {m} symbols; this session keeps {n}")
    wanted = max(1, *removed.values())
    if not any(removed.values()):
        return strongest_modes(corr, wanted, tol=REPORTED_MODE_TOLERANCE)
    return strongest_modes(corr, min(wanted, n - 1))


def clusters(
    corr: np.ndarray,
    params: ClustersParameters,
    *,
    modes: MarketModes | None = None,
    scratch: Scratch | None = None,
) -> np.ndarray:
    """Cluster labels, int32 ``0..K-1`` by first appearance (SPEC §5).

    The float64 distances (``distance_buffer_length(N)`` elements, 8 N²/2 bytes) are on the
    heap (anonymous memory) when they fit in ``params.memory_mb`` MiB or ``scratch``
    is None; otherwise in ``scratch(name, shape, dtype)``, a context manager yielding a writable
    array for the computation, such as ``functools.partial(store.scratch, "clusters",
    partition)`` (a file in the matrix store, out of anonymous memory, deleted afterwards, see
    :meth:`~corr_pipeline.store.matrix_store.MatrixStore.scratch`). The labels do not depend
    on where they are. ``modes``: :func:`market_modes` of ``corr`` when already found (else the
    clusters find the ``params.market_modes_removed`` they remove).
    """
    cluster = partial(
        hierarchical_clusters,
        corr,
        method=params.linkage_method,
        distance_threshold=params.distance_threshold,
        n_clusters=params.n_clusters,
        market_modes_removed=params.market_modes_removed,
        modes=modes if params.market_modes_removed else None,
        working_memory_mb=params.working_memory_mb,
    )
    n = corr.shape[0]
    if scratch is None or not distances_in_scratch(n, params):
        return cluster()
    length = distance_buffer_length(n)
    with scratch(CLUSTER_DISTANCES, (length,), np.dtype(np.float64)) as work:
        labels = cluster(work=work)
        del work  # the last reference: the file's pages go when its map does
    return labels


def lead_lag(
    R: np.ndarray,
    corr: np.ndarray,
    params: LeadLagParameters,
    *,
    modes: MarketModes | None = None,
    progress: Progress | None = None,
    runner: StripeRunner | None = None,
) -> np.ndarray:
    """The lead-lag pairs of SPEC §6 (structured array, leader/lagger as column indices) of the
    market residuals of ``R`` after ``params.market_modes`` modes (``modes``:
    :func:`market_modes` of ``corr``; when not given, that many are found here; with no mode
    removed, of ``R`` itself, ``corr`` its synchronous correlation); on ``runner``'s stripes of
    leaders or, when None, on threads. The residuals are T × N like ``R``: their synchronous correlation is the
    scan's lag 0, never a second N × N matrix."""
    m = params.market_modes
    series: np.ndarray = R
    sync: np.ndarray | None = corr
    if m > 0:
        found = modes if modes is not None else modes_removing(corr, {"lead_lag_market_modes": m})
        series, sync = market_residuals(R, found.vectors[:, :m]), None
    return find_lead_lag_pairs(
        series,
        max_lag=params.max_lag,
        k_leaders=params.k_leaders,
        k_laggers=params.k_laggers,
        min_overlap=params.min_overlap,
        min_improvement=params.min_improvement,
        max_q_value=params.max_q_value,
        corr=sync,
        working_memory_mb=params.working_memory_mb,
        progress=progress,
        runner=runner,
    )


def results_for_publication(
    snapshot_date: dt.date,
    *,
    as_of_trade_date: dt.date | str,
    symbols: Sequence[str],
    n_dropped: int,
    params: SnapshotParameters,
    found: Neighbors,
    labels: np.ndarray,
    pairs: np.ndarray,
    recorded: Mapping[str, Any],
    matrix_versions: Mapping[str, Mapping[str, str]] | None = None,
    suspects: Sequence[SuspectSymbol] = (),
) -> SnapshotResults:
    """The value :func:`corr_pipeline.db.publish.publish_snapshot` writes (SPEC §7):
    ``snapshots.params`` holds every parameter plus ``recorded`` (window facts, run id);
    ``snapshots.matrix_versions`` the store versions the results come from
    (:func:`matrix_versions`; None when the matrices are not kept in a store); ``suspects``
    the window's suspect prices (SPEC §2, ``suspect_prices``)."""
    return SnapshotResults(
        snapshot_date=snapshot_date,
        as_of_trade_date=as_of_trade_date,
        symbols=symbols,
        n_dropped=int(n_dropped),
        lookback_days=params.lookback_days,
        params={**params.as_dict(), **recorded},
        neighbor_index=np.asarray(found.index),
        neighbor_corr=np.asarray(found.corr),
        neighbor_overlap=np.asarray(found.overlap),
        cluster_labels=np.asarray(labels),
        lead_lag_pairs=np.asarray(pairs),
        matrix_versions=None
        if matrix_versions is None
        else {asset: dict(arrays) for asset, arrays in matrix_versions.items()},
        suspects=tuple(suspects),
    )


def _same_contents(store: MatrixStore, asset: str, partition: str, a: dict, b: dict) -> bool:
    """Whether two version sets ``{name: version}`` of ``asset`` hold byte-identical arrays."""
    if set(a) != set(b):
        return False
    for name in a:
        x = store.load(asset, partition, name, version=a[name]).array
        y = store.load(asset, partition, name, version=b[name]).array
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.ndim == 0 or x.size == 0:
            if np.asarray(x).tobytes() != np.asarray(y).tobytes():
                return False
            continue
        row_bytes = max(1, x.nbytes // max(1, x.shape[0]))
        step = max(1, _COMPARE_BLOCK_BYTES // row_bytes)
        for start in range(0, x.shape[0], step):
            if (
                np.asarray(x[start : start + step]).tobytes()
                != np.asarray(y[start : start + step]).tobytes()
            ):
                return False
    return True


def matrix_versions(
    store: MatrixStore,
    partition: str,
    *,
    returns: MatrixBundle,
    neighbors: MatrixBundle,
    clusters: MatrixBundle,
    lead_lag: MatrixBundle,
) -> dict[str, dict[str, str]]:
    """The matrix-store versions a publication records (``snapshots.matrix_versions``, SPEC §8):
    ``{asset: {array: version}}`` of the bundles it publishes from, and of the correlation and
    overlap matrices *those* were computed from (their ``inputs``), so every later reader of the
    published date reads exactly the matrices behind its neighbors, clusters and pairs.

    Neighbors, clusters and lead-lag must have read one correlation matrix (and lead-lag the
    published returns): versions that differ (two runs of the partition at once) are accepted
    only when their contents are identical, else :class:`InconsistentInputsError`. The pinned
    correlation and overlap versions must still be in the store.
    """
    consumers = {"top_k_neighbors": neighbors, "clusters": clusters, "lead_lag_pairs": lead_lag}
    versions: dict[str, dict[str, str]] = {"returns_matrix": returns.versions}
    versions.update({asset: bundle.versions for asset, bundle in consumers.items()})
    upstream = {
        "correlation_matrix": list(consumers.values()),
        "overlap_matrix": [neighbors],
        "returns_matrix": [lead_lag],
    }
    for asset, readers in upstream.items():
        seen = [(r, r.inputs[asset]) for r in readers if asset in r.inputs]
        if asset == "returns_matrix":
            seen.insert(0, (returns, returns.versions))
        if not seen:
            continue  # bundles stored before inputs were recorded: nothing to pin
        chosen = seen[0][1]
        for reader, read in seen[1:]:
            if read != chosen and not _same_contents(store, asset, partition, chosen, read):
                raise InconsistentInputsError(
                    f"{reader.asset or 'a bundle'} of {partition} was computed from "
                    f"{asset} {read}, the others from {chosen}, with different contents (two "
                    "runs of the partition at once?): re-materialize the whole partition"
                )
        for name, version in chosen.items():
            if not store.has_version(asset, partition, name, version):
                raise InconsistentInputsError(
                    f"version {version} of {asset}/{partition}/{name}, which the results to "
                    "publish were computed from, is no longer in the store: re-materialize the "
                    "whole partition"
                )
        versions[asset] = dict(chosen)
    return versions
