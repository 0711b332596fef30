"""``python -m corr_pipeline.cli.ui_webserver``: the web server process of ``corr-pipeline ui``.

Serves Dagster's web server application (:mod:`corr_pipeline.cli.webserver_app`) with uvicorn on
``--host``/``--port``, behind :class:`corr_pipeline.cli.ui_access.TokenGate` with the token
read from the first line of standard input (a pipe from ``corr-pipeline ui``: the token is
never in an argument list or the environment, which ``ps`` and the processes' children would
see). ``--no-token``: no access check (standard input is not read). ``--read-only``: Dagster's
read-only mode. Not a command for users: ``corr-pipeline ui`` starts it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from corr_pipeline.cli.ui_access import TokenGate, cookie_name

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m corr_pipeline.cli.ui_webserver")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workspace", type=Path, required=True)
    parser.add_argument("--read-only", action="store_true")
    parser.add_argument("--no-token", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until interrupted (SIGINT or SIGTERM: uvicorn's graceful shutdown)."""
    import uvicorn

    from corr_pipeline.cli.webserver_app import webserver_app

    args = _parser().parse_args(argv)
    token = "" if args.no_token else sys.stdin.readline().strip()
    if not args.no_token and not token:
        print(
            "corr-pipeline ui: the web server got no token on its standard input", file=sys.stderr
        )
        return 2
    with webserver_app(args.workspace, read_only=args.read_only) as app:
        served = app if args.no_token else TokenGate(app, token, cookie_name(args.port))
        uvicorn.run(served, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
