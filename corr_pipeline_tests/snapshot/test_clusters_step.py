"""The clustering step with its distances in a matrix-store scratch file (SPEC §5, §8).

Reference: ``scipy.cluster.hierarchy.linkage`` on the float64 Mantegna distances of the same
float32 ``corr`` (NaN → 0, ``d = sqrt(2)``) and ``fcluster``, as in
``corr_pipeline_tests/compute/test_clusters.py``. The linkage matrix built in a file-backed
buffer must equal scipy's bit for bit (ties, NaN, small N), the labels of the step must equal
the reference's, and the scratch file must be gone after the step, whether it succeeded or
raised.
"""

from __future__ import annotations

import contextlib
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from scipy.cluster import hierarchy

from corr_pipeline.compute.clusters import linkage as C
from corr_pipeline.snapshot import steps
from corr_pipeline.snapshot.params import SnapshotParameters
from corr_pipeline.store.matrix_store import MatrixStore
from corr_pipeline_tests.compute import reference as ref

P = "2026-11-30"


def _corr(kind: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, n, len(kind)])
    if kind == "continuous":
        corr = np.corrcoef(rng.standard_normal((20, n)), rowvar=False).astype(np.float32)
    elif kind == "ties":  # a few distinct values: many exactly tied distances
        corr = rng.choice(np.linspace(-0.5, 0.9, 4).astype(np.float32), size=(n, n))
    else:  # "nan": undefined correlations (d = sqrt 2 exactly), ties and duplicates (d = 0)
        corr = rng.choice(np.array([np.nan, 0.0, 0.5, 1.0], dtype=np.float32), size=(n, n))
    corr = np.triu(corr, 1)
    corr = corr + corr.T
    np.fill_diagonal(corr, 1.0)
    return corr.astype(np.float32)


def _temps(store: MatrixStore) -> list[Path]:
    return sorted(p for p in store.base_dir.rglob("*") if ".tmp-" in p.name)


class _Recording:
    """``store.scratch`` for the clusters partition, noting each file it handed out."""

    def __init__(self, store: MatrixStore) -> None:
        self.store = store
        self.files: list[Path] = []

    @contextlib.contextmanager
    def __call__(self, name, shape, dtype):
        with self.store.scratch("clusters", P, name, shape, dtype) as work:
            assert isinstance(work, np.memmap)
            self.files.append(Path(work.filename))
            assert self.files[-1].exists()
            yield work


@pytest.mark.parametrize("kind", ["continuous", "ties", "nan"])
def test_linkage_in_a_store_scratch_file_is_scipys_bit_for_bit(tmp_path, kind):
    """The tiled layout filled and linked inside a scratch file of the store: ``Z`` equals
    scipy's exactly, every method, N from 2 (one pair) to 130 (tile boundaries crossed)."""
    store = MatrixStore(tmp_path)
    for n in (2, 3, 4, 65, 130):
        corr = _corr(kind, n, 0)
        condensed = ref.mantegna_condensed(corr)
        G, F, length = C._layout(n, C.TILE_SHIFT)
        for method in ref.LINKAGE_METHODS:
            with store.scratch("clusters", P, "d", (length,), np.float64) as work:
                C._fill(corr, G, F, C.TILE_SHIFT, work, working_memory_mb=1e-3)
                Z = C._linkage(work, n, method, G, F)
                del work
            np.testing.assert_array_equal(
                Z, hierarchy.linkage(condensed, method), err_msg=f"{kind} N={n} {method}"
            )
    assert _temps(store) == []


@pytest.mark.parametrize("kind", ["continuous", "ties", "nan"])
@pytest.mark.parametrize("method", ref.LINKAGE_METHODS)
def test_step_with_scratch_equals_reference_and_removes_the_file(tmp_path, kind, method):
    store = MatrixStore(tmp_path)
    scratch = _Recording(store)
    corr = _corr(kind, 97, 1)
    condensed = ref.mantegna_condensed(corr)
    Z = hierarchy.linkage(condensed, method)
    cuts = [{"distance_threshold": t} for t in (0.5, 1.0, float(np.sqrt(2.0)), 1.5)]
    cuts += [{"n_clusters": k, "distance_threshold": None} for k in (1, 5, 97)]
    for cut in cuts:
        params = SnapshotParameters(linkage_method=method, clusters_memory_mb=0, **cut)
        labels = steps.clusters(corr, params.clusters, scratch=scratch)
        if params.n_clusters is None:
            expected = hierarchy.fcluster(Z, params.distance_threshold, criterion="distance")
        else:
            expected = hierarchy.fcluster(Z, params.n_clusters, criterion="maxclust")
        assert labels.dtype == np.int32
        np.testing.assert_array_equal(labels, ref.canonical_labels(expected), err_msg=str(cut))
        np.testing.assert_array_equal(labels, steps.clusters(corr, params.clusters))  # heap: same
    assert len(scratch.files) == len(cuts)
    assert all(f.parent == tmp_path / "clusters" / P for f in scratch.files)
    assert not any(f.exists() for f in scratch.files)
    assert _temps(store) == []


