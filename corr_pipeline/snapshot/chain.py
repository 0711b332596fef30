"""One session of the snapshot, written once: each step allocates its outputs in the matrix
store, computes them (:mod:`.steps`), verifies them (:mod:`.verify`) and stores them for the
next step; the last publishes (SPEC §2-§8). The Dagster op and the benchmark both run it.

::

    window ─► returns_matrix ─► correlation_matrix + overlap_matrix ─┬─► top_k_neighbors ─┐
                     │                                              ├─► clusters ─────────┼─► publication
                     └──────────────────────────────────────────────┴─► lead_lag_pairs ───┘

:meth:`SessionChain.run` computes the steps asked for, in the order of :data:`STEPS`, and yields
each step's outputs (:mod:`.session_outputs`) as soon as they are stored: the correlation
yields twice, the matrices and then their verification. The caller measures a step as the time
between two yields, describes what it yields (the op: materializations and check results; the
benchmark: a row of its table) and may stop after any of them (closing the generator). A step
reads what an earlier step of the session stored, else the store's current bundle (the op
computing a selection of the assets). Nothing here knows Dagster: the caller's logging and
progress come in as functions, the matrix store as a :class:`~.session_store.SessionStore`.

The publication pins the store versions it was computed from (``snapshots.matrix_versions``)
and records, beside every parameter, the window's facts and the caller's ``recorded`` (who ran
it) in ``snapshots.params``. Results whose steps saw other symbols than the window, or other
contents of one input, are never published (:class:`~.steps.InconsistentInputsError`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa

from corr_pipeline.compute.market_modes import MarketModes
from corr_pipeline.compute.neighbors import Neighbors
from corr_pipeline.compute.parallel.runners import StripeRunner
from corr_pipeline.compute.suspect import SuspectSymbol
from corr_pipeline.compute.tiling import Progress, overlap_dtype
from corr_pipeline.db.publish import publish_snapshot, read_snapshot_counts
from corr_pipeline.db.window import ReturnsWindow
from corr_pipeline.snapshot import session_outputs as outputs
from corr_pipeline.snapshot import steps, verify
from corr_pipeline.snapshot.params import SnapshotParameters, bundle_params
from corr_pipeline.snapshot.session_store import SessionStore
from corr_pipeline.store import writeback
from corr_pipeline.store.matrix_store import MatrixBundle, StoredArray, sources

__all__ = [
    "PUBLISHED_FROM",
    "STEPS",
    "SessionChain",
]

#: The steps of a session in order, each named by the asset it computes (the correlation's
#: also computes ``overlap_matrix``; the publication's rows go to PostgreSQL).
STEPS = (
    "returns_matrix",
    "correlation_matrix",
    "top_k_neighbors",
    "clusters",
    "lead_lag_pairs",
    "snapshot_publication",
)

#: The bundles a publication is made of, the window's first.
PUBLISHED_FROM = ("returns_matrix", "top_k_neighbors", "clusters", "lead_lag_pairs")


def _no_progress(_what: str) -> Progress | None:
    return None


def _ignore(_line: str) -> None:
    return None


def _symbols(bundle: MatrixBundle) -> list[str]:
    return list(bundle.labels["symbols"])


@dataclass
class SessionChain:
    """One session: its ``day`` computed with ``params`` into ``store``, its window read by
    ``load_window`` and published into ``engine`` with ``recorded`` added to
    ``snapshots.params``.

    ``runner``: the stripes' runner (None: this process's threads); ``progress(what)``: the
    progress of a long kernel (``"correlation"``, ``"neighbors"``, ``"lead-lag scan"``), or
    None; ``info`` and ``warn``: where the chain's log lines go; ``in_memory``: the session's
    matrices in the store's memory area when it has room (a session that retention will not
    keep); ``verify``: run the verifications (the op always does; the benchmark when asked).
    ``bundles``: the session's bundles by asset, as stored (or loaded); ``computing``: the step
    being computed, for the caller's report of an error."""

    day: dt.date
    params: SnapshotParameters
    store: SessionStore
    engine: sa.Engine
    load_window: Callable[[], ReturnsWindow]
    recorded: Mapping[str, Any] = field(default_factory=dict)
    runner: StripeRunner | None = None
    progress: Callable[[str], Progress | None] = _no_progress
    info: Callable[[str], None] = _ignore
    warn: Callable[[str], None] = _ignore
    in_memory: bool = False
    verify: bool = True
    bundles: dict[str, MatrixBundle] = field(default_factory=dict)
    computing: str = ""
    modes: MarketModes | None = None

    @property
    def partition(self) -> str:
        return self.day.isoformat()

    def run(self, wanted: Collection[str] = STEPS) -> Generator[outputs.StepOutput, None, None]:
        """The steps of :data:`STEPS` that are in ``wanted``, in order (module docstring)."""
        compute: dict[str, Callable[[], Iterator[outputs.StepOutput]]] = {
            "returns_matrix": self._returns,
            "correlation_matrix": self._correlation,
            "top_k_neighbors": self._neighbors,
            "clusters": self._clusters,
            "lead_lag_pairs": self._lead_lag,
            "snapshot_publication": self._publication,
        }
        for name in STEPS:
            if name in wanted:
                self.computing = name
                yield from compute[name]()
        self.computing = ""

    def input(self, asset: str) -> MatrixBundle:
        """``asset``'s bundle for the chain's date: computed by an earlier step, else the store's."""
        if asset not in self.bundles:
            self.bundles[asset] = self.store.load(asset)
        return self.bundles[asset]

    def market_modes(self, corr: np.ndarray) -> MarketModes:
        """:func:`.steps.market_modes` of the session's ``corr``, found on first use: one
        Lanczos pass for the clusters and the lead-lag."""
        if self.modes is None:
            self.modes = steps.market_modes(corr, self.params)
        return self.modes

    def _save(self, asset: str, bundle: MatrixBundle) -> MatrixBundle:
        stored = self.bundles[asset] = self.store.save(asset, bundle, in_memory=self.in_memory)
        return stored

    # ----------------------------------------------------------------------------------------
    # the steps
    # ----------------------------------------------------------------------------------------

    def _returns(self) -> Iterator[outputs.ReturnsOutput]:
        params = self.params
        window = self.load_window()
        for note in window.source_notes:
            self.warn(f"price source: {note}")
        verdict = None
        if self.verify:
            verdict = verify.verify_returns(
                window.returns,
                window.symbols,
                min_history_days=params.min_history_days,
                lookback_days=params.lookback_days,
                working_memory_mb=params.working_memory_mb,
            )
            verdict.metadata.update(
                {"n_dropped": len(window.dropped), "bad_prices": int(window.bad_prices)}
            )
        bundle = MatrixBundle(
            {"returns": window.returns},
            labels={"symbols": window.symbols, "dates": window.dates},
            params={
                "snapshot_date": self.day,
                "as_of_trade_date": window.as_of_trade_date,
                "n_dropped": len(window.dropped),
                "dropped": [[symbol, reason] for symbol, reason in window.dropped],
                "suspects": [suspect.as_list() for suspect in window.suspects],
                "bad_prices": int(window.bad_prices),
                "snapshot_params": params.as_dict(),
            },
        )
        yield outputs.ReturnsOutput(self._save("returns_matrix", bundle), verdict, window=window)

    def _correlation(self) -> Iterator[outputs.CorrelationOutput | outputs.CorrelationChecked]:
        params = self.params.correlation
        returns = self.input("returns_matrix")
        R = returns["returns"]
        labels = {"symbols": _symbols(returns)}
        n = len(labels["symbols"])
        store_params = {**bundle_params(params), "n_returns": int(R.shape[0])}

        def allocate(asset: str, name: str, dtype: np.dtype):
            return self.store.allocate(
                asset,
                name,
                (n, n),
                dtype,
                labels=labels,
                params=store_params,
                in_memory=self.in_memory,
            )

        # with-blocks: an exception or Ctrl-C mid-computation deletes both temp files at once
        with (
            allocate("correlation_matrix", "corr", np.dtype(np.float32)) as pending_corr,
            allocate("overlap_matrix", "overlap", overlap_dtype(int(R.shape[0]))) as pending_ov,
        ):
            steps.correlation(
                R,
                params,
                out_corr=pending_corr.array,
                out_overlap=pending_ov.array,
                progress=self.progress("correlation"),
                runner=self.runner,
            )
            committed = (pending_corr.commit(), pending_ov.commit())
        corr, overlap = self._save_committed(returns, labels, store_params, *committed)
        yield outputs.CorrelationOutput(returns, corr, overlap)
        if self.verify:
            stats = verify.correlation_stats(
                corr["corr"],
                overlap["overlap"],
                min_overlap=params.min_overlap,
                finite_counts=np.isfinite(R).sum(axis=0),
            )
            yield outputs.CorrelationChecked(stats, verify.verify_correlation(stats))

    def _save_committed(
        self,
        returns: MatrixBundle,
        labels: dict[str, Any],
        store_params: dict[str, Any],
        corr: StoredArray,
        overlap: StoredArray,
    ) -> tuple[MatrixBundle, MatrixBundle]:
        """The committed correlation and overlap stored as their assets' bundles; their versions
        are no longer protected as being written afterwards, even when storing failed (the
        partition can then be removed)."""
        try:
            stored = [
                self._save(
                    asset,
                    MatrixBundle(
                        {array.name: array},
                        labels=labels,
                        params=store_params,
                        inputs=sources(returns),
                    ),
                )
                for asset, array in (("correlation_matrix", corr), ("overlap_matrix", overlap))
            ]
        finally:
            corr.release_writer_lock()
            overlap.release_writer_lock()
        return stored[0], stored[1]

    def _neighbors(self) -> Iterator[outputs.NeighborsOutput]:
        params = self.params.neighbors
        corr_bundle = self.input("correlation_matrix")
        overlap_bundle = self.input("overlap_matrix")
        corr, overlap = corr_bundle["corr"], overlap_bundle["overlap"]
        found = steps.neighbors(
            corr, overlap, params, progress=self.progress("neighbors"), runner=self.runner
        )
        verdict = None
        if self.verify:
            verdict = verify.verify_neighbors(
                found.index,
                found.corr,
                corr,
                k=params.k_neighbors,
                neighbor_overlap=found.overlap,
                overlap=overlap,
            )
        arrays: dict[str, np.ndarray | StoredArray] = {"index": found.index, "corr": found.corr}
        if found.overlap is not None:
            arrays["overlap"] = found.overlap
        bundle = MatrixBundle(
            arrays,
            labels={"symbols": _symbols(corr_bundle)},
            params={"k": params.k_neighbors},
            inputs=sources(corr_bundle, overlap_bundle),
        )
        yield outputs.NeighborsOutput(self._save("top_k_neighbors", bundle), verdict, found=found)

    @contextmanager
    def _distances_scratch(
        self, name: str, shape: tuple[int, ...], dtype: np.dtype
    ) -> Iterator[np.ndarray]:
        """The clustering's scratch distances (:func:`.steps.clusters`): in the store's memory
        area when it has room (no page is ever written back to a disk), else a file of the
        store, with a warning when the kernel would write it back while the linkage rewrites it
        (:mod:`corr_pipeline.store.writeback`)."""
        with self.store.scratch("clusters", name, shape, dtype, in_memory=True) as work:
            on_disk = Path(str(getattr(work, "filename", ""))).is_relative_to(
                self.store.store.base_dir
            )
            if on_disk:
                warning = writeback.rewrite_warning(
                    "the clustering step's scratch distances",
                    int(work.nbytes),
                    or_else="set clusters_memory_mb above it where memory allows",
                )
                if warning is not None:
                    self.warn(warning)
            yield work

    def _clusters(self) -> Iterator[outputs.ClustersOutput]:
        params = self.params.clusters
        corr_bundle = self.input("correlation_matrix")
        corr = corr_bundle["corr"]
        symbols = _symbols(corr_bundle)
        self.info(
            f"clustering {len(symbols)} symbols of {self.partition}: {params.linkage_method} "
            f"linkage, {params.cut}"
        )
        modes = self.market_modes(corr)
        labels = steps.clusters(corr, params, modes=modes, scratch=self._distances_scratch)
        verdict = verify.verify_clusters(labels, len(symbols)) if self.verify else None
        bundle = MatrixBundle(
            {"labels": labels},
            labels={"symbols": symbols},
            params=bundle_params(params),
            inputs=sources(corr_bundle),
        )
        yield outputs.ClustersOutput(
            self._save("clusters", bundle), verdict, labels=labels, modes=modes
        )

    def _lead_lag(self) -> Iterator[outputs.LeadLagOutput]:
        params = self.params.lead_lag
        returns = self.input("returns_matrix")
        corr_bundle = self.input("correlation_matrix")
        R, corr = returns["returns"], corr_bundle["corr"]
        symbols = _symbols(returns)
        pairs = steps.lead_lag(
            R,
            corr,
            params,
            modes=self.market_modes(corr) if params.market_modes else None,
            progress=self.progress("lead-lag scan"),
            runner=self.runner,
        )
        verdict = None
        if self.verify:
            verdict = verify.verify_lead_lag_step(pairs, len(symbols), params)
        bundle = MatrixBundle(
            {"pairs": pairs},
            labels={"symbols": symbols},
            params=bundle_params(params),
            inputs=sources(returns, corr_bundle),
        )
        yield outputs.LeadLagOutput(self._save("lead_lag_pairs", bundle), verdict, pairs=pairs)

    def _publication(self) -> Iterator[outputs.PublicationOutput]:
        inputs = [self.input(asset) for asset in PUBLISHED_FROM]
        _same_symbols(self.day, inputs)
        returns, neighbors, clusters, lead_lag = inputs
        versions = steps.matrix_versions(
            self.store.store,
            self.partition,
            returns=returns,
            neighbors=neighbors,
            clusters=clusters,
            lead_lag=lead_lag,
        )
        window = returns.params
        results = steps.results_for_publication(
            self.day,
            as_of_trade_date=window["as_of_trade_date"],
            symbols=_symbols(returns),
            n_dropped=int(window["n_dropped"]),
            params=self.params,
            found=Neighbors(neighbors["index"], neighbors["corr"], neighbors["overlap"]),
            labels=clusters["labels"],
            pairs=lead_lag["pairs"],
            recorded={
                "n_returns": int(returns["returns"].shape[0]),
                "bad_prices": int(window.get("bad_prices", 0)),
                "window_first_date": str(returns.labels["dates"][0]),
                **self.recorded,
            },
            matrix_versions=versions,
            suspects=[SuspectSymbol.from_list(row) for row in window.get("suspects", [])],
        )
        report = publish_snapshot(self.engine, results)
        counts, verdict = None, None
        if self.verify:
            counts = read_snapshot_counts(self.engine, self.day)
            verdict = verify.verify_published_counts(results, counts)
        yield outputs.PublicationOutput(results, versions, report, counts, verdict)


def _same_symbols(day: dt.date, bundles: Sequence[MatrixBundle]) -> None:
    """:class:`.steps.InconsistentInputsError` unless every bundle of :data:`PUBLISHED_FROM`
    (in that order) has the window's symbols."""
    symbols = _symbols(bundles[0])
    for asset, bundle in zip(PUBLISHED_FROM[1:], bundles[1:], strict=True):
        if _symbols(bundle) != symbols:
            raise steps.InconsistentInputsError(
                f"{asset} was computed on other symbols than returns_matrix for {day}: "
                "re-materialize the whole partition"
            )
