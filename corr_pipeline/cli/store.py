"""``corr-pipeline store list|prune|verify``: the matrix store's partitions, its retention by
hand, and a full check of its bytes.

``store list`` shows every partition of the store (``$CORR_PIPELINE_STORE_DIR``): its assets,
versions and bytes on disk, whether its snapshot is published, whether the versions the
publication pins are there, whether a process (a run in flight) uses it. ``store prune --keep K``
applies the retention the pipeline applies after each publication
(:func:`corr_pipeline.snapshot.retention.apply_retention`); ``--dry-run`` only says what it
would remove. ``store verify`` reads every byte of every stored version and compares the
SHA-256 its sidecar recorded at commit (a load checks only a sampled fingerprint:
:mod:`corr_pipeline.store.verify`); exit status 1 when a version is damaged.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from corr_pipeline import settings
from corr_pipeline.cli.common import echo, open_engine, positive_int
from corr_pipeline.db.published_reads import published_matrix_versions, recorded_change_dates
from corr_pipeline.query.render import format_table
from corr_pipeline.snapshot.retention import apply_retention, format_bytes, store_inventory
from corr_pipeline.store.matrix_store import MatrixStore
from corr_pipeline.store.verify import verify_store

__all__ = [
    "add_store_commands",
    "cmd_store_list",
    "cmd_store_prune",
    "cmd_store_verify",
    "runs_in_flight",
]


def _open_store() -> MatrixStore:
    base = settings.store_dir()
    if not base.is_dir():
        raise FileNotFoundError(
            f"the matrix store {base} does not exist (nothing computed with this "
            f"CORR_PIPELINE_HOME / {settings.ENV_STORE_DIR})"
        )
    return MatrixStore(base, create=False)


def runs_in_flight() -> set[str]:
    """Partitions with a snapshot run in flight in the project's Dagster instance
    (:func:`corr_pipeline.defs.runs.partitions_in_flight`), when there is one; a warning and no
    partition when it cannot be read (the partition locks still protect running steps)."""
    home = settings.dagster_home()
    if not (home / "dagster.yaml").is_file() and not (home / "storage").is_dir():
        return set()
    try:
        import dagster as dg  # heavy; only here

        from corr_pipeline.defs.runs import partitions_in_flight

        instance = dg.DagsterInstance.from_config(str(home))
        try:
            return partitions_in_flight(instance)
        finally:
            instance.dispose()
    except Exception as exc:  # noqa: BLE001 - advisory only
        print(
            f"corr-pipeline: warning: cannot read the Dagster instance in {home} ({exc}); "
            "only the partition locks protect runs in flight",
            file=sys.stderr,
        )
        return set()


def cmd_store_list(args: argparse.Namespace) -> int:
    """Print the store's partitions (table, or JSON with ``--json``)."""
    engine = open_engine()
    store = _open_store()
    published = published_matrix_versions(engine)
    entries = store_inventory(store, published)
    in_store = {e.partition for e in entries}
    without = sorted(d.isoformat() for d in published if d.isoformat() not in in_store)
    if args.json:
        payload: dict[str, Any] = {
            "store": str(store.base_dir),
            "partitions": [e.to_json() for e in entries],
            "bytes": sum(e.bytes for e in entries),
            "published_without_matrices": without,
        }
        echo(json.dumps(payload, indent=2))
        return 0
    echo(f"matrix store {store.base_dir}")
    if not entries:
        echo("no partition in the store")
    else:
        rows = [
            [
                e.partition,
                ", ".join(e.assets),
                e.versions,
                format_bytes(e.bytes),
                "yes" if e.published else "no",
                e.pinned,
                "yes" if e.in_use else "no",
            ]
            for e in entries
        ]
        echo(
            format_table(
                ["partition", "assets", "versions", "on disk", "published", "pinned", "in use"],
                rows,
                "llrrlll",
            )
        )
        echo(f"{len(entries)} partition(s), {format_bytes(sum(e.bytes for e in entries))} on disk")
    if without:
        pruned = [d for d in without if store.pruned(d) is not None]
        echo(
            f"{len(without)} published date(s) without matrices in the store"
            + (f" ({len(pruned)} pruned by retention)" if pruned else "")
            + f": {without[0]} .. {without[-1]}"
        )
    return 0


