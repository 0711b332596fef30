"""Dagster IO manager and resource over the matrix store (SPEC §8).

Hand-off contract between assets
--------------------------------
An asset that uses :class:`MatrixStoreIOManager` returns a
:class:`~corr_pipeline.store.matrix_store.MatrixBundle` (directly, or as the value of
``dg.Output(...)`` / ``dg.MaterializeResult(value=...)``); its downstream assets receive a
``MatrixBundle`` whose arrays are :class:`StoredArray` objects wrapping **read-only
memmaps** (``bundle["corr"]`` is the ``np.memmap``; ``bundle.labels`` the shared labels).

Files: ``<store>/<asset name>/<partition key>/``, holding ``<array>.<version>.npy`` +
``<array>.<version>.json`` per committed version and one ``bundle.manifest.json`` naming the
current version of each array (layout: :mod:`corr_pipeline.store.matrix_store`), where *asset
name* is the **last element** of the asset key (key prefixes are not part of the path, so two
assets may not share a last element) and *partition key* is the asset partition
(``"_unpartitioned"`` for unpartitioned assets). Multi-assets work per output: each output goes
to its own asset's directory.

Versions: every bundle handed downstream carries the versions it was loaded from
(``bundle.versions``, ``{array name: version}``) and its ``asset``, so a consumer records what
it read: ``MatrixBundle(..., inputs=sources(upstream, ...))`` (kept by garbage collection while
the consumer's bundle is current) and publication pins them in PostgreSQL.

Zero-copy for large arrays: the asset allocates its outputs *inside the store* at exactly
the location the IO manager will use, fills them, commits, and puts the returned
:class:`StoredArray` in the bundle. ``handle_output`` sees that the array is already a committed
version at that location and only writes the manifest — no byte is copied. ::

    @dg.asset(partitions_def=..., io_manager_key="matrix_io_manager")
    def correlation_matrix(context, matrix_store: MatrixStoreResource, returns_matrix: MatrixBundle):
        R = returns_matrix["returns"]                              # read-only memmap
        n = R.shape[1]
        with matrix_store.allocate_for(context, "corr", (n, n), np.float32) as corr, \\
             matrix_store.allocate_for(context, "overlap", (n, n), np.int16) as overlap:
            pairwise_correlation(R, min_overlap=..., out_corr=corr.array, out_overlap=overlap.array)
            stored_corr, stored_overlap = corr.commit(), overlap.commit()
        return MatrixBundle({"corr": stored_corr, "overlap": stored_overlap},
                            labels={"symbols": returns_matrix.labels["symbols"]},
                            inputs=sources(returns_matrix))

Small arrays can simply be returned as plain ``np.ndarray`` values (copied once into the
store); a :class:`StoredArray` from *another* location (e.g. an upstream input passed
through) is hard-linked, also without copying.

Location: the store's directory is deployment configuration, :func:`corr_pipeline.settings.store_dir`
(``$CORR_PIPELINE_STORE_DIR``, else ``$CORR_PIPELINE_HOME/store``), read when the store is used;
neither the IO manager nor the resource has a config field for it, so no run config can send a
run's reads or writes elsewhere. A run's processes (run worker, step processes) inherit the code
server's environment and working directory, so they all use the same store.
While a step runs, both hold a shared lock on every partition directory they touched (inputs
loaded, outputs written, arrays allocated), released when the step's resources are torn down:
retention and garbage collection leave a partition alone while a step uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import dagster as dg
import numpy as np
from pydantic import ConfigDict, Field, PrivateAttr

from corr_pipeline import settings
from corr_pipeline.snapshot import display
from corr_pipeline.store.locks import Hold
from corr_pipeline.store.matrix_store import (
    BundleWriteReport,
    MatrixBundle,
    MatrixStore,
    PendingArray,
    StoredArray,
    validate_asset_name,
)

__all__ = [
    "UNPARTITIONED",
    "MatrixStoreIOManager",
    "MatrixStoreResource",
    "asset_store_name",
    "store_location",
]

UNPARTITIONED = "_unpartitioned"
"""Partition directory used for assets without a partitions definition."""


def asset_store_name(asset_key: dg.AssetKey) -> str:
    """Directory name of an asset in the store: the last element of its key (validated)."""
    name = asset_key.path[-1]
    validate_asset_name(name)
    return name


def store_location(
    context: Any, asset_key: dg.AssetKey | None = None, partition: str | None = None
) -> tuple[str, str]:
    """``(asset name, partition key)`` an asset's output lives at, from its execution context.

    ``context`` is an ``AssetExecutionContext`` (or ``OpExecutionContext``) of a running asset;
    pass ``asset_key`` for a multi-asset, and ``partition`` (one of the step's sessions) in a
    run over a range of partitions. This is the location :class:`MatrixStoreIOManager` uses in
    ``handle_output``, so arrays allocated there are handed over without a copy.
    """
    key = asset_key if asset_key is not None else context.asset_key
    if partition is not None:
        if partition not in context.partition_keys:
            raise dg.DagsterInvariantViolationError(
                f"partition {partition} is not one of the step's ({context.partition_keys})"
            )
    elif context.has_partition_key:
        partition = context.partition_key
    elif context.has_partition_key_range:
        raise dg.DagsterInvariantViolationError(
            f"asset {key.to_user_string()} covers a range of partitions: name the session"
        )
    else:
        partition = UNPARTITIONED
    return asset_store_name(key), partition


def stored_metadata(report: BundleWriteReport) -> dict[str, Any]:
    """What a stored bundle adds to its materialization: ``path``, ``arrays`` (name, dtype,
    shape, how it was stored, version), ``versions``, ``bytes``, ``copied_bytes``,
    ``zero_copy_arrays``."""
    rows = "\n".join(
        f"| `{name}` | {display.dtype_text(s.dtype)} | {' × '.join(map(str, s.shape)) or 'scalar'} | "
        f"{'reused' if name in report.reused else 'linked' if name in report.linked else 'copied'} | "
        f"`{s.version}` |"
        for name, s in report.bundle.arrays.items()
        if isinstance(s, StoredArray)
    )
    return {
        "path": dg.MetadataValue.path(str(report.directory)),
        "arrays": dg.MetadataValue.md(
            "| array | dtype | shape | stored | version |\n|---|---|---|---|---|\n" + rows
        ),
        "versions": dg.MetadataValue.json(report.bundle.versions),
        "bytes": dg.MetadataValue.int(report.nbytes),
        "copied_bytes": dg.MetadataValue.int(report.copied_bytes),
        "zero_copy_arrays": dg.MetadataValue.int(len(report.reused) + len(report.linked)),
    }


def removed_line(report: BundleWriteReport) -> str:
    """The log line of arrays an earlier materialization had and the new one has not."""
    return (
        f"matrix store: arrays {report.removed} of an earlier materialization are no longer "
        f"current in {report.directory} (garbage collection removes them)"
    )


class _PartitionHolds:
    """The shared partition holds one resource instance took during a step (see the module
    docstring); released at teardown."""

    def __init__(self) -> None:
        self.holds: dict[tuple[str, str], Hold] = {}

    def take(self, store: MatrixStore, asset: str, partition: str) -> None:
        if (asset, partition) not in self.holds:
            self.holds[(asset, partition)] = store.hold_partition(asset, partition)

    def release(self, keep: Callable[[str], bool] = lambda _partition: False) -> None:
        """Release every hold but those of the partitions ``keep`` says to keep."""
        released = {where: held for where, held in self.holds.items() if not keep(where[1])}
        for where, held in released.items():
            del self.holds[where]
            held.release()


class MatrixStoreResource(dg.ConfigurableResource):
    """Gives assets direct access to the matrix store (:func:`corr_pipeline.settings.store_dir`),
    and its retention.

    ``.store`` is a
    :class:`MatrixStore`; :meth:`allocate_for` allocates an output array exactly where the
    IO manager will look for it (the zero-copy hand-off, see module docstring);
    :meth:`scratch_for` gives a step a file-backed working array there, deleted after use.
    ``keep_matrices``: how many of the newest published partitions keep their matrices after
    each publication (:meth:`keep`).
    """

    # base_dir is not a field (the environment); pydantic's errors leave the input out
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    keep_matrices: int | None = Field(
        default=None,
        ge=1,
        description="Retention: after each publication, only the newest keep_matrices published "
        "partitions keep their matrices in the store (the published rows stay). Default: "
        "$CORR_PIPELINE_KEEP_MATRICES, else 5.",
    )
    _holds: _PartitionHolds = PrivateAttr(default_factory=_PartitionHolds)

    @property
    def store(self) -> MatrixStore:
        """The deployment's matrix store (:func:`corr_pipeline.settings.store_dir`)."""
        return MatrixStore(settings.store_dir())

    def keep(self) -> int:
        """``keep_matrices``, or :func:`corr_pipeline.settings.keep_matrices` when unset."""
        return self.keep_matrices if self.keep_matrices is not None else settings.keep_matrices()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self._holds.release()

    def hold(self, store: MatrixStore, asset: str, partition: str) -> None:
        """Hold ``asset`` / ``partition`` of ``store`` (shared) until the step ends, as the
        methods below do before they use it."""
        self._holds.take(store, asset, partition)

    def release_partitions_but(self, partition: str) -> None:
        """Let go of the partitions this resource holds, but ``partition``'s: a run that has
        finished with its earlier sessions lets retention remove them."""
        self._holds.release(keep=lambda held: held == partition)

    def allocate_for(
        self,
        context: Any,
        name: str,
        shape: int | Sequence[int],
        dtype: Any,
        *,
        asset_key: dg.AssetKey | None = None,
        partition: str | None = None,
        labels: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        in_memory: bool = False,
    ) -> PendingArray:
        """``store.allocate`` at :func:`store_location` ``(context, asset_key, partition)``; the
        partition directory stays held (shared) until the step ends. ``in_memory``: in the
        store's memory area when it has room (:mod:`corr_pipeline.store.memory`)."""
        asset, partition = store_location(context, asset_key, partition)
        store = self.store
        self._holds.take(store, asset, partition)
        return store.allocate(
            asset,
            partition,
            name,
            shape,
            np.dtype(dtype),
            labels=labels,
            params=params,
            in_memory=in_memory,
        )

    def scratch_for(
        self,
        context: Any,
        name: str,
        shape: int | Sequence[int],
        dtype: Any,
        *,
        asset_key: dg.AssetKey | None = None,
        partition: str | None = None,
        in_memory: bool = False,
    ) -> AbstractContextManager[np.ndarray]:
        """``store.scratch`` at :func:`store_location` ``(context, asset_key, partition)``: a
        file-backed working array in the asset's partition directory (``in_memory``: in its
        memory area when it has room), deleted when the ``with`` block ends; the partition
        directory stays held (shared) until the step ends."""
        asset, partition = store_location(context, asset_key, partition)
        store = self.store
        self._holds.take(store, asset, partition)
        return store.scratch(asset, partition, name, shape, np.dtype(dtype), in_memory=in_memory)

    def save_for(
        self,
        context: Any,
        asset: str,
        partition: str,
        bundle: MatrixBundle,
        *,
        in_memory: bool = False,
    ) -> tuple[MatrixBundle, dict[str, Any]]:
        """Store ``bundle`` as the current bundle of ``asset`` / ``partition`` (what
        :class:`MatrixStoreIOManager` does with an output; ``in_memory``: its copied arrays in
        the store's memory area when it has room) and return the stored bundle (arrays as
        read-only maps, with their versions) and :func:`stored_metadata`; the partition stays
        held until the step ends."""
        store = self.store
        self._holds.take(store, asset, partition)
        report = store.save_bundle(asset, partition, bundle, in_memory=in_memory)
        if report.removed:
            context.log.info(removed_line(report))
        return report.bundle, stored_metadata(report)

    def load_for(self, asset: str, partition: str) -> MatrixBundle:
        """The current bundle of ``asset`` / ``partition`` (what :class:`MatrixStoreIOManager`
        loads for an input), the partition held first until the step ends."""
        store = self.store
        if store.files.partition_dir(asset, partition).is_dir():
            self._holds.take(store, asset, partition)
        return store.load_bundle(asset, partition)


class MatrixStoreIOManager(dg.ConfigurableIOManager):
    """Stores each output :class:`MatrixBundle` under ``<store>/<asset>/<partition>/``.

    * ``handle_output``: the value must be a :class:`MatrixBundle`; see
      :meth:`MatrixStore.save_bundle` for how each array is stored (reused / linked /
      copied). Adds output metadata: ``path``, ``arrays`` (name, dtype, shape, version),
      ``versions``, ``bytes``, ``copied_bytes``, ``zero_copy_arrays``.
    * ``load_input``: returns the upstream partition's :class:`MatrixBundle` of read-only
      memmaps (with ``bundle.versions``); when the input spans several partitions, a ``dict``
      partition key → bundle.
    """

    model_config = ConfigDict(extra="forbid")  # base_dir is not a field: the environment

    _holds: _PartitionHolds = PrivateAttr(default_factory=_PartitionHolds)

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self._holds.release()

    @property
    def store(self) -> MatrixStore:
        """The deployment's matrix store (:func:`corr_pipeline.settings.store_dir`)."""
        return MatrixStore(settings.store_dir())

    def _output_bundles(self, context: dg.OutputContext, obj: Any) -> dict[str, MatrixBundle]:
        """``{partition key: bundle}`` of an output: one bundle for one partition (or an
        unpartitioned asset), ``{key: bundle}`` covering exactly the partitions of a range."""
        if not context.has_asset_key:
            raise dg.DagsterInvariantViolationError(
                f"MatrixStoreIOManager stores asset outputs only; output {context.name!r} of "
                f"{context.step_key} is not an asset"
            )
        what = f"asset {context.asset_key.to_user_string()}"
        keys = list(context.asset_partition_keys) if context.has_asset_partitions else []
        if len(keys) > 1:
            if not isinstance(obj, Mapping) or sorted(obj) != sorted(keys):
                raise TypeError(
                    f"{what} covers {len(keys)} partitions ({keys[0]} .. {keys[-1]}): its value "
                    "must be {partition key: MatrixBundle} for exactly those partitions"
                )
            bundles = dict(obj)
        else:
            bundles = {keys[0] if keys else UNPARTITIONED: obj}
        for bundle in bundles.values():
            if not isinstance(bundle, MatrixBundle):
                raise TypeError(
                    f"{what} returned {type(bundle).__name__}; MatrixStoreIOManager needs a "
                    "MatrixBundle (corr_pipeline.store.matrix_store.MatrixBundle)"
                )
        return bundles

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        bundles = self._output_bundles(context, obj)
        asset = asset_store_name(context.asset_key)
        if len(bundles) == 1:
            ((partition, bundle),) = bundles.items()
            self._store_one(context, asset, partition, bundle)
            return
        for partition, bundle in sorted(bundles.items()):
            self._store_one(context, asset, partition, bundle, partition_metadata=True)

    def _store_one(
        self,
        context: dg.OutputContext,
        asset: str,
        partition: str,
        obj: MatrixBundle,
        *,
        partition_metadata: bool = False,
    ) -> None:
        """Store one partition's bundle; its output metadata goes to the output (one partition)
        or to that partition's materialization (a range)."""
        store = self.store
        self._holds.take(store, asset, partition)
        report = store.save_bundle(asset, partition, obj)
        output_metadata = stored_metadata(report)
        if partition_metadata:  # that partition's materialization (Dagster merges it in)
            context.step_context.add_asset_metadata(
                output_metadata, asset_key=context.asset_key, partition_key=partition
            )
        else:
            context.add_output_metadata(output_metadata)
        if report.removed:
            context.log.info(removed_line(report))

    def load_input(self, context: dg.InputContext) -> MatrixBundle | dict[str, MatrixBundle]:
        if not context.has_asset_key:
            raise dg.DagsterInvariantViolationError(
                f"MatrixStoreIOManager loads asset inputs only; input {context.name!r} is not an asset"
            )
        asset = asset_store_name(context.asset_key)
        store = self.store
        keys = list(context.asset_partition_keys) if context.has_asset_partitions else []
        bundles = {}
        for key in keys or [UNPARTITIONED]:
            if store.files.partition_dir(asset, key).is_dir():
                self._holds.take(store, asset, key)  # before reading: retention waits for us
            bundles[key] = store.load_bundle(asset, key)
        if len(bundles) == 1:
            return next(iter(bundles.values()))
        return bundles
