"""Independent brute-force references for the compute core (SPEC §3-§6).

Nothing here imports ``corr_pipeline``: every reference is written from the SPEC text alone, in
float64, favouring obviousness over speed. The tests compare the package's kernels against these.

Reading of SPEC §3 used throughout (documented because pandas and the SPEC's parenthetical about
the diagonal could be read two ways):

* ``corr[i, j]`` is NaN where ``overlap[i, j] < min_overlap`` **or** either series has zero
  variance on the overlap. Zero variance is decided *exactly* (all values on the overlap equal),
  never by a tolerance, so a 1e-15-scaled column is not "constant".
* The diagonal is ``1`` exactly where the column has ``>= min_overlap`` finite returns and is not
  constant; it is NaN otherwise. So a fully constant column has a NaN diagonal, which is also what
  ``pandas.DataFrame.corr`` gives (the SPEC's "``corr[i, i] = 1``" is about kept symbols, which
  always have non-zero variance; for any other column the zero-variance rule decides).
* ``overlap`` dtype is the smallest signed integer type that holds ``T`` (int8 for T <= 127,
  int16 for T <= 32767, else int32).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.cluster import hierarchy
from scipy.spatial.distance import squareform
from scipy.special import erfc

from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE

LINKAGE_METHODS = ("average", "single", "complete", "weighted")


# --------------------------------------------------------------------------------------------
# §3 synchronous correlation and overlap
# --------------------------------------------------------------------------------------------


def expected_overlap_dtype(T: int) -> np.dtype:
    """Smallest signed integer dtype holding ``T`` (SPEC §3)."""
    for dtype in (np.int8, np.int16, np.int32, np.int64):
        if T <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(T)


def reference_overlap(R: np.ndarray) -> np.ndarray:
    """``overlap[i, j]`` = number of rows where both columns are finite, by plain counting."""
    finite = np.isfinite(R).astype(np.int64)
    return finite.T @ finite


def reference_correlation(R: np.ndarray, min_overlap: int) -> tuple[np.ndarray, np.ndarray]:
    """SPEC §3 via ``pandas.DataFrame(R, float64).corr(min_periods=min_overlap)``.

    Returns ``(corr float64 N×N, overlap int64 N×N)``. pandas' pairwise-complete Pearson uses a
    Welford update, which keeps an exactly constant overlap at exactly zero variance, and it yields
    NaN for zero variance and for ``overlap < min_periods``. The diagonal is then set to exactly 1
    wherever pandas gave a finite value (pandas' own diagonal can be 1 - 1 ulp); see the module
    docstring for the diagonal rule.
    """
    R64 = np.asarray(R, dtype=np.float64)
    N = R64.shape[1]
    overlap = reference_overlap(R64)
    if N == 0:
        return np.zeros((0, 0)), overlap
    corr = pd.DataFrame(R64).corr(min_periods=min_overlap).to_numpy(dtype=np.float64, copy=True)
    diag = np.diagonal(corr).copy()
    np.fill_diagonal(corr, np.where(np.isfinite(diag), 1.0, np.nan))
    return corr, overlap


def _exactly_constant_on_overlap(
    X: np.ndarray, finite_y: np.ndarray, overlap: np.ndarray, min_overlap: int
) -> np.ndarray:
    """``const[i, j]`` = True iff all finite ``X[:, i]`` on rows where ``finite_y[:, j]`` holds
    are equal (and there are at least ``min_overlap`` of them).

    Exact: for each value ``v`` repeated at least ``min_overlap`` times in column ``i`` (only such a
    value can fill an overlap of ``>= min_overlap`` rows), count the rows where ``X[:, i] == v``
    and ``y_j`` is finite; the column is constant on the overlap iff that count equals the overlap.
    """
    N_x = X.shape[1]
    const = np.zeros((N_x, finite_y.shape[1]), dtype=bool)
    owners: list[int] = []
    indicators: list[np.ndarray] = []
    # Only columns holding a repeated value can be constant on an overlap of >= 2 rows.
    ordered = np.sort(X, axis=0)  # NaN sorts last; NaN == NaN is False
    has_repeat = np.any(ordered[1:] == ordered[:-1], axis=0)
    for i in np.flatnonzero(has_repeat):
        column = X[:, i]
        values, counts = np.unique(column[np.isfinite(column)], return_counts=True)
        for v in values[counts >= max(min_overlap, 1)]:
            owners.append(i)
            indicators.append((column == v).astype(np.int64))
    if owners:
        counts_on_overlap = np.stack(indicators) @ finite_y.astype(np.int64)  # (K, N_y)
        for row, i in enumerate(owners):
            const[i] |= counts_on_overlap[row] == overlap[i]
    return const


def masked_cross_correlation(
    X: np.ndarray, Y: np.ndarray, min_overlap: int
) -> tuple[np.ndarray, np.ndarray]:
    """Pairwise-complete Pearson correlation of every column of ``X`` with every column of ``Y``.

    ``X`` and ``Y`` have the same number of rows. Vectorised float64 with masks:
    ``n = Mxᵀ My``, ``Sx = Xᵀ My``, ``Sy = Mxᵀ Y``, ``Sxx``, ``Syy``, ``Sxy`` likewise (NaN read as
    0 under the masks), then ``cov = Sxy − Sx·Sy/n``, ``var_x = Sxx − Sx²/n``,
    ``corr = cov / sqrt(var_x·var_y)``. Each column is first shifted by its own finite mean
    (correlation is shift-invariant) so the one-pass sums rarely cancel; pairs where they still
    could (raw/centred second moments > 1e4 combined) are recomputed with two passes. NaN where
    ``n < min_overlap`` or either side is exactly constant on the overlap (decided exactly by
    :func:`_exactly_constant_on_overlap`, not from the rounded variance). Values clipped to
    [-1, 1]. Returns ``(corr float64, overlap int64)``.
    """
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    mx = np.isfinite(X)
    my = np.isfinite(Y)
    shift_x = np.where(mx, X, 0.0).sum(axis=0) / np.maximum(mx.sum(axis=0), 1)
    shift_y = np.where(my, Y, 0.0).sum(axis=0) / np.maximum(my.sum(axis=0), 1)
    x0 = np.where(mx, X - shift_x, 0.0)
    y0 = np.where(my, Y - shift_y, 0.0)
    fx = mx.astype(np.float64)
    fy = my.astype(np.float64)
    n = fx.T @ fy
    sx = x0.T @ fy
    sy = fx.T @ y0
    sxx = (x0 * x0).T @ fy
    syy = fx.T @ (y0 * y0)
    sxy = x0.T @ y0
    overlap = np.rint(n).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        cov = sxy - sx * sy / n
        var_x = sxx - sx * sx / n
        var_y = syy - sy * sy / n
        corr = cov / np.sqrt(var_x * var_y)
    const_x = _exactly_constant_on_overlap(X, my, overlap, min_overlap)
    const_y = _exactly_constant_on_overlap(Y, mx, overlap.T, min_overlap).T
    undefined = (overlap < min_overlap) | const_x | const_y
    defined = ~undefined
    # One-pass sums lose about eps64 · (raw / centred second moment) per side: a column quiet or
    # drifting on one partner's rows only. Where that could exceed ~1e-12, redo the pair exactly
    # with two passes over its own overlap.
    with np.errstate(invalid="ignore", divide="ignore"):
        conditioning = (sxx / var_x) * (syy / var_y)
    ill = defined & ~(conditioning < 1e4)
    for i, j in np.argwhere(ill):
        rows = mx[:, i] & my[:, j]
        corr[i, j] = _two_pass_corr(X[rows, i], Y[rows, j])
    # A non-constant float32-valued series never rounds to a non-positive variance here.
    assert np.all(var_x[defined & ~ill] > 0) and np.all(var_y[defined & ~ill] > 0)
    corr = np.where(undefined, np.nan, np.clip(corr, -1.0, 1.0))
    return corr, overlap


def _two_pass_corr(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation of two finite, non-constant float64 vectors, centred first."""
    dx = x - x.mean()
    dy = y - y.mean()
    return float(np.dot(dx, dy) / np.sqrt(np.dot(dx, dx) * np.dot(dy, dy)))


def loop_cross_correlation(
    X: np.ndarray, Y: np.ndarray, min_overlap: int
) -> tuple[np.ndarray, np.ndarray]:
    """The same as :func:`masked_cross_correlation` with plain loops and two-pass sums.

    For tiny inputs only; used to check the vectorised reference itself.
    """
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    corr = np.full((X.shape[1], Y.shape[1]), np.nan)
    overlap = np.zeros((X.shape[1], Y.shape[1]), dtype=np.int64)
    for i in range(X.shape[1]):
        for j in range(Y.shape[1]):
            xs, ys = [], []
            for t in range(X.shape[0]):
                if np.isfinite(X[t, i]) and np.isfinite(Y[t, j]):
                    xs.append(X[t, i])
                    ys.append(Y[t, j])
            overlap[i, j] = len(xs)
            if len(xs) < min_overlap or len(set(xs)) == 1 or len(set(ys)) == 1:
                continue
            mean_x = sum(xs) / len(xs)
            mean_y = sum(ys) / len(ys)
            cov = sum((a - mean_x) * (b - mean_y) for a, b in zip(xs, ys, strict=True))
            var_x = sum((a - mean_x) ** 2 for a in xs)
            var_y = sum((b - mean_y) ** 2 for b in ys)
            corr[i, j] = min(1.0, max(-1.0, cov / np.sqrt(var_x * var_y)))
    return corr, overlap


# --------------------------------------------------------------------------------------------
# §4 top-k neighbors
# --------------------------------------------------------------------------------------------


@dataclass
class ReferenceNeighbors:
    index: np.ndarray  # int64 N×k, -1 padded
    corr: np.ndarray  # corr's dtype N×k, NaN padded
    overlap: np.ndarray | None  # int64 N×k, -1 padded (padding not specified by the SPEC)


def reference_top_k(
    corr: np.ndarray, k: int, overlap: np.ndarray | None = None
) -> ReferenceNeighbors:
    """SPEC §4: per row, a full stable sort of finite ``j != i`` by ``(-|corr[i, j]|, j)``."""
    corr = np.asarray(corr)
    N = corr.shape[0]
    index = np.full((N, k), -1, dtype=np.int64)
    values = np.full((N, k), np.nan, dtype=corr.dtype)
    picked_overlap = None if overlap is None else np.full((N, k), -1, dtype=np.int64)
    for i in range(N):
        row = corr[i]
        js = np.array([j for j in range(N) if j != i and np.isfinite(row[j])], dtype=np.int64)
        if js.size == 0:
            continue
        order = sorted(js.tolist(), key=lambda j: (-abs(float(row[j])), j))[:k]
        index[i, : len(order)] = order
        values[i, : len(order)] = row[order]
        if picked_overlap is not None:
            picked_overlap[i, : len(order)] = overlap[i, order]
    return ReferenceNeighbors(index, values, picked_overlap)


# --------------------------------------------------------------------------------------------
# §5 clusters
# --------------------------------------------------------------------------------------------


def market_modes_removed_reference(
    corr: np.ndarray, m: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SPEC §5 ``C_m`` by ``numpy.linalg.eigh`` of the dense float64 ``C`` (NaN → 0, unit
    diagonal), with the ``m`` largest eigenvalues (descending) and their vectors. A symbol whose
    residual variance is not positive gets NaN off the diagonal."""
    C = np.nan_to_num(np.asarray(corr, dtype=np.float64), nan=0.0)
    np.fill_diagonal(C, 1.0)
    w, V = np.linalg.eigh(C)
    top = np.argsort(w)[::-1][:m]
    w, V = w[top], V[:, top]
    residual = C - (V * w) @ V.T
    d = np.diag(residual).copy()
    scale = np.full(d.shape, np.nan)
    scale[d > 0] = 1.0 / np.sqrt(d[d > 0])
    C_m = residual * scale[:, None] * scale[None, :]
    np.fill_diagonal(C_m, 1.0)
    return C_m, w, V


def reference_market_residuals(R: np.ndarray, corr: np.ndarray, m: int) -> np.ndarray:
    """SPEC §6 "Market residuals", literally, in float64: ``v_1..v_m`` from
    ``numpy.linalg.eigh`` of ``C`` (:func:`market_modes_removed_reference`), ``z`` each column
    less its finite mean over its ddof-0 std (0 where NaN), ``F = z @ V``, then per symbol
    ``numpy.linalg.lstsq`` of its finite returns on ``(1, F)``; NaN where ``R`` is."""
    X = np.asarray(R, dtype=np.float64)
    finite = np.isfinite(X)
    _, _, V = market_modes_removed_reference(corr, m)
    z = np.zeros_like(X)
    for j in range(X.shape[1]):
        values = X[finite[:, j], j]
        if values.size and values.std() > 0:
            z[finite[:, j], j] = (values - values.mean()) / values.std()
    F = z @ V
    E = np.full(X.shape, np.nan)
    for j in range(X.shape[1]):
        rows = finite[:, j]
        design = np.column_stack([np.ones(rows.sum()), F[rows]])
        beta = np.linalg.lstsq(design, X[rows, j], rcond=None)[0]
        E[rows, j] = X[rows, j] - design @ beta
    return E


def mantegna_condensed(corr: np.ndarray) -> np.ndarray:
    """Condensed float64 ``d = sqrt(2 (1 - corr))`` with NaN corr taken as 0, diagonal 0."""
    c = np.asarray(corr, dtype=np.float64).copy()
    c[~np.isfinite(c)] = 0.0
    d = np.sqrt(2.0 * (1.0 - c))
    np.fill_diagonal(d, 0.0)
    return squareform(d, checks=False)


def reference_linkage(corr: np.ndarray, method: str) -> np.ndarray:
    """``scipy.cluster.hierarchy.linkage`` on :func:`mantegna_condensed`."""
    return hierarchy.linkage(mantegna_condensed(corr), method=method)


def canonical_labels(labels: np.ndarray) -> np.ndarray:
    """Relabel a partition ``0..K-1`` by first appearance (so one partition has one labelling)."""
    mapping: dict[int, int] = {}
    out = np.empty(len(labels), dtype=np.int64)
    for position, label in enumerate(np.asarray(labels).tolist()):
        out[position] = mapping.setdefault(label, len(mapping))
    return out


def reference_clusters(
    corr: np.ndarray,
    method: str = "average",
    distance_threshold: float | None = None,
    n_clusters: int | None = None,
) -> np.ndarray:
    """SPEC §5 reference: scipy linkage + fcluster, canonicalised. Exactly one cut must be given."""
    N = corr.shape[0]
    if N == 1:
        return np.zeros(1, dtype=np.int64)
    Z = reference_linkage(corr, method)
    if distance_threshold is not None:
        labels = hierarchy.fcluster(Z, t=distance_threshold, criterion="distance")
    else:
        labels = hierarchy.fcluster(Z, t=n_clusters, criterion="maxclust")
    return canonical_labels(labels)


# --------------------------------------------------------------------------------------------
# §6 lead-lag pairs
# --------------------------------------------------------------------------------------------


@dataclass
class LeadLagReference:
    """Everything the brute-force scan knows, for comparisons and near-tie excuses."""

    lagged: np.ndarray  # (max_lag, N, N) float64, lagged[l-1][i, j] = corr(R[t, i], R[t+l, j])
    lagged_overlap: np.ndarray  # (max_lag, N, N) int64
    sync_corr: np.ndarray  # (N, N) float64 (NaN allowed), the corr used for improvements
    best_lag: np.ndarray  # (N, N) int64, 0 where no finite lag
    best_abs: np.ndarray  # (N, N) float64, -inf where no finite lag
    second_abs: np.ndarray  # (N, N) float64 best |lagged| among the other lags, -inf if none
    improvement: np.ndarray  # (N, N) float64, NaN where no finite lag
    candidate: np.ndarray  # (N, N) bool
    pairs: np.ndarray  # LEAD_LAG_DTYPE, sorted per SPEC
    k_leaders: int
    k_laggers: int
    min_improvement: float
    p_value: np.ndarray  # (N, N) float64 Šidák p-value of the best lag, NaN where none
    q_value: np.ndarray  # (N, N) float64 Benjamini–Hochberg over every pair with a best lag
    max_q_value: float = 1.0


def reference_robust_t(R: np.ndarray, max_lag: int) -> np.ndarray:
    """``t[l-1][i, j]`` = SPEC §6's robust statistic of ``(x̃[t, i], x̃[t + l, j])``:
    ``Σ a·b / sqrt(Σ a²·b²)`` over the rows where both are finite, ``x̃`` each column less its
    mean over its own finite rows (0 where the denominator is 0), in float64."""
    X = np.asarray(R, dtype=np.float64)
    T, N = X.shape
    finite = np.isfinite(X)
    counts = np.maximum(finite.sum(axis=0), 1)
    centred = np.where(finite, X - np.where(finite, X, 0.0).sum(axis=0) / counts, 0.0)
    t = np.zeros((max_lag, N, N))
    for lag in range(1, max_lag + 1):
        a, b = centred[: T - lag], centred[lag:]
        numerator = a.T @ b
        denominator = (a * a).T @ (b * b)
        with np.errstate(divide="ignore", invalid="ignore"):
            t[lag - 1] = np.where(denominator > 0, numerator / np.sqrt(denominator), 0.0)
    return t


def reference_significance(
    best_t: np.ndarray, has_best: np.ndarray, max_lag: int
) -> tuple[np.ndarray, np.ndarray]:
    """SPEC §6 "Significance", literally: ``p = erfc(|t| / √2)`` of the robust statistic at the
    best lag, ``p_value = 1 − (1 − p)^max_lag``; ``q`` by sorting the ``M`` p-values of
    ``has_best`` ascending, ``q_(k) = min over l >= k of p_(l)·M / l``, capped at 1 (NaN
    elsewhere)."""
    p = erfc(np.abs(best_t) / np.sqrt(2.0))
    with np.errstate(divide="ignore"):
        p_value = np.where(has_best, -np.expm1(max_lag * np.log1p(-p)), np.nan)
    flat = p_value[has_best]
    order = np.argsort(flat, kind="stable")
    ranked = flat[order] * flat.size / np.arange(1, flat.size + 1)
    q = np.empty(flat.size)
    q[order] = np.minimum(np.minimum.accumulate(ranked[::-1])[::-1], 1.0)
    q_value = np.full(p_value.shape, np.nan)
    q_value[has_best] = q
    return p_value, q_value


def reference_lagged_correlations(
    R: np.ndarray, max_lag: int, min_overlap: int
) -> tuple[np.ndarray, np.ndarray]:
    """``lagged[l-1][i, j]`` = pairwise-complete corr of ``(R[t, i], R[t + l, j])``, t = 0..T-1-l."""
    R64 = np.asarray(R, dtype=np.float64)
    T, N = R64.shape
    lagged = np.full((max_lag, N, N), np.nan)
    overlap = np.zeros((max_lag, N, N), dtype=np.int64)
    for lag in range(1, max_lag + 1):
        lagged[lag - 1], overlap[lag - 1] = masked_cross_correlation(
            R64[: T - lag], R64[lag:], min_overlap
        )
    return lagged, overlap


def reference_lead_lag(
    R: np.ndarray,
    *,
    max_lag: int,
    k_leaders: int,
    k_laggers: int,
    min_overlap: int,
    min_improvement: float = 0.0,
    corr: np.ndarray | None = None,
    max_q_value: float = 1.0,
) -> LeadLagReference:
    """SPEC §6, literally, over the full N × N matrix of every lag.

    * ``lagged[l]`` from :func:`reference_lagged_correlations` for ``l = 1..max_lag``.
    * best lag ``l*`` = argmax over finite ``|lagged[l][i, j]|``, first (smallest) lag on ties;
      no finite lag → not a candidate.
    * ``improvement = |lagged[l*]| − |corr|`` with NaN ``corr`` read as 0; ``corr`` is the given
      synchronous matrix, or the float64 pandas reference when ``None``.
    * p- and q-values by :func:`reference_significance` of :func:`reference_robust_t` at the
      best lag, over the pairs ``i != j`` with a best lag; the reverse direction is the ordered
      pair ``(j, i)``'s best lag, lagged correlation and q-value.
    * candidate iff ``i != j``, ``improvement > min_improvement`` and ``q <= max_q_value``.
    * per symbol ``s``: its ``k_laggers`` best candidates in row ``s`` (ties → smaller lagger) and
      its ``k_leaders`` best candidates in column ``s`` (ties → smaller leader); union; sorted by
      improvement desc, leader, lagger.
    """
    R = np.asarray(R)
    N = R.shape[1]
    if corr is None:
        sync = reference_correlation(R, min_overlap)[0]
    else:
        sync = np.asarray(corr, dtype=np.float64)
    lagged, lagged_overlap = reference_lagged_correlations(R, max_lag, min_overlap)

    abs_lagged = np.where(np.isfinite(lagged), np.abs(lagged), -np.inf)
    # first maximum → smallest lag on ties; magnitudes that only float64 tells apart are a tie
    # (the package compares float32 |r|, SPEC §6's near-tie): resolved the package's way, so
    # that the p-value of every pair, which each q-value depends on, is that lag's
    best_index = np.argmax(abs_lagged.astype(np.float32), axis=0)
    has_finite = np.isfinite(lagged).any(axis=0)
    best_abs = np.take_along_axis(abs_lagged, best_index[None], axis=0)[0]
    others = abs_lagged.copy()
    np.put_along_axis(others, best_index[None], -np.inf, axis=0)
    second_abs = others.max(axis=0) if max_lag > 1 else np.full((N, N), -np.inf)
    best_lag = np.where(has_finite, best_index + 1, 0)

    sync_abs = np.where(np.isfinite(sync), np.abs(sync), 0.0)
    improvement = np.where(has_finite, best_abs - sync_abs, np.nan)
    off_diagonal = ~np.eye(N, dtype=bool)
    robust = reference_robust_t(R, max_lag)
    best_t = np.take_along_axis(robust, np.maximum(best_lag - 1, 0)[None], 0)[0]
    p_value, q_value = reference_significance(best_t, has_finite & off_diagonal, max_lag)
    with np.errstate(invalid="ignore"):
        candidate = has_finite & off_diagonal & (improvement > min_improvement)
        candidate &= (q_value <= max_q_value) | (max_q_value >= 1.0)

    selected: set[tuple[int, int]] = set()
    for s in range(N):
        laggers = np.flatnonzero(candidate[s])
        order = sorted(laggers.tolist(), key=lambda j: (-improvement[s, j], j))
        selected.update((s, j) for j in order[:k_laggers])
        leaders = np.flatnonzero(candidate[:, s])
        order = sorted(leaders.tolist(), key=lambda i: (-improvement[i, s], i))
        selected.update((i, s) for i in order[:k_leaders])

    ordered = sorted(selected, key=lambda p: (-improvement[p], p[0], p[1]))
    pairs = np.zeros(len(ordered), dtype=LEAD_LAG_DTYPE)
    for row, (i, j) in enumerate(ordered):
        lag = int(best_lag[i, j])
        back = int(best_lag[j, i])
        pairs[row] = (
            i,
            j,
            lag,
            lagged[lag - 1, i, j],
            sync[i, j],
            improvement[i, j],
            lagged_overlap[lag - 1, i, j],
            p_value[i, j],
            q_value[i, j],
            back,
            lagged[back - 1, j, i] if back else np.nan,
            q_value[j, i] if back else np.nan,
        )
    return LeadLagReference(
        lagged=lagged,
        lagged_overlap=lagged_overlap,
        sync_corr=sync,
        best_lag=best_lag,
        best_abs=best_abs,
        second_abs=second_abs,
        improvement=improvement,
        candidate=candidate,
        pairs=pairs,
        k_leaders=k_leaders,
        k_laggers=k_laggers,
        min_improvement=min_improvement,
        p_value=p_value,
        q_value=q_value,
        max_q_value=max_q_value,
    )


@dataclass
class LeadLagExcuses:
    """Which reference decisions a float32 implementation may legitimately flip (SPEC §6).

    ``surely_in``: selected whatever happens to values within ``tol``; ``surely_out``: never
    selected; anything else is excused (a near-tie at a rank boundary, an improvement within
    ``tol`` of ``min_improvement`` or a q-value within ``tol`` relative of ``max_q_value``). ``lag_tie``: a second lag within ``tol`` of the best.
    """

    surely_in: np.ndarray  # (N, N) bool
    surely_out: np.ndarray  # (N, N) bool
    lag_tie: np.ndarray  # (N, N) bool

    @property
    def excused(self) -> np.ndarray:
        return ~self.surely_in & ~self.surely_out


def _seed_status(
    values: np.ndarray, maybe: np.ndarray, sure: np.ndarray, k: int, tol: float
) -> tuple[np.ndarray, np.ndarray]:
    """For one seed's candidate list (a row or a column): which entries are surely in its top
    ``k`` and which are surely out, when every value may move by ``tol``.

    Entry ``p`` with improvement ``x`` is surely in iff it is surely a candidate and fewer than
    ``k`` other possible candidates have improvement ``> x − tol`` (could be ranked above it);
    surely out iff it cannot be a candidate or at least ``k`` sure candidates have improvement
    ``> x + tol``. With no near-tie at the k-th/(k+1)-th boundary, everything is sure.
    """
    n = values.size
    if k == 0:
        return np.zeros(n, dtype=bool), np.ones(n, dtype=bool)
    maybe_sorted = np.sort(values[maybe])
    sure_sorted = np.sort(values[sure])
    # count(maybe > x - tol) - 1 (p itself) and count(sure > x + tol), for every entry at once.
    could_be_above = maybe_sorted.size - np.searchsorted(maybe_sorted, values - tol, "right") - 1
    surely_above = sure_sorted.size - np.searchsorted(sure_sorted, values + tol, "right")
    surely_in = sure & (could_be_above < k)
    surely_out = ~maybe | (surely_above >= k)
    return surely_in, surely_out


def lead_lag_excuses(reference: LeadLagReference, tol: float = 1e-5) -> LeadLagExcuses:
    """Per pair: surely selected / surely not / excused near-tie (SPEC §6 agreement rule)."""
    imp = reference.improvement
    N = imp.shape[0]
    off_diagonal = ~np.eye(N, dtype=bool)
    finite = np.isfinite(imp) & off_diagonal
    with np.errstate(invalid="ignore"):
        sure = finite & (imp > reference.min_improvement + tol)
        maybe = finite & (imp > reference.min_improvement - tol)
        if reference.max_q_value < 1.0:  # q-values agree to within tol relative (SPEC §6)
            sure &= reference.q_value <= reference.max_q_value * (1.0 - tol)
            maybe &= reference.q_value <= reference.max_q_value * (1.0 + tol)
    values = np.where(finite, imp, -np.inf)
    in_row = np.zeros((N, N), dtype=bool)
    out_row = np.ones((N, N), dtype=bool)
    in_col = np.zeros((N, N), dtype=bool)
    out_col = np.ones((N, N), dtype=bool)
    for s in range(N):
        in_row[s], out_row[s] = _seed_status(values[s], maybe[s], sure[s], reference.k_laggers, tol)
        in_col[:, s], out_col[:, s] = _seed_status(
            values[:, s], maybe[:, s], sure[:, s], reference.k_leaders, tol
        )
    surely_in = in_row | in_col
    surely_out = out_row & out_col & ~surely_in
    with np.errstate(invalid="ignore"):
        lag_tie = np.isfinite(reference.second_abs) & (
            reference.best_abs - reference.second_abs < tol
        )
    return LeadLagExcuses(surely_in=surely_in, surely_out=surely_out, lag_tie=lag_tie)
