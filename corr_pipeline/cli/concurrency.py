"""``corr-pipeline concurrency show|set``: how many snapshot runs the instance starts at once.

``show`` prints the memory one run needs for a universe of N symbols and T returns
(:func:`corr_pipeline.snapshot.sizing.run_memory`, term by term), the memory of this machine
(or of ``--memory-gib``), the number of runs that fit it, the cores (or ``--cores``), the
number of runs at once, the lower of the two bounds, and which one binds
(:func:`corr_pipeline.snapshot.sizing.runs_at_once`), and the limits the Dagster instance
(``DAGSTER_HOME``) has now. ``set`` stores that number, or an explicit ``LIMIT``, as the limit of
the snapshot pool (:func:`corr_pipeline.defs.concurrency.set_snapshot_runs_limit`); the daemon
applies it at its next dequeue.
"""

from __future__ import annotations

import argparse
from typing import Any

from corr_pipeline import settings
from corr_pipeline.cli.common import echo, positive_float, positive_int
from corr_pipeline.snapshot import sizing

__all__ = ["add_concurrency_commands", "cmd_concurrency"]


def _gib(value: float) -> str:
    return f"{value / sizing.GIB:,.2f} GiB"


def _recommendation(args: argparse.Namespace) -> tuple[int, list[str]]:
    """The number of runs that fit and the lines explaining it."""
    from corr_pipeline.snapshot.params import SnapshotParameters  # imports the kernels

    defaults = SnapshotParameters()
    t = args.t or defaults.lookback_days
    working_memory_mb = args.working_memory_mb or defaults.working_memory_mb
    memory = sizing.run_memory(args.n, t, working_memory_mb)
    machine = (
        int(args.memory_gib * sizing.GIB) if args.memory_gib else sizing.machine_memory_bytes()
    )
    if args.reserve_gib is not None and args.reserve_gib < 0:
        raise ValueError(f"--reserve-gib must be >= 0, got {args.reserve_gib}")
    reserve = (
        int(args.reserve_gib * sizing.GIB)
        if args.reserve_gib is not None
        else sizing.DEFAULT_RESERVE_BYTES
    )
    from corr_pipeline.compute.workers import available_cores

    cores = args.cores or available_cores()
    runs = sizing.runs_at_once(machine, memory.per_run, reserve, cores)
    source = "--memory-gib" if args.memory_gib else "this machine"
    cores_source = "--cores" if args.cores else "this machine's, its CPU affinity"
    lines = [
        f"one snapshot run at N = {args.n:,}, T = {t}, working_memory_mb = {working_memory_mb:g}:",
        f"  its process (the run worker)                 {_gib(memory.process)}",
        f"  largest stage (max(4·N·(N−1), 64·T·N + W))   {_gib(memory.largest_stage)}",
        f"  matrices of two sessions, page cache (12·N²) {_gib(memory.matrices)}",
        f"  per run                                      {_gib(memory.per_run)}",
        f"memory: {_gib(machine)} ({source}), reserve {_gib(reserve)}",
        f"  runs that fit the memory: {runs.by_memory} = max(1, floor(({_gib(machine)} − "
        f"{_gib(reserve)}) / {_gib(memory.per_run)}))",
        f"cores: {cores} ({cores_source})",
        f"  runs by cores: {runs.by_cores} (one per core: each run's kernels use every core)",
        f"snapshot runs at once: {runs.limit} = min({runs.by_memory} by memory, "
        f"{runs.by_cores} by cores): {_binds(runs.binding)}",
    ]
    return runs.limit, lines


def _binds(binding: str) -> str:
    """Which bound of :class:`~corr_pipeline.snapshot.sizing.RunsAtOnce` binds, in words."""
    return {"memory": "the memory binds", "cores": "the cores bind"}.get(
        binding, "memory and cores bind alike"
    )


def _describe(limits: Any) -> list[str]:
    runs = "no limit" if limits.snapshot_runs is None else str(limits.snapshot_runs)
    origin = "set in the instance" if limits.explicit else "dagster.yaml's pools.default_limit"
    cap = "no limit" if limits.max_concurrent_runs < 0 else str(limits.max_concurrent_runs)
    per_partition = (
        "NOT limited (no dagster/partition tag limit in dagster.yaml)"
        if limits.per_partition is None
        else str(limits.per_partition)
    )
    lines = [
        f"  snapshot runs at once (pool): {runs} ({origin})",
        f"  runs per partition at once:   {per_partition}",
        f"  runs of any kind at once:     {cap} (concurrency.runs.max_concurrent_runs)",
    ]
    if limits.granularity != "run":
        lines.append(
            f"  warning: pools.granularity is {limits.granularity!r}, not 'run': the pool limits "
            "steps, not runs"
        )
    return lines


def cmd_concurrency(args: argparse.Namespace) -> int:
    """``show``: the sizing and the instance's limits; ``set``: store the limit."""
    from corr_pipeline.defs.concurrency import (  # imports Dagster
        instance_limits,
        set_snapshot_runs_limit,
    )
    from corr_pipeline.defs.run import open_instance

    limit: int | None = getattr(args, "limit", None)
    if args.n is not None:
        recommended, lines = _recommendation(args)
        for line in lines:
            echo(line)
        limit = limit or recommended
    elif args.action == "set" and limit is None:
        raise ValueError("give the LIMIT, or --n (and --t ...) to size it from memory and cores")
    instance = open_instance()
    try:
        home = settings.dagster_home()
        if args.action == "set":
            assert limit is not None
            cap = instance_limits(instance).max_concurrent_runs
            if getattr(args, "limit", None) is None and 0 <= cap < limit:
                echo(f"capped by concurrency.runs.max_concurrent_runs = {cap} of dagster.yaml")
                limit = cap
            limits = set_snapshot_runs_limit(instance, limit)
            echo(f"Dagster instance {home}: snapshot runs at once set to {limit}")
        else:
            limits = instance_limits(instance)
            echo(f"Dagster instance {home}:")
        for line in _describe(limits):
            echo(line)
    finally:
        instance.dispose()
    return 0


def _add_sizing_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--n",
        type=positive_int,
        help="symbols in the universe (size the limit from memory and cores)",
    )
    parser.add_argument("--t", type=positive_int, help="returns in the window (default 252)")
    parser.add_argument(
        "--working-memory-mb", type=positive_float, help="the runs' working_memory_mb (default 512)"
    )
    parser.add_argument(
        "--memory-gib",
        type=positive_float,
        help="memory to size against (default: this machine's, or its cgroup limit)",
    )
    parser.add_argument(
        "--cores",
        type=positive_int,
        help="cores to size against: at most one run per core (default: this machine's, its "
        "CPU affinity)",
    )
    parser.add_argument(
        "--reserve-gib",
        type=float,
        help="memory kept for the OS, PostgreSQL and Dagster's own processes (default 2)",
    )


def add_concurrency_commands(commands: Any) -> None:
    """Register ``concurrency show|set`` on the sub-command parser ``commands``."""
    group = commands.add_parser(
        "concurrency", help="how many snapshot runs (backfill partitions) run at once"
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser(
        "show", help="the memory of one run, the runs that fit, the instance's limits"
    )
    _add_sizing_options(show)
    show.set_defaults(func=cmd_concurrency)
    set_ = actions.add_parser(
        "set", help="store the limit of snapshot runs at once in the Dagster instance"
    )
    set_.add_argument(
        "limit", metavar="LIMIT", type=positive_int, nargs="?", help="default: sized by --n ..."
    )
    _add_sizing_options(set_)
    set_.set_defaults(func=cmd_concurrency)
