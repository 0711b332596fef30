"""``corr-pipeline ui``: ``dg dev`` (the Dagster UI and daemon) for this project, stoppable by
a signal from anywhere, scripts included.

Why a wrapper: a command started in the background by a non-interactive shell (``dg dev &`` in a
script, CI, ``nohup``) inherits SIGINT and SIGQUIT *ignored* (POSIX, for asynchronous commands
without job control). Python then installs no KeyboardInterrupt handler, and Dagster maps SIGTERM
to whatever SIGINT does (``dagster._utils.interrupts.setup_interrupt_handlers``), so such a
``dg dev`` ignores SIGINT *and* SIGTERM: the webserver, the daemon and the code server run on
until SIGKILL, which skips their shutdown.

:func:`run_ui` starts ``dg dev`` from the current directory (the repository root, like ``dg dev``
itself) with SIGINT and SIGTERM back at their defaults, in its own session and process group
(so a terminal's Ctrl-C reaches this process only, which forwards it once), and with
``DAGSTER_HOME`` set to :func:`corr_pipeline.settings.dagster_home` (the repository root, whose
``dagster.yaml`` configures the instance), after creating the snapshot pool in that instance's
storage at its default limit if it is not there yet
(:func:`corr_pipeline.defs.concurrency.ensure_snapshot_pool`: otherwise the daemon's first pass
on a fresh instance would launch every queued snapshot run at once). On SIGINT, SIGTERM or
SIGHUP it sends SIGINT to the whole group, which is what Ctrl-C in a terminal does and what Dagster handles: the webserver,
daemon, code server and any run they started shut down in order. Whatever is still alive after
:data:`STOP_TIMEOUT_SECONDS` (the group, and every process that was a descendant when the stop
began) is killed. On Linux ``dg dev`` also gets SIGINT if this process dies without forwarding
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from corr_pipeline import settings
from corr_pipeline.cli.common import echo

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "STOP_TIMEOUT_SECONDS",
    "add_ui_command",
    "dg_dev_command",
    "run_ui",
    "stop_process_group",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 3000
#: How long the processes get to shut down after SIGINT before they are killed (``dg dev``
#: itself gives the webserver and the daemon 60 s each, but they need a few seconds).
STOP_TIMEOUT_SECONDS = 30.0
#: After SIGKILL, how long to wait for the processes to be gone.
KILL_TIMEOUT_SECONDS = 10.0

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1


def dg_dev_command(port: int, host: str) -> list[str]:
    """``dg dev --port PORT --host HOST`` with the ``dg`` of this Python environment."""
    beside = Path(sys.executable).with_name("dg")
    found = str(beside) if beside.is_file() else shutil.which("dg")
    base = [found] if found else [sys.executable, "-m", "dagster_dg_cli.cli"]
    return [*base, "dev", "--port", str(port), "--host", host]


def _child_setup() -> None:
    """In the child, before exec: default SIGINT/SIGTERM (they may have been inherited ignored),
    and SIGINT when the parent dies (Linux)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGINT), 0, 0, 0)


