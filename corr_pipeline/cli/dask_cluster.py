"""``corr-pipeline dask certs [DIR]``: a private certificate authority and the certificates of a
Dask cluster on this machine, and the commands that start it over TLS.

The pipeline reaches a Dask scheduler over ``tls://`` only, loopback included (whoever reaches
a plain ``tcp://`` port, every user of the machine on loopback, runs code as the pipeline's
user: :mod:`corr_pipeline.snapshot.scheduler`). The command writes the files of
:mod:`corr_pipeline.snapshot.scheduler_certs` into ``DIR`` (default
``$CORR_PIPELINE_HOME/dask-tls``; 0700, every file 0600, the authority's key never written),
then prints, one per line, the ``dask scheduler`` and ``dask worker`` commands (encryption
required, the scheduler, the workers and their dashboards on 127.0.0.1 alone, the workers' files
in the private ``DIR/worker-space``) and the settings the pipeline reads (``export`` lines; the
same lines without ``export`` go into the project's ``.env``).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from corr_pipeline import settings
from corr_pipeline.cli.common import UsageError, echo, positive_int
from corr_pipeline.snapshot.scheduler_certs import (
    DEFAULT_DAYS,
    ClusterCertificates,
    client_environment,
    make_certificates,
)

__all__ = ["DEFAULT_PORT", "add_dask_commands", "cluster_commands", "cmd_dask_certs"]

#: The scheduler's port in the printed commands (Dask's own default).
DEFAULT_PORT = 8786
#: Worker processes, and threads of each, in the printed ``dask worker`` command.
WORKERS, THREADS = 2, 1
#: Dask refuses every unencrypted connection of a process started with this setting.
REQUIRE_ENCRYPTION = "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION=True"


def cluster_commands(certs: ClusterCertificates, port: int) -> list[str]:
    """The shell lines that start a scheduler on ``tls://127.0.0.1:port`` and its workers with
    ``certs``' cluster certificate, then point the pipeline at it with the client's."""
    q = shlex.quote
    tls = (
        f"--tls-ca-file {q(str(certs.ca))} --tls-cert {q(str(certs.cluster_cert))} "
        f"--tls-key {q(str(certs.cluster_key))}"
    )
    address = f"tls://127.0.0.1:{port}"
    environment = {settings.ENV_DASK_SCHEDULER: address, **client_environment(certs)}
    return [
        f"{REQUIRE_ENCRYPTION} dask scheduler --host tls://127.0.0.1 --port {port} "
        f"--dashboard-address 127.0.0.1:{port + 1} {tls}",
        f"{REQUIRE_ENCRYPTION} dask worker {address} --host 127.0.0.1 --dashboard-address "
        f"127.0.0.1:0 --nworkers {WORKERS} --nthreads {THREADS} "
        f"--local-directory {q(str(certs.worker_space))} {tls}",
        *(f"export {name}={q(value)}" for name, value in environment.items()),
    ]


def cmd_dask_certs(args: argparse.Namespace) -> int:
    """Make the certificates in ``args.directory`` and print how to use them."""
    if args.port >= 65535:
        raise UsageError(f"--port {args.port}: the dashboard takes the next port, at most 65535")
    directory = args.directory or settings.corr_pipeline_home() / "dask-tls"
    certs = make_certificates(directory, days=args.days)
    echo(
        f"# a new certificate authority for one Dask cluster in {certs.directory} (0700, files "
        f"0600; its own key was not kept): ca.pem, cluster.pem/.key (scheduler and workers), "
        f"client.pem/.key (the pipeline), valid {args.days} days"
    )
    echo("# start the scheduler and the workers as this user, each in its own shell:")
    lines = cluster_commands(certs, args.port)
    for line in lines[:2]:
        echo(line)
    echo("# point the pipeline at it (the same lines without 'export' in the project's .env):")
    for line in lines[2:]:
        echo(line)
    return 0


def add_dask_commands(commands: Any) -> None:
    """Register ``dask certs`` on ``commands``."""
    dask = commands.add_parser(
        "dask",
        help="a Dask cluster on this machine over TLS: its certificates and commands",
        description="The pipeline reaches Dask over tls:// only, loopback included.",
    )
    sub = dask.add_subparsers(dest="dask_command", metavar="SUBCOMMAND", required=True)
    certs = sub.add_parser(
        "certs",
        help="make a private authority and the cluster's and client's certificates; print "
        "the dask scheduler / dask worker commands and the settings",
        description="Writes ca.pem, cluster.pem, cluster.key, client.pem, client.key and an "
        "empty worker-space/ into DIR (0700, files 0600); the authority's key is not kept, so "
        "no other certificate of it can ever be made. Refuses a DIR that already holds them.",
    )
    certs.add_argument(
        "directory",
        nargs="?",
        type=Path,
        metavar="DIR",
        help=f"where the files go (default: ${settings.ENV_HOME}/dask-tls)",
    )
    certs.add_argument(
        "--port",
        type=positive_int,
        default=DEFAULT_PORT,
        help=f"the scheduler's port in the printed commands (default {DEFAULT_PORT}; the "
        "dashboard's is the next one)",
    )
    certs.add_argument(
        "--days",
        type=positive_int,
        default=DEFAULT_DAYS,
        help=f"how long the certificates are valid (default {DEFAULT_DAYS})",
    )
    certs.set_defaults(func=cmd_dask_certs)
