"""worker_pool: one thread per core, numpy's BLAS limited to one thread inside, restored after."""

from __future__ import annotations

from threadpoolctl import threadpool_info, threadpool_limits

from corr_pipeline.compute import workers


def _blas_threads(info: list[dict]) -> dict[str, int]:
    return {lib["filepath"]: lib["num_threads"] for lib in info if lib["user_api"] == "blas"}


def test_worker_pool_limits_blas_to_one_thread_and_restores_it() -> None:
    """Through the cached controller: every BLAS library it knows (numpy's among them) runs
    one thread inside the pool and gets its previous setting back after, also on re-entry."""
    with threadpool_limits(limits=2, user_api="blas"):
        before = _blas_threads(threadpool_info())
        numpy_blas = [path for path in before if "numpy" in path]
        for _ in range(2):
            with workers.worker_pool() as pool:
                assert pool._max_workers == workers.available_cores()
                inside = _blas_threads(workers._blas_controller().info())
                assert inside and set(inside.values()) == {1}
                assert set(numpy_blas) <= set(inside)
            after = _blas_threads(threadpool_info())
            assert after == before
