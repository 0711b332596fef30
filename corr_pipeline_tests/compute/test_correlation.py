"""pairwise_correlation against the pandas reference (SPEC §3), block-size invariance, outputs.

Agreement (SPEC §3): identical NaN pattern, identical overlap, ``|corr − ref| <= 1e-5`` where
``overlap >= 30`` (``<= 1e-4`` below), ``corr == corr.T`` bit for bit, values in [-1, 1], diagonal
1 (NaN for a column with < min_overlap finite returns or constant), float32 ``corr`` and the
smallest signed integer ``overlap`` dtype holding ``T``.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corr_pipeline.compute import pairwise_correlation
from corr_pipeline_tests.compute import reference as ref
from corr_pipeline_tests.compute.universes import (
    Universe,
    correlation_universes,
    factor_returns,
    random_small_universe,
    realistic_universe,
)

UNIVERSES = correlation_universes()
_REFERENCE_CACHE: dict[str, tuple[np.ndarray, np.ndarray]] = {}
_HAS_BLOCK_ROWS = "block_rows" in inspect.signature(pairwise_correlation).parameters


def reference_for(universe: Universe) -> tuple[np.ndarray, np.ndarray]:
    if universe.name not in _REFERENCE_CACHE:
        _REFERENCE_CACHE[universe.name] = ref.reference_correlation(
            universe.R, universe.min_overlap
        )
    return _REFERENCE_CACHE[universe.name]


def _pair(names: list[str], i: int, j: int) -> str:
    return f"({i} {names[i]}, {j} {names[j]})"


def assert_matches_reference(
    corr: np.ndarray,
    overlap: np.ndarray,
    ref_corr: np.ndarray,
    ref_overlap: np.ndarray,
    T: int,
    min_overlap: int,
    names: list[str] | None = None,
) -> None:
    """Every SPEC §3 agreement rule, with the offending pair named on failure."""
    N = ref_corr.shape[0]
    names = names or [f"c{j}" for j in range(N)]
    assert corr.shape == (N, N) and overlap.shape == (N, N)
    assert corr.dtype == np.float32, corr.dtype
    assert overlap.dtype == ref.expected_overlap_dtype(T), (overlap.dtype, T)

    bad = np.argwhere(overlap != ref_overlap)
    assert bad.size == 0, "overlap differs at " + ", ".join(
        f"{_pair(names, i, j)}: {overlap[i, j]} vs {ref_overlap[i, j]}" for i, j in bad[:5]
    )
    bad = np.argwhere(np.isnan(corr) != np.isnan(ref_corr))
    assert bad.size == 0, f"{len(bad)} NaN-pattern differences, e.g. " + ", ".join(
        f"{_pair(names, i, j)}: got {corr[i, j]!r} ref {ref_corr[i, j]!r} overlap {ref_overlap[i, j]}"
        for i, j in bad[:5]
    )
    assert np.array_equal(corr, corr.T, equal_nan=True), "corr is not exactly symmetric"
    assert np.array_equal(np.isnan(corr), np.isnan(corr).T)
    finite = np.isfinite(corr)
    assert not np.isinf(corr).any()
    assert np.all(np.abs(corr[finite]) <= 1.0), "corr outside [-1, 1]"

    error = np.where(finite, np.abs(corr.astype(np.float64) - ref_corr), 0.0)
    tolerance = np.where(ref_overlap >= 30, 1e-5, 1e-4)
    bad = np.argwhere(error > tolerance)
    if bad.size:
        worst = np.unravel_index(np.argmax(error / tolerance), error.shape)
        raise AssertionError(
            f"{len(bad)} pairs beyond tolerance; worst {_pair(names, *worst)}: "
            f"got {corr[worst]!r} ref {ref_corr[worst]!r} error {error[worst]:.3g} "
            f"overlap {ref_overlap[worst]}"
        )

    diag = np.diagonal(corr)
    ref_diag = np.diagonal(ref_corr)
    assert np.array_equal(np.isnan(diag), np.isnan(ref_diag))
    assert np.all(diag[np.isfinite(diag)] == 1.0), "diagonal must be exactly 1"
    # Diagonal NaN iff < min_overlap finite returns or constant (reference module docstring).
    few = np.diagonal(ref_overlap) < min_overlap
    assert np.all(np.isnan(diag[few]))


@pytest.mark.parametrize("universe", UNIVERSES, ids=lambda u: u.name)
def test_matches_pandas_reference(universe: Universe) -> None:
    ref_corr, ref_overlap = reference_for(universe)
    result = pairwise_correlation(universe.R, min_overlap=universe.min_overlap)
    assert_matches_reference(
        result.corr,
        result.overlap,
        ref_corr,
        ref_overlap,
        universe.T,
        universe.min_overlap,
        universe.column_names,
    )


@pytest.mark.parametrize("universe", UNIVERSES, ids=lambda u: u.name)
def test_reference_self_check(universe: Universe) -> None:
    """The pandas reference and the independent masked float64 one agree (tests the tests)."""
    ref_corr, ref_overlap = reference_for(universe)
    masked, masked_overlap = ref.masked_cross_correlation(
        universe.R, universe.R, universe.min_overlap
    )
    assert np.array_equal(masked_overlap, ref_overlap)
    off_diagonal = ~np.eye(universe.N, dtype=bool)
    assert np.array_equal(np.isnan(masked[off_diagonal]), np.isnan(ref_corr[off_diagonal]))
    assert np.nanmax(np.abs(masked - ref_corr), initial=0.0) < 1e-12


def test_adversarial_columns_behave_as_specified() -> None:
    """Spot checks on named adversarial pairs, so a failure says which rule broke."""
    universe = next(u for u in UNIVERSES if u.name.startswith("adversarial_s8"))
    result = pairwise_correlation(universe.R, min_overlap=universe.min_overlap)
    col = {name: j for j, name in enumerate(universe.column_names)}
    m = universe.min_overlap

    def c(a: str, b: str) -> float:
        return float(result.corr[col[a], col[b]])

    def n(a: str, b: str) -> int:
        return int(result.overlap[col[a], col[b]])

    assert n("no_overlap_a", "no_overlap_b") == 0 and np.isnan(c("no_overlap_a", "no_overlap_b"))
    assert np.isnan(c("constant_on_part", "partner_only_where_constant")), "zero variance → NaN"
    assert np.isnan(c("zero_on_part", "partner_only_where_constant")), "zero variance → NaN"
    assert np.isfinite(c("constant_on_part", "z"))
    for size in (m - 1, m, m + 1):
        assert n("overlap_anchor", f"overlap_{size}") == size
    assert np.isnan(c("overlap_anchor", f"overlap_{m - 1}"))
    assert np.isfinite(c("overlap_anchor", f"overlap_{m}"))
    assert np.isfinite(c("overlap_anchor", f"overlap_{m + 1}"))
    assert np.isnan(c("fewer_than_min_overlap", "fewer_than_min_overlap"))
    assert np.isnan(c("fully_constant", "fully_constant"))
    assert np.isnan(c("all_nan", "all_nan")) and n("all_nan", "all_nan") == 0
    assert np.isnan(result.corr[col["all_nan"]]).all()
    assert np.isnan(result.corr[col["fully_constant"]]).all()
    assert c("scale_1e15", "scale_1e15") == 1.0 and c("scale_1e-15", "scale_1e-15") == 1.0
    assert np.isfinite(c("scale_1e15", "scale_1e-15"))
    assert c("near_perfect_pos", "near_perfect_neg") <= -0.99999
    assert c("near_perfect_pos", "near_perfect_neg") >= -1.0
    assert c("z", "duplicate_of_z") >= 0.99999


# --------------------------------------------------------------------------------------------
# Block-size invariance: results must be bit-identical whatever the blocking.
# --------------------------------------------------------------------------------------------


def _assert_identical(a, b, what: str) -> None:
    assert np.array_equal(a.corr, b.corr, equal_nan=True), f"corr differs: {what}"
    assert np.array_equal(a.overlap, b.overlap), f"overlap differs: {what}"


@pytest.mark.parametrize(
    "universe",
    [u for u in UNIVERSES if u.N > 2] + [realistic_universe(21, 60, 300, 20, name="T60_N300")],
    ids=lambda u: u.name,
)
def test_working_memory_invariance(universe: Universe) -> None:
    baseline = pairwise_correlation(universe.R, min_overlap=universe.min_overlap)
    # Budgets giving blocks of a few rows are slow on large N (each block recomputes its tile).
    budgets = (0.001, 0.01, 0.05, 0.3, 4.0) if universe.N <= 40 else (0.02, 0.05, 0.3, 4.0)
    for budget in budgets:
        other = pairwise_correlation(
            universe.R, min_overlap=universe.min_overlap, working_memory_mb=budget
        )
        _assert_identical(baseline, other, f"working_memory_mb={budget}")


@pytest.mark.skipif(not _HAS_BLOCK_ROWS, reason="pairwise_correlation has no block_rows=")
@pytest.mark.parametrize(
    "universe",
    [u for u in UNIVERSES if u.N > 2] + [realistic_universe(22, 40, 290, 10, name="T40_N290")],
    ids=lambda u: u.name,
)
def test_block_rows_invariance(universe: Universe) -> None:
    N = universe.N
    baseline = pairwise_correlation(universe.R, min_overlap=universe.min_overlap)
    small = {1, 7} if N <= 40 else {37}
    for block_rows in sorted(small | {64, 127, 128, 129, 200, N - 1, N, N + 5}):
        other = pairwise_correlation(
            universe.R, min_overlap=universe.min_overlap, block_rows=block_rows
        )
        _assert_identical(baseline, other, f"block_rows={block_rows}")


@st.composite
def small_universes(draw):
    T = draw(st.integers(3, 70))
    N = draw(st.integers(1, 40))
    min_overlap = draw(st.integers(2, T))
    nan_fraction = draw(st.sampled_from([0.0, 0.05, 0.3, 0.7]))
    seed = draw(st.integers(0, 2**31 - 1))
    return random_small_universe(seed, T, N, min_overlap, nan_fraction)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    universe=small_universes(),
    budgets=st.lists(st.sampled_from([0.0005, 0.002, 0.02, 1.0, 256.0]), min_size=1, max_size=3),
    block_rows=st.lists(st.integers(1, 50), min_size=1, max_size=3),
)
def test_random_small_universes(universe: Universe, budgets, block_rows) -> None:
    ref_corr, ref_overlap = ref.reference_correlation(universe.R, universe.min_overlap)
    baseline = pairwise_correlation(universe.R, min_overlap=universe.min_overlap)
    assert_matches_reference(
        baseline.corr, baseline.overlap, ref_corr, ref_overlap, universe.T, universe.min_overlap
    )
    for budget in budgets:
        other = pairwise_correlation(
            universe.R, min_overlap=universe.min_overlap, working_memory_mb=budget
        )
        _assert_identical(baseline, other, f"{universe}, working_memory_mb={budget}")
    if _HAS_BLOCK_ROWS:
        for rows in block_rows:
            other = pairwise_correlation(
                universe.R, min_overlap=universe.min_overlap, block_rows=rows
            )
            _assert_identical(baseline, other, f"{universe}, block_rows={rows}")


# --------------------------------------------------------------------------------------------
# Layouts, output arrays, progress
# --------------------------------------------------------------------------------------------


def test_memory_layout_does_not_matter() -> None:
    universe = realistic_universe(31, 90, 70, 20)
    baseline = pairwise_correlation(universe.R, min_overlap=20)
    fortran = pairwise_correlation(np.asfortranarray(universe.R), min_overlap=20)
    _assert_identical(baseline, fortran, "Fortran-ordered R")
    wide = np.full((90, 140), np.nan, dtype=np.float32)
    wide[:, ::2] = universe.R
    strided = pairwise_correlation(wide[:, ::2], min_overlap=20)
    _assert_identical(baseline, strided, "column-strided view of R")


def test_input_not_modified() -> None:
    universe = realistic_universe(32, 60, 30, 10)
    before = universe.R.copy()
    pairwise_correlation(universe.R, min_overlap=10)
    assert np.array_equal(universe.R, before, equal_nan=True)


def test_fills_given_output_arrays() -> None:
    universe = realistic_universe(33, 120, 45, 30)
    N = universe.N
    out_corr = np.full((N, N), 7.0, dtype=np.float32)
    out_overlap = np.full((N, N), -3, dtype=ref.expected_overlap_dtype(universe.T))
    result = pairwise_correlation(
        universe.R, min_overlap=30, out_corr=out_corr, out_overlap=out_overlap
    )
    assert np.shares_memory(result.corr, out_corr) and result.corr.shape == (N, N)
    assert np.shares_memory(result.overlap, out_overlap)
    ref_corr, ref_overlap = reference_for(universe)
    assert_matches_reference(out_corr, out_overlap, ref_corr, ref_overlap, universe.T, 30)


def test_fills_memory_mapped_outputs(tmp_path) -> None:
    universe = next(u for u in UNIVERSES if u.name.startswith("adversarial_s9"))
    N = universe.N
    corr_path, overlap_path = tmp_path / "corr.npy", tmp_path / "overlap.npy"
    out_corr = np.lib.format.open_memmap(corr_path, mode="w+", dtype=np.float32, shape=(N, N))
    out_overlap = np.lib.format.open_memmap(
        overlap_path, mode="w+", dtype=ref.expected_overlap_dtype(universe.T), shape=(N, N)
    )
    result = pairwise_correlation(
        universe.R,
        min_overlap=universe.min_overlap,
        working_memory_mb=0.05,
        out_corr=out_corr,
        out_overlap=out_overlap,
    )
    assert np.shares_memory(result.corr, out_corr)
    assert np.shares_memory(result.overlap, out_overlap)
    out_corr.flush()
    out_overlap.flush()
    del result, out_corr, out_overlap
    ref_corr, ref_overlap = reference_for(universe)
    assert_matches_reference(
        np.load(corr_path),
        np.load(overlap_path),
        ref_corr,
        ref_overlap,
        universe.T,
        universe.min_overlap,
        universe.column_names,
    )


@pytest.mark.parametrize(("T", "dtype"), [(40, np.int8), (127, np.int8), (128, np.int16)])
def test_overlap_dtype_is_smallest_holding_T(T: int, dtype) -> None:
    universe = realistic_universe(34, T, 5, 2, ragged=False, halts=False, nan_fraction=0.0)
    result = pairwise_correlation(universe.R, min_overlap=2)
    assert result.overlap.dtype == np.dtype(dtype)
    assert result.overlap[0, 0] == T


def test_overlap_dtype_int32_for_long_windows() -> None:
    rng = np.random.default_rng(35)
    R = rng.standard_normal((32768, 3)).astype(np.float32)
    result = pairwise_correlation(R, min_overlap=2)
    assert result.overlap.dtype == np.int32
    assert result.overlap[0, 1] == 32768
    ref_corr, ref_overlap = ref.reference_correlation(R, 2)
    assert_matches_reference(result.corr, result.overlap, ref_corr, ref_overlap, 32768, 2)


def test_progress_reports_every_block() -> None:
    universe = realistic_universe(36, 60, 300, 20)
    calls: list[tuple[int, int]] = []
    kwargs = {"block_rows": 128} if _HAS_BLOCK_ROWS else {"working_memory_mb": 0.2}
    pairwise_correlation(
        universe.R,
        min_overlap=20,
        progress=lambda done, total: calls.append((done, total)),
        **kwargs,
    )
    assert len(calls) >= 2
    total = calls[-1][1]
    assert calls == [(done, total) for done in range(1, total + 1)]


@pytest.mark.parametrize("threads", [1, 3])
def test_thread_count_invariance(monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """Products are single-threaded BLAS calls per tile: any number of workers, same bits."""
    from corr_pipeline.compute import workers

    universe = realistic_universe(5, 60, 300, 20, name="T60_N300")
    baseline = pairwise_correlation(universe.R, min_overlap=universe.min_overlap, block_rows=128)
    monkeypatch.setattr(workers, "available_cores", lambda: threads)
    other = pairwise_correlation(universe.R, min_overlap=universe.min_overlap, block_rows=128)
    _assert_identical(baseline, other, f"{threads} worker threads")


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_product_column_chunks(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    """Products split into column chunks (2,048 by default, so tests rarely see more than one):
    small chunks put the diagonal, block edges and mirrors at every position; still exact."""
    from corr_pipeline.compute.correlation import correlator

    monkeypatch.setattr(correlator, "PRODUCT_COLUMNS", chunk)
    universe = realistic_universe(9, 60, 150, 20, name="T60_N150")
    ref_corr, ref_overlap = reference_for(universe)
    for block_rows in (None, 37, 128):
        result = pairwise_correlation(
            universe.R, min_overlap=universe.min_overlap, block_rows=block_rows
        )
        assert_matches_reference(
            result.corr, result.overlap, ref_corr, ref_overlap, universe.T, universe.min_overlap
        )
        assert np.array_equal(result.corr, result.corr.T, equal_nan=True)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.float32, np.float64])
def test_mirror_block_copies_the_upper_block_below(dtype) -> None:
    """``transposes.mirror_block`` (8 × 8 register transposes inside, element by element on the
    diagonal and at the edges) equals numpy's transposed copy, bit for bit, for blocks at every
    offset and size, and leaves everything else alone."""
    from corr_pipeline.compute import transposes

    rng = np.random.default_rng(5)
    n = 75
    for row_lo, row_hi, col_lo, col_hi in [
        (0, n, 0, n),
        (0, 16, 0, 75),
        (3, 20, 3, 64),
        (8, 16, 24, 40),
        (13, 40, 40, 75),
        (0, 5, 70, 75),
        (30, 31, 0, 75),
    ]:
        matrix = (rng.standard_normal((n, n)) * 100).astype(dtype)
        if dtype in (np.float32, np.float64):
            matrix[rng.random((n, n)) < 0.1] = np.nan
        expected = matrix.copy()
        for r in range(col_lo, col_hi):
            for c in range(row_lo, min(row_hi, r)):
                expected[r, c] = matrix[c, r]
        transposes.mirror_block(matrix, row_lo, row_hi, col_lo, col_hi)
        assert matrix.tobytes() == expected.tobytes(), (row_lo, row_hi, col_lo, col_hi)


# --------------------------------------------------------------------------------------------
# Full-history columns: a row whose presence interval is the whole window takes B's column
# totals instead of prefix-sum lookups (kernels.correlate_tile, ``full_row_i``).
# --------------------------------------------------------------------------------------------


def _full_history_universe(layout: str) -> Universe:
    """T = 80, N = 300 (three product tiles) with full-history columns laid out as ``layout``.

    ``none``: every column listed late, delisted early or with a gap; ``all``: no NaN at all;
    ``mixed``: random columns; ``half_tile``: full-history exactly on columns 64..191 (so the
    tile 0..127 and the tile 128..255 each have rows of both kinds, and 192..299 none);
    ``constant``: mixed, plus full-history columns that are exactly constant (0 and 0.01) or
    constant except one row.
    """
    rng = np.random.default_rng(
        {"none": 41, "all": 42, "mixed": 43, "half_tile": 44}.get(layout, 45)
    )
    T, N = 80, 300
    R = (factor_returns(rng, T, N)).astype(np.float32)
    full = {
        "none": np.zeros(N, bool),
        "all": np.ones(N, bool),
        "mixed": rng.random(N) < 0.5,
        "half_tile": (np.arange(N) >= 64) & (np.arange(N) < 192),
        "constant": rng.random(N) < 0.5,
    }[layout]
    for j in np.flatnonzero(~full):
        kind = j % 3
        if kind == 0:
            R[: rng.integers(1, 30), j] = np.nan  # listed late
        elif kind == 1:
            R[T - rng.integers(1, 30) :, j] = np.nan  # delisted early
        else:
            R[rng.choice(T, rng.integers(1, 4), replace=False), j] = np.nan  # interior gaps
    names = [f"{'full' if f else 'part'}{j}" for j, f in enumerate(full)]
    if layout == "constant":
        for j, value in ((3, 0.0), (130, 0.01), (250, -0.02)):
            R[:, j] = value
            names[j] = f"constant{j}"
        R[:, 7] = 0.01
        R[40, 7] = 0.02
        names[7] = "constant_but_one_row7"
    return Universe(f"full_history_{layout}", R, 20, names)


@pytest.mark.parametrize("layout", ["none", "all", "mixed", "half_tile", "constant"])
def test_full_history_columns(layout: str) -> None:
    """Reference agreement and bit-identity across blockings whatever the share and position
    of full-history columns (0 %, 100 %, mixed, a block boundary inside a run of them, exactly
    constant ones)."""
    universe = _full_history_universe(layout)
    full = np.isfinite(universe.R).all(axis=0)
    assert full.any() == (layout != "none") and full.all() == (layout == "all")
    ref_corr, ref_overlap = ref.reference_correlation(universe.R, universe.min_overlap)
    baseline = pairwise_correlation(universe.R, min_overlap=universe.min_overlap)
    assert_matches_reference(
        baseline.corr,
        baseline.overlap,
        ref_corr,
        ref_overlap,
        universe.T,
        universe.min_overlap,
        universe.column_names,
    )
    if layout == "constant":
        for j in (3, 130, 250):
            assert np.isnan(baseline.corr[j]).all(), universe.column_names[j]
        assert np.isfinite(baseline.corr[7, full]).sum() > 1
    for block_rows in (1, 37, 64, 100, 128, 192, 299):
        other = pairwise_correlation(
            universe.R, min_overlap=universe.min_overlap, block_rows=block_rows
        )
        _assert_identical(baseline, other, f"{universe.name}, block_rows={block_rows}")


def test_standardized_window_layouts() -> None:
    """Each layout of ``standardize`` holds the same values: ``"correlation"`` (the
    correlation's window) the time-major arrays of the full window, whose column-major copies
    are exactly their transposes, and refuses to hand out copies it did not build;
    ``"lead-lag"`` the same but the time-major counts, and the same copies (its chunks count in
    scratches of their own). Checked against numpy: Z is zero where R is missing, each column's
    Z has mean 0 and variance 1 over its finite rows, and the prefix sums are the running sums
    of float64(Z), Z² and the presence."""
    from corr_pipeline.compute.standardize import standardize

    universe = realistic_universe(11, 70, 530, 20, name="T70_N530")
    R = universe.R
    R[:, 5] = 0.25  # a constant column: Z is 0
    full = standardize(R, column_chunk=128)
    lean = standardize(R, column_chunk=100, layout="correlation")
    lead_lag = standardize(R, column_chunk=88, layout="lead-lag")
    for name in ("z", "z_t", "present", "prefix", "prefix_sq", "prefix_count"):
        assert getattr(full, name).tobytes() == getattr(lean, name).tobytes(), name
        if name != "prefix_count":
            assert getattr(full, name).tobytes() == getattr(lead_lag, name).tobytes(), name
    assert lead_lag.prefix_count.shape == (0, 0)
    copies = full.transposed
    assert copies is not None and lean.transposed is None
    assert np.array_equal(copies.present_t, full.present.T)
    assert np.array_equal(copies.prefix_t, full.prefix.T)
    assert np.array_equal(copies.prefix_sq_t, full.prefix_sq.T)
    assert np.array_equal(copies.prefix_count_t, full.prefix_count.T)
    assert lead_lag.transposed is not None
    for name in ("present_t", "prefix_t", "prefix_sq_t", "prefix_count_t"):
        assert getattr(copies, name).tobytes() == getattr(lead_lag, name).tobytes(), name
    with pytest.raises(ValueError, match="without its transposed arrays"):
        _ = lean.prefix_t
    with pytest.raises(ValueError, match="layout must be one of"):
        standardize(R, layout="columns")

    finite = np.isfinite(R)
    z = full.z.astype(np.float64)
    assert np.array_equal(full.present, finite.astype(np.uint8))
    assert np.array_equal(full.z_t, full.z.T)
    assert not z[~finite].any() and not z[:, 5].any()
    varying = [j for j in range(R.shape[1]) if j != 5 and finite[:, j].sum() >= 2]
    counts = finite[:, varying].sum(axis=0)
    np.testing.assert_allclose(z[:, varying].sum(axis=0) / counts, 0.0, atol=1e-6)
    np.testing.assert_allclose((z[:, varying] ** 2).sum(axis=0) / counts, 1.0, rtol=1e-5)
    assert np.array_equal(full.prefix[1:], np.cumsum(z, axis=0))
    assert np.array_equal(full.prefix_sq[1:], np.cumsum(z * z, axis=0))
    assert np.array_equal(full.prefix_count[1:], np.cumsum(finite, axis=0))
    assert not full.prefix[0].any() and not full.prefix_count[0].any()


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
@pytest.mark.parametrize("n_cols", [1, 7, 70, 300, 1024, 4000, 6000, 24_000])
def test_column_chunks_cover_the_columns_in_equal_shares(n_cols: int, workers: int) -> None:
    """``column_chunk_size``: at most MAX_COLUMN_CHUNK columns (unless that leaves fewer than 8),
    a multiple of 8, covering the columns, and the chunks it makes a multiple of the workers
    wherever each worker gets 64 columns or more (narrower chunks round up to a multiple of 8
    and may come out fewer, e.g. 70 columns for 8 workers: 5 chunks of 16)."""
    from corr_pipeline.compute.standardize import MAX_COLUMN_CHUNK, column_chunk_size

    size = column_chunk_size(n_cols, workers)
    chunks = -(-n_cols // size)
    assert size % 8 == 0 and size <= max(MAX_COLUMN_CHUNK, 8)
    assert chunks * size >= n_cols
    if n_cols >= 64 * workers:
        assert chunks % workers == 0, (n_cols, workers, size, chunks)


def test_side_intervals_and_gaps() -> None:
    """``make_side``'s intervals and interior gaps against their definition, on every row
    range of a window with empty, full, listed, delisted and gapped columns."""
    from corr_pipeline.compute.standardize import make_side, standardize

    rng = np.random.default_rng(12)
    T, N = 40, 90
    R = rng.standard_normal((T, N)).astype(np.float32)
    R[rng.random((T, N)) < 0.2] = np.nan
    R[:, 0] = np.nan  # never present
    R[:, 1] = 0.5  # always present
    R[:25, 2] = np.nan  # listed late
    R[10:, 3] = np.nan  # delisted early
    window = standardize(R, layout="correlation")
    for row0, row1 in [(0, T), (0, 1), (5, 30), (39, 40), (20, 40)]:
        side = make_side(window, row0, row1)
        finite = np.isfinite(R[row0:row1])
        for j in range(N):
            rows = np.flatnonzero(finite[:, j])
            lo, hi = (rows[0], rows[-1] + 1) if rows.size else (0, 0)
            assert (side.lo[j], side.hi[j]) == (lo, hi), (row0, row1, j)
            gaps = [t for t in range(lo, hi) if not finite[t, j]]
            got = side.gap_rows[side.gap_ptr[j] : side.gap_ptr[j + 1]]
            assert got.tolist() == gaps, (row0, row1, j)
        assert side.gap_ptr[-1] == side.gap_rows.size


def test_guard_bound_keeps_the_fast_formula() -> None:
    """The fused pass tests the exactness guard first against the whole side's sum of squares
    (an upper bound of its source sum), then exactly: a pair that passes only the exact test
    keeps the fast formula, bit for bit, and does not go to the float64 fallback.

    Column 0 is full-history and 100 times quieter on rows 0..39 than after (each part
    centred); columns 1..8 are
    present on rows 0..39 only (some with an interior gap), so column 0's variance over their
    overlap is below tau times its whole-side sum of squares but well above tau times its
    overlap's. Expected values: the kernel formula in plain float32 scalars from the window's
    float64 prefix sums (each difference rounded once) and the same product call."""
    from corr_pipeline.compute.correlation import PairCorrelator
    from corr_pipeline.compute.correlation.kernels import CORRELATION_TAU, VARIANCE_FLOOR
    from corr_pipeline.compute.standardize import make_side, standardize

    rng = np.random.default_rng(29)
    T, N, min_overlap = 120, 40, 20
    R = factor_returns(rng, T, N).astype(np.float32)
    R[:40, 0] *= np.float32(0.01)
    R[:40, 0] -= R[:40, 0].mean()  # both parts centred: the overall mean does not make the
    R[40:, 0] -= R[40:, 0].mean()  # quiet part's standardised values nearly constant
    R[40:, 1:9] = np.nan
    R[[7, 21], 2] = np.nan
    R[33, 5] = np.nan
    result = pairwise_correlation(R, min_overlap=min_overlap)

    window = standardize(R, layout="correlation")
    side = make_side(window, 0, T)
    sxy = PairCorrelator(window, side, side, None).tile_product(0, N, 0, N)
    f32 = np.float32
    z = window.z
    prefix, prefix_sq, prefix_count = window.prefix, window.prefix_sq, window.prefix_count

    def guard(source: np.float32) -> np.float32:
        return max(f32(CORRELATION_TAU) * source, f32(VARIANCE_FLOOR))

    whole_sq = f32(prefix_sq[T, 0] - prefix_sq[0, 0])
    for j in range(1, 9):
        gaps = [t for t in range(40) if not np.isfinite(R[t, j])]
        sum_x, sq_x = f32(prefix[40, 0] - prefix[0, 0]), f32(prefix_sq[40, 0] - prefix_sq[0, 0])
        source = sq_x
        count = int(prefix_count[40, 0] - prefix_count[0, 0])
        for t in gaps:
            sum_x -= z[t, 0]
            sq_x -= z[t, 0] * z[t, 0]
            count -= 1
        sum_y, sq_y = side.total[j], side.total_sq[j]
        assert sum_x.dtype == sq_x.dtype == sum_y.dtype == np.float32
        n = f32(count)
        var_x, var_y = n * sq_x - sum_x * sum_x, n * sq_y - sum_y * sum_y
        assert var_x <= n * guard(whole_sq)  # fails the bound ...
        assert var_x > n * guard(source)  # ... but not the guard
        assert var_y > n * guard(sq_y)
        value = (n * sxy[0, j] - sum_x * sum_y) / np.sqrt(var_x * var_y)
        expected = min(f32(1.0), max(f32(-1.0), value))
        assert expected.dtype == np.float32
        assert result.corr[0, j] == expected and result.corr[j, 0] == expected, j
        assert result.overlap[0, j] == count == 40 - len(gaps)


def test_variances_in_float32_subnormals_go_to_the_exact_path() -> None:
    """The fused pass sums in float32, so a variance it could only form from subnormal squares
    would be wrong by far more than SPEC allows. The guard's floor (``VARIANCE_FLOOR``) sends
    it to the exact float64 path.

    Column 0 has a mean of exactly 0 (its values come in ± pairs), with rows 0..39 about 1e-22
    of its standard deviation: its standardised squares there are ~1e-44, subnormal in float32.
    Columns 1..8 are present on rows 0..39 only, so their overlap with column 0 is that quiet part.
    Its variance there is most of its sum of squares, so the tau guard alone passes it. Without
    the floor, they came out 3.5e-5 away from the reference (SPEC: 1e-5)."""
    rng = np.random.default_rng(31)
    T, N, min_overlap = 120, 12, 20
    R = factor_returns(rng, T, N).astype(np.float32)
    quiet = rng.uniform(1.0, 3.0, 20).astype(np.float32) * np.float32(1e-24)
    loud = rng.uniform(0.005, 0.02, 40).astype(np.float32)
    R[:40, 0] = np.repeat(quiet, 2) * np.tile(np.float32([1, -1]), 20)
    R[40:, 0] = np.repeat(loud, 2) * np.tile(np.float32([1, -1]), 40)
    R[40:, 1:9] = np.nan
    R[[7, 21], 2] = np.nan
    corr, overlap = ref.reference_correlation(R, min_overlap)
    result = pairwise_correlation(R, min_overlap=min_overlap)
    np.testing.assert_array_equal(result.overlap, overlap)
    np.testing.assert_array_equal(np.isnan(result.corr), np.isnan(corr))
    assert np.nanmax(np.abs(result.corr - corr)) <= 1e-5
    assert np.abs(corr[0, 1:9]).max() > 0.05  # the pairs are not trivially near 0


@pytest.mark.parametrize("dtype", [np.float32, np.int16, np.int8, np.int32])
def test_transpose_columns_is_the_transposed_copy(dtype):
    """transposes.transpose_columns (8 x 8 register transposes, element loops at the edges)
    against numpy's transpose, on shapes with and without full squares."""
    from corr_pipeline.compute.transposes import transpose_columns

    rng = np.random.default_rng(3)
    for rows, cols, first in ((16, 24, 0), (13, 37, 5), (8, 8, 3), (1, 9, 0), (29, 3, 11)):
        source = rng.integers(-100, 100, size=(rows, first + cols + 2)).astype(dtype)
        target = np.full((cols, rows), 77, dtype)
        transpose_columns(source, first, target)
        np.testing.assert_array_equal(target, source[:, first : first + cols].T)