def cmd_store_prune(args: argparse.Namespace) -> int:
    """Apply retention with ``--keep K`` (default ``$CORR_PIPELINE_KEEP_MATRICES``)."""
    keep = args.keep if args.keep is not None else settings.keep_matrices()
    engine = open_engine()
    store = _open_store()
    report = apply_retention(
        store,
        lambda: published_matrix_versions(engine),
        keep,
        in_flight=runs_in_flight(),
        dry_run=args.dry_run,
        read_changed=lambda: recorded_change_dates(engine),
    )
    for line in report.lines():
        echo(line)
    if args.dry_run:
        echo("dry run: nothing was removed")
    return 0


def cmd_store_verify(args: argparse.Namespace) -> int:
    """Check every stored version (of ``--partition`` dates only, when given) against its full
    checksum; print one line per version (or JSON) and return 1 when any is damaged."""
    store = _open_store()
    checks = verify_store(store, args.partition or None)
    damaged = [c for c in checks if c.failed]
    if args.json:
        echo(json.dumps({"store": str(store.base_dir), "versions": [c.to_json() for c in checks]}))
    else:
        rows = [
            [c.partition, c.asset, c.name, c.version, format_bytes(c.bytes), c.status]
            for c in checks
        ]
        echo(f"matrix store {store.base_dir}")
        if rows:
            echo(
                format_table(
                    ["partition", "asset", "array", "version", "on disk", "check"], rows, "llllrl"
                )
            )
        sampled = sum(c.status == "sampled" for c in checks)
        echo(
            f"{len(checks)} version(s): {len(checks) - len(damaged) - sampled} whole-file "
            f"checksum(s) equal, {sampled} without one (sampled fingerprint only, equal), "
            f"{len(damaged)} damaged"
        )
    for c in damaged:
        print(f"corr-pipeline: store verify: {c.path}: {c.status}: {c.detail}", file=sys.stderr)
    return 1 if damaged else 0


def add_store_commands(commands: Any) -> None:
    """Register ``store list``, ``store prune`` and ``store verify`` on ``commands``."""
    store = commands.add_parser(
        "store",
        help="matrix store: list its partitions, apply retention, verify its bytes",
        description="The matrix store (N x N matrices per snapshot date). Retention keeps the "
        "matrices of the newest published dates only (the published rows stay in PostgreSQL).",
    )
    sub = store.add_subparsers(dest="store_command", metavar="SUBCOMMAND", required=True)
    listing = sub.add_parser(
        "list",
        help="partitions: assets, bytes on disk, published or not, pinned versions there or not",
    )
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(func=cmd_store_list)
    prune = sub.add_parser(
        "prune",
        help="remove the matrices of all but the newest K published partitions",
        description="Keeps the matrices of the newest K published snapshot dates and "
        "garbage-collects their superseded versions; removes the matrices of older dates "
        "(published rows stay). Never touches a partition in use by a run in flight.",
    )
    prune.add_argument(
        "--keep",
        type=positive_int,
        default=None,
        metavar="K",
        help=f"published partitions that keep their matrices (default "
        f"${settings.ENV_KEEP_MATRICES}, else {settings.DEFAULT_KEEP_MATRICES})",
    )
    prune.add_argument(
        "--dry-run", action="store_true", help="say what would be removed, remove nothing"
    )
    prune.set_defaults(func=cmd_store_prune)
    verify = sub.add_parser(
        "verify",
        help="read every stored version and compare its full SHA-256 with its sidecar's",
        description="A load checks each array's header, size and a sampled fingerprint (17 "
        "blocks of 64 KiB); this reads every byte of every version, current or not, and "
        "compares the SHA-256 recorded at commit. Exit status 1 when a version is damaged.",
    )
    verify.add_argument(
        "--partition",
        action="append",
        metavar="DATE",
        help="only this snapshot date (repeatable; default: every partition)",
    )
    verify.add_argument("--json", action="store_true", help="print JSON instead of a table")
    verify.set_defaults(func=cmd_store_verify)
