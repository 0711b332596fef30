"""Bad arguments to the public compute API fail up front with a clear error naming the argument.

Convention (agreed with the compute API, SPEC §9): a wrong *type or dtype* (``R`` not a float32
ndarray, a float where an integer is needed, an output array of the wrong dtype) raises
``TypeError``; a wrong *value or shape* raises ``ValueError``. Messages name the argument.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from corr_pipeline.compute import find_lead_lag_pairs, pairwise_correlation
from corr_pipeline.compute.clusters import distance_buffer_length

try:
    from corr_pipeline.compute import hierarchical_clusters, top_k_neighbors
except ImportError:  # pragma: no cover - reported by test_public_api_exports
    from corr_pipeline.compute.clusters import hierarchical_clusters
    from corr_pipeline.compute.neighbors import top_k_neighbors

T, N = 50, 6
RNG = np.random.default_rng(0)
R = RNG.standard_normal((T, N)).astype(np.float32)
CORR = np.corrcoef(R.T).astype(np.float32)


def test_public_api_exports() -> None:
    """SPEC §9: all four functions import from ``corr_pipeline.compute`` without Dagster/DB."""
    module = importlib.import_module("corr_pipeline.compute")
    for name in (
        "pairwise_correlation",
        "top_k_neighbors",
        "hierarchical_clusters",
        "find_lead_lag_pairs",
    ):
        assert callable(getattr(module, name, None)), f"corr_pipeline.compute.{name} missing"


# --------------------------------------------------------------------------------------------
# pairwise_correlation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad_R", "error"),
    [
        (R.astype(np.float64), TypeError),
        (R.astype(np.float16), TypeError),
        (np.ones((T, N), dtype=np.int32), TypeError),
        (R.tolist(), TypeError),
        (R[:, 0], ValueError),
        (R[None], ValueError),
    ],
    ids=["float64", "float16", "int32", "list", "1-D", "3-D"],
)
def test_correlation_rejects_bad_R(bad_R, error) -> None:
    with pytest.raises(error, match="R"):
        pairwise_correlation(bad_R, min_overlap=10)


@pytest.mark.parametrize("min_overlap", [-1, 0, 1, T + 1, 10**6])
def test_correlation_rejects_bad_min_overlap(min_overlap) -> None:
    with pytest.raises(ValueError, match="min_overlap"):
        pairwise_correlation(R, min_overlap=min_overlap)


def test_correlation_min_overlap_bounds_are_inclusive() -> None:
    assert np.isfinite(pairwise_correlation(R, min_overlap=2).corr).all()
    assert np.isfinite(pairwise_correlation(R, min_overlap=T).corr).all()


def test_correlation_rejects_non_integer_min_overlap() -> None:
    with pytest.raises(TypeError, match="min_overlap"):
        pairwise_correlation(R, min_overlap=10.5)


@pytest.mark.parametrize("budget", [0, -1.0])
def test_correlation_rejects_bad_working_memory(budget) -> None:
    with pytest.raises(ValueError, match="working_memory_mb"):
        pairwise_correlation(R, min_overlap=10, working_memory_mb=budget)


def test_correlation_rejects_bad_block_rows() -> None:
    with pytest.raises(ValueError, match="block_rows"):
        pairwise_correlation(R, min_overlap=10, block_rows=0)


@pytest.mark.parametrize(
    ("name", "array", "error"),
    [
        ("out_corr", np.empty((N, N + 1), np.float32), ValueError),
        ("out_corr", np.empty((N + 1, N + 1), np.float32), ValueError),
        ("out_corr", np.empty(N * N, np.float32), ValueError),
        ("out_corr", np.empty((N, N), np.float64), TypeError),
        ("out_overlap", np.empty((N, N - 1), np.int8), ValueError),
        ("out_overlap", np.empty((N, N), np.int32), TypeError),  # T = 50 → int8
        ("out_overlap", np.empty((N, N), np.float32), TypeError),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_correlation_rejects_bad_output_arrays(name, array, error) -> None:
    with pytest.raises(error, match=name):
        pairwise_correlation(R, min_overlap=10, **{name: array})


def test_correlation_rejects_read_only_output() -> None:
    out = np.empty((N, N), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out_corr"):
        pairwise_correlation(R, min_overlap=10, out_corr=out)


# --------------------------------------------------------------------------------------------
# top_k_neighbors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, -3])
def test_neighbors_rejects_bad_k(k) -> None:
    with pytest.raises(ValueError, match="k"):
        top_k_neighbors(CORR, k=k)


@pytest.mark.parametrize("k", [2.5, 2.0, "2", True], ids=["2.5", "2.0", "str", "bool"])
def test_neighbors_rejects_non_integer_k(k) -> None:
    with pytest.raises(TypeError, match="k"):
        top_k_neighbors(CORR, k=k)


@pytest.mark.parametrize(
    "corr", [CORR[:, :-1], CORR[0], CORR[None]], ids=["not square", "1-D", "3-D"]
)
def test_neighbors_rejects_bad_corr_shape(corr) -> None:
    with pytest.raises(ValueError, match="corr"):
        top_k_neighbors(corr, k=2)


@pytest.mark.parametrize(
    "corr",
    [np.ones((N, N), dtype=np.int16), CORR.astype(np.float64), CORR.tolist()],
    ids=["int16", "float64", "list"],
)
def test_neighbors_rejects_non_float32_corr(corr) -> None:
    with pytest.raises(TypeError, match="corr"):
        top_k_neighbors(corr, k=2)


def test_neighbors_rejects_bad_overlap() -> None:
    with pytest.raises(ValueError, match="overlap"):
        top_k_neighbors(CORR, k=2, overlap=np.ones((N, N + 1), dtype=np.int16))
    with pytest.raises(TypeError, match="overlap"):
        top_k_neighbors(CORR, k=2, overlap=np.ones((N, N), dtype=np.float32))
    with pytest.raises(TypeError, match="overlap"):
        top_k_neighbors(CORR, k=2, overlap=np.ones((N, N), dtype=np.int16).tolist())


@pytest.mark.parametrize("budget", [0, -1.0, float("nan")])
def test_neighbors_rejects_bad_working_memory(budget) -> None:
    with pytest.raises(ValueError, match="working_memory_mb"):
        top_k_neighbors(CORR, k=2, working_memory_mb=budget)


# --------------------------------------------------------------------------------------------
# hierarchical_clusters
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["ward", "centroid", "median", "AVERAGE", ""])
def test_clusters_rejects_unknown_method(method) -> None:
    with pytest.raises(ValueError, match="method"):
        hierarchical_clusters(CORR, method=method, distance_threshold=1.0)


def test_clusters_needs_exactly_one_cut() -> None:
    with pytest.raises(ValueError, match="distance_threshold"):
        hierarchical_clusters(CORR)
    with pytest.raises(ValueError, match="n_clusters"):
        hierarchical_clusters(CORR, distance_threshold=1.0, n_clusters=2)


@pytest.mark.parametrize("n_clusters", [0, -1])
def test_clusters_rejects_bad_n_clusters(n_clusters) -> None:
    with pytest.raises(ValueError, match="n_clusters"):
        hierarchical_clusters(CORR, n_clusters=n_clusters)


@pytest.mark.parametrize("n_clusters", [2.5, float("inf")])
def test_clusters_rejects_non_whole_n_clusters(n_clusters) -> None:
    with pytest.raises(ValueError, match="n_clusters"):
        hierarchical_clusters(CORR, n_clusters=n_clusters)


def test_clusters_accepts_integral_float_n_clusters() -> None:
    np.testing.assert_array_equal(
        hierarchical_clusters(CORR, n_clusters=2.0), hierarchical_clusters(CORR, n_clusters=2)
    )


@pytest.mark.parametrize(
    ("cut", "value"),
    [("n_clusters", "2"), ("n_clusters", True), ("distance_threshold", "1.0")],
    ids=["n_clusters-str", "n_clusters-bool", "threshold-str"],
)
def test_clusters_rejects_non_number_cut(cut, value) -> None:
    with pytest.raises(TypeError, match=cut):
        hierarchical_clusters(CORR, **{cut: value})


@pytest.mark.parametrize("threshold", [float("nan"), float("inf")])
def test_clusters_rejects_non_finite_threshold(threshold) -> None:
    with pytest.raises(ValueError, match="distance_threshold"):
        hierarchical_clusters(CORR, distance_threshold=threshold)


@pytest.mark.parametrize("corr", [CORR[:, :-1], CORR[0]], ids=["not square", "1-D"])
def test_clusters_rejects_bad_corr_shape(corr) -> None:
    with pytest.raises(ValueError, match="corr"):
        hierarchical_clusters(corr, distance_threshold=1.0)


@pytest.mark.parametrize(
    "corr",
    [np.ones((N, N), dtype=np.int32), CORR.astype(np.float64), CORR.tolist()],
    ids=["int32", "float64", "list"],
)
def test_clusters_rejects_non_float32_corr(corr) -> None:
    with pytest.raises(TypeError, match="corr"):
        hierarchical_clusters(corr, distance_threshold=1.0)


def test_clusters_rejects_bad_work_buffer() -> None:
    length = distance_buffer_length(N)
    with pytest.raises(TypeError, match="work"):
        hierarchical_clusters(CORR, n_clusters=2, work=np.empty(length, np.float32))
    with pytest.raises(TypeError, match="work"):
        hierarchical_clusters(CORR, n_clusters=2, work=[0.0] * length)
    with pytest.raises(ValueError, match="work"):
        hierarchical_clusters(CORR, n_clusters=2, work=np.empty(length + 1))
    with pytest.raises(ValueError, match="work"):
        hierarchical_clusters(CORR, n_clusters=2, work=np.empty(2 * length)[::2])
    read_only = np.empty(length)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="work"):
        hierarchical_clusters(CORR, n_clusters=2, work=read_only)


# --------------------------------------------------------------------------------------------
# find_lead_lag_pairs
# --------------------------------------------------------------------------------------------

LEAD_LAG_OK = dict(max_lag=3, k_leaders=2, k_laggers=2, min_overlap=10)


def _lead_lag(**changes):
    return find_lead_lag_pairs(changes.pop("R", R), **{**LEAD_LAG_OK, **changes})


@pytest.mark.parametrize(
    ("bad_R", "error"),
    [
        (R.astype(np.float64), TypeError),
        (R.tolist(), TypeError),
        (R[:, 0], ValueError),
    ],
    ids=["float64", "list", "1-D"],
)
def test_lead_lag_rejects_bad_R(bad_R, error) -> None:
    with pytest.raises(error, match="R"):
        _lead_lag(R=bad_R)


@pytest.mark.parametrize("max_lag", [0, -1, T, T + 5])
def test_lead_lag_rejects_bad_max_lag(max_lag) -> None:
    with pytest.raises(ValueError, match="max_lag"):
        _lead_lag(max_lag=max_lag)


def test_lead_lag_max_lag_upper_bound_is_T_minus_1() -> None:
    _lead_lag(max_lag=T - 1, min_overlap=2)


@pytest.mark.parametrize("name", ["k_leaders", "k_laggers"])
def test_lead_lag_rejects_negative_k(name) -> None:
    with pytest.raises(ValueError, match=name):
        _lead_lag(**{name: -1})


@pytest.mark.parametrize("min_overlap", [0, 1, T + 1])
def test_lead_lag_rejects_bad_min_overlap(min_overlap) -> None:
    with pytest.raises(ValueError, match="min_overlap"):
        _lead_lag(min_overlap=min_overlap)


def test_lead_lag_rejects_non_finite_min_improvement() -> None:
    with pytest.raises(ValueError, match="min_improvement"):
        _lead_lag(min_improvement=float("nan"))


def test_lead_lag_rejects_bad_corr() -> None:
    with pytest.raises(ValueError, match="corr"):
        _lead_lag(corr=CORR[:-1, :-1])
    with pytest.raises(ValueError, match="corr"):
        _lead_lag(corr=CORR[:, :-1])
    with pytest.raises(TypeError, match="corr"):
        _lead_lag(corr=CORR.astype(np.float64))


def test_compute_imports_without_dagster_or_database() -> None:
    """SPEC §9: ``corr_pipeline.compute`` imports numpy/scipy(/numba) only."""
    import subprocess
    import sys

    code = (
        "import sys, corr_pipeline.compute\n"
        "bad = sorted(m for m in ('dagster', 'sqlalchemy', 'psycopg', 'pandas') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