def test_step_small_n_needs_no_scratch(tmp_path):
    store = MatrixStore(tmp_path)
    scratch = _Recording(store)
    params = SnapshotParameters(distance_threshold=1.0, clusters_memory_mb=0)
    for n in (0, 1):
        labels = steps.clusters(np.ones((n, n), np.float32), params.clusters, scratch=scratch)
        assert labels.tolist() == [0] * n
    assert scratch.files == []
    two = np.array([[1.0, 0.5], [0.5, 1.0]], dtype=np.float32)  # d = 1 exactly
    assert steps.clusters(two, params.clusters, scratch=scratch).tolist() == [0, 0]
    assert steps.clusters(
        two,
        SnapshotParameters(distance_threshold=0.99, clusters_memory_mb=0).clusters,
        scratch=scratch,
    ).tolist() == [0, 1]
    assert len(scratch.files) == 2 and _temps(store) == []


def test_scratch_file_removed_when_the_step_raises(tmp_path):
    """An infinite correlation is found while the distances are being written to the file:
    the step raises and the file is gone."""
    store = MatrixStore(tmp_path)
    scratch = _Recording(store)
    corr = _corr("continuous", 70, 2)
    corr[3, 60] = corr[60, 3] = np.inf
    with pytest.raises(ValueError, match="infinite"):
        steps.clusters(
            corr,
            SnapshotParameters(distance_threshold=1.0, clusters_memory_mb=0).clusters,
            scratch=scratch,
        )
    assert len(scratch.files) == 1 and not scratch.files[0].exists()
    assert _temps(store) == []


def test_step_uses_partial_store_scratch_like_the_snapshot(tmp_path):
    """What the asset and ``corr-pipeline bench`` pass: ``partial(store.scratch, asset,
    partition)``."""
    store = MatrixStore(tmp_path)
    corr = _corr("nan", 50, 3)
    params = SnapshotParameters(n_clusters=4, distance_threshold=None, clusters_memory_mb=0)
    labels = steps.clusters(corr, params.clusters, scratch=partial(store.scratch, "clusters", P))
    expected = hierarchy.fcluster(ref.reference_linkage(corr, "average"), 4, criterion="maxclust")
    np.testing.assert_array_equal(labels, ref.canonical_labels(expected))
    assert _temps(store) == []


@pytest.mark.parametrize("budget_mb", [0, 1, 2])
def test_distances_in_memory_up_to_clusters_memory_mb(tmp_path, budget_mb):
    """``clusters_memory_mb`` decides where the distances live, not what comes out: N = 400
    needs ``distance_buffer_length(400)`` = 86,016 float64 = 0.66 MiB, so a budget of 0 puts
    them in a scratch file and 1 or 2 MiB on the heap; the labels are the same."""
    n = 400
    assert 0 < C.distance_buffer_length(n) * 8 <= 2**20
    store = MatrixStore(tmp_path)
    scratch = _Recording(store)
    corr = _corr("continuous", n, 4)
    params = SnapshotParameters(distance_threshold=1.0, clusters_memory_mb=budget_mb)
    labels = steps.clusters(corr, params.clusters, scratch=scratch)
    assert len(scratch.files) == (1 if budget_mb == 0 else 0)
    assert steps.distances_in_scratch(n, params.clusters) == (budget_mb == 0)
    assert steps.distance_bytes(n) == 8 * C.distance_buffer_length(n)
    expected = hierarchy.fcluster(ref.reference_linkage(corr, "average"), 1.0, "distance")
    np.testing.assert_array_equal(labels, ref.canonical_labels(expected))
    assert "clusters_memory_mb" not in params.as_dict()  # not a result parameter
    assert _temps(store) == []


def test_clusters_memory_mb_must_not_be_negative():
    with pytest.raises(ValueError, match=r"clusters_memory_mb must be >= 0 \(got -1\)"):
        SnapshotParameters(clusters_memory_mb=-1)


def test_modes_beyond_the_symbols_kept_name_their_parameter():
    """The modes a session removes must be fewer than its symbols (SPEC §5, §6): checked
    once the window is known, one line naming the parameter; one Lanczos serves both steps."""
    from corr_pipeline.snapshot.steps import market_modes, modes_needed

    corr = np.eye(3, dtype=np.float32)
    for name in ("lead_lag_market_modes", "market_modes_removed"):
        params = SnapshotParameters(**{name: 3})
        with pytest.raises(ValueError, match=f"{name} = 3 needs more than 3 symbols"):
            market_modes(corr, params)
    both = SnapshotParameters(market_modes_removed=2, lead_lag_market_modes=1)
    assert modes_needed(both) == 2
    assert market_modes(np.eye(4, dtype=np.float32), both).vectors.shape == (4, 2)