def _alive(procs: Sequence[psutil.Process]) -> list[psutil.Process]:
    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.NoSuchProcess:
            continue
    return out


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def stop_process_group(
    leader: subprocess.Popen[Any],
    *,
    timeout: float = STOP_TIMEOUT_SECONDS,
    kill_timeout: float = KILL_TIMEOUT_SECONDS,
) -> tuple[float, list[int]]:
    """Stop ``leader``'s process group (``leader`` started with ``start_new_session=True``):
    SIGINT to the group, then SIGKILL to whatever of the group and of ``leader``'s descendants
    (as of now) is alive after ``timeout`` seconds. Returns (seconds taken, pids that had to be
    killed)."""
    start = time.monotonic()
    pgid = leader.pid
    try:
        tree = [psutil.Process(leader.pid), *psutil.Process(leader.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    _signal_group(pgid, signal.SIGINT)
    deadline = start + timeout
    while time.monotonic() < deadline:
        leader.poll()
        if not _group_exists(pgid) and not _alive(tree):
            return time.monotonic() - start, []
        time.sleep(0.1)
    stragglers = _alive(tree)
    killed = [p.pid for p in stragglers]
    _signal_group(pgid, signal.SIGKILL)
    for proc in stragglers:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    deadline = time.monotonic() + kill_timeout
    while time.monotonic() < deadline:
        leader.poll()
        if not _group_exists(pgid) and not _alive(tree):
            break
        time.sleep(0.1)
    return time.monotonic() - start, killed


def _ui_environment() -> dict[str, str]:
    """This environment, with ``DAGSTER_HOME`` (:func:`settings.dagster_home`, created and given
    the repository's ``dagster.yaml`` when it has none) and ``CORR_PIPELINE_HOME`` made
    explicit."""
    env = dict(os.environ)
    home = settings.ensure_dir(settings.dagster_home())
    config = home / settings.DAGSTER_YAML
    repo_config = Path.cwd() / settings.DAGSTER_YAML
    if not config.exists() and repo_config.is_file():
        shutil.copyfile(repo_config, config)
    env[settings.ENV_DAGSTER_HOME] = str(home)
    env[settings.ENV_HOME] = str(settings.corr_pipeline_home())
    return env


def _ensure_snapshot_pool(dagster_home: str, say: Callable[[str], None]) -> None:
    """The snapshot pool in the instance at ``dagster_home`` before its daemon starts
    (:func:`corr_pipeline.defs.concurrency.ensure_snapshot_pool`). A failure is reported and
    ``dg dev`` started anyway (it reports a broken instance itself)."""
    import dagster as dg  # heavy: Dagster

    from corr_pipeline.defs.concurrency import ensure_snapshot_pool

    try:
        instance = dg.DagsterInstance.from_config(dagster_home)
        try:
            ensure_snapshot_pool(instance)
        finally:
            instance.dispose()
    except Exception as exc:  # noqa: BLE001 - reported; dg dev reports it again
        say(
            f"corr-pipeline ui: could not create the snapshot pool in {dagster_home} ({exc}); "
            "the daemon's first pass may start every queued snapshot run at once"
        )


def run_ui(
    port: int = DEFAULT_PORT,
    host: str = DEFAULT_HOST,
    *,
    command: Sequence[str] | None = None,
    timeout: float = STOP_TIMEOUT_SECONDS,
    say: Callable[[str], None] = echo,
) -> int:
    """Run ``dg dev`` (or ``command``) until it exits or this process gets SIGINT, SIGTERM or
    SIGHUP; then stop its whole process group (:func:`stop_process_group`). Returns ``dg dev``'s
    exit status when it ended by itself, 0 after a requested stop."""
    received: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)

    previous = {signum: signal.signal(signum, on_signal) for signum in _FORWARDED}
    try:
        argv = list(command) if command is not None else dg_dev_command(port, host)
        env = _ui_environment()
        _ensure_snapshot_pool(env[settings.ENV_DAGSTER_HOME], say)
        say(
            f"corr-pipeline ui: starting dg dev, http://{host}:{port} when ready "
            f"(DAGSTER_HOME={env[settings.ENV_DAGSTER_HOME]}); Ctrl-C or SIGTERM stops it"
        )
        proc = subprocess.Popen(  # noqa: S603 - our own dg
            argv,
            env=env,
            start_new_session=True,
            preexec_fn=_child_setup,  # noqa: PLW1509 - single-threaded here
        )
        while not received:
            try:
                code = proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
            # dg dev ended by itself: clean up anything it left in its group
            stop_process_group(proc, timeout=min(timeout, 5.0))
            return int(code)
        name = signal.Signals(received[0]).name
        say(f"corr-pipeline ui: {name} received, stopping dg dev (SIGINT to its process group)")
        took, killed = stop_process_group(proc, timeout=timeout)
        if killed:
            say(
                f"corr-pipeline ui: killed {len(killed)} process(es) still running after "
                f"{timeout:.0f} s: {', '.join(map(str, killed))}"
            )
        say(f"corr-pipeline ui: stopped in {took:.1f} s")
        return 0
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def cmd_ui(args: argparse.Namespace) -> int:
    return run_ui(port=args.port, host=args.host)


def add_ui_command(commands: Any) -> None:
    """Register ``ui`` on the sub-command parser ``commands``."""
    ui = commands.add_parser(
        "ui",
        help="run dg dev (Dagster UI + daemon) on the project's instance; SIGINT, SIGTERM or "
        "SIGHUP stops all of it (run it from the repository root)",
    )
    ui.add_argument("--port", type=int, default=DEFAULT_PORT, metavar="PORT")
    ui.add_argument("--host", default=DEFAULT_HOST, metavar="HOST")
    ui.set_defaults(func=cmd_ui)
