"""``corr-pipeline ui``: the Dagster UI (web server, daemon, code servers) on the project's
instance, reachable by its owner only, stoppable by a signal from anywhere, scripts included.

Who gets in: the web server (:mod:`corr_pipeline.cli.ui_webserver`) serves Dagster's
application behind a token check (:mod:`corr_pipeline.cli.ui_access`): each start makes a new
secret token and prints ``http://HOST:PORT/?token=TOKEN`` once, on the terminal of the user who
started it (no file, no log: a script that starts the UI reads it from the output). A request
without the token or the cookie it sets is refused (401; a websocket is closed), so another
local user who reaches the port reads nothing and launches nothing. ``--read-only`` adds
Dagster's read-only mode (no launching or terminating, for a host where the token is shared to
look at results). ``--no-token`` serves plain HTTP with no check, after a warning: then anyone
who reaches the port reads every result and launches runs.

What starts, and from where: the web server and ``dagster-daemon run`` (each starts the code
server of the project's code location, ``corr_pipeline.definitions``, working directory the
repository root, over a Unix socket that the ``umask`` 077 of ``corr-pipeline`` keeps the
user's own), on a workspace file in a fresh private (0700) directory that is also their working
directory, so none of them applies a ``.env`` by itself (Dagster's commands apply the ``.env``
of their working directory, every key of it). The ``corr-pipeline`` command has applied the
project's ``.env`` already, and for ``ui`` refuses to start while that file holds keys other
than the project's and Dagster's settings or may be written by others
(:func:`corr_pipeline.project_env.env_file_applied`, ``strict``); ``DAGSTER_PROJECT_ENV_FILE_PATHS``
(which would make the code servers apply whole ``.env`` files) is not passed on.

Why a wrapper for stopping: a command started in the background by a non-interactive shell
(``cmd &`` in a script, CI, ``nohup``) inherits SIGINT and SIGQUIT *ignored* (POSIX, for
asynchronous commands without job control). Python then installs no KeyboardInterrupt handler,
and Dagster maps SIGTERM to whatever SIGINT does
(``dagster._utils.interrupts.setup_interrupt_handlers``), so such a ``dg dev`` ignores SIGINT
*and* SIGTERM: the webserver, the daemon and the code server run on until SIGKILL, which skips
their shutdown.

:func:`run_ui` starts the web server and the daemon with SIGINT and SIGTERM back at their
defaults, in one new process group (not the terminal's foreground group: a terminal's Ctrl-C
or hang-up reaches this process only, which forwards it once), and with ``DAGSTER_HOME`` set to
:func:`corr_pipeline.settings.dagster_home` (the repository root, whose ``dagster.yaml``
configures the instance), after creating the snapshot pool in that instance's storage at its
default limit if it is not there yet (:func:`corr_pipeline.defs.concurrency.ensure_snapshot_pool`:
otherwise the daemon's first pass on a fresh instance would launch every queued snapshot run at
once). On SIGINT, SIGTERM or SIGHUP it sends SIGINT to the whole group, which is what Ctrl-C in
a terminal does and what Dagster handles: the webserver, daemon, code servers and any run they
started shut down in order. Whatever is still alive after :data:`STOP_TIMEOUT_SECONDS` (the
group, and every process that was a descendant when the stop began) is killed. When one of them
ends by itself, the others are stopped the same way. On Linux they also get SIGINT if this
process dies without forwarding (``PR_SET_PDEATHSIG``).
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
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from corr_pipeline import settings
from corr_pipeline.cli.common import echo
from corr_pipeline.cli.ui_access import TOKEN_PARAMETER, new_token

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "STOP_TIMEOUT_SECONDS",
    "add_ui_command",
    "run_ui",
    "stop_process_group",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 3000
#: How long the processes get to shut down after SIGINT before they are killed (``dg dev``
#: gives the webserver and the daemon 60 s each, but they need a few seconds).
STOP_TIMEOUT_SECONDS = 30.0
#: After SIGKILL, how long to wait for the processes to be gone.
KILL_TIMEOUT_SECONDS = 10.0

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1
#: The project's one code location (``[tool.dg]`` in pyproject.toml, workspace.yaml).
CODE_LOCATION = {"module_name": "corr_pipeline.definitions", "location_name": "corr_pipeline"}
#: Not passed to the UI's processes: it makes Dagster's code servers apply whole ``.env`` files.
WITHHELD_VARIABLES = ("DAGSTER_PROJECT_ENV_FILE_PATHS",)


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


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop_process_group(
    leader: subprocess.Popen[Any],
    *,
    members: Sequence[subprocess.Popen[Any]] = (),
    timeout: float = STOP_TIMEOUT_SECONDS,
    kill_timeout: float = KILL_TIMEOUT_SECONDS,
) -> tuple[float, list[int]]:
    """Stop ``leader``'s process group (``leader`` started as the leader of a new group, e.g.
    ``start_new_session=True`` or ``process_group=0``, ``members`` started into its group): SIGINT to the group, then SIGKILL to whatever of the
    group and of the descendants of ``leader`` and ``members`` (as of now) is alive after
    ``timeout`` seconds. Returns (seconds taken, pids that had to be killed)."""
    start = time.monotonic()
    pgid = leader.pid
    tree = [proc for popen in (leader, *members) for proc in _tree(popen.pid)]
    _signal_group(pgid, signal.SIGINT)
    deadline = start + timeout
    while time.monotonic() < deadline:
        for popen in (leader, *members):
            popen.poll()
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
        for popen in (leader, *members):
            popen.poll()
        if not _group_exists(pgid) and not _alive(tree):
            break
        time.sleep(0.1)
    return time.monotonic() - start, killed


def _ui_environment() -> dict[str, str]:
    """This environment, with ``DAGSTER_HOME`` (:func:`settings.dagster_home`, created and given
    the repository's ``dagster.yaml`` when it has none) and ``CORR_PIPELINE_HOME`` made
    explicit (the processes run elsewhere), without :data:`WITHHELD_VARIABLES`."""
    env = dict(os.environ)
    home = settings.ensure_dir(settings.dagster_home())
    config = home / settings.DAGSTER_YAML
    repo_config = Path.cwd() / settings.DAGSTER_YAML
    if not config.exists() and repo_config.is_file():
        shutil.copyfile(repo_config, config)
    env[settings.ENV_DAGSTER_HOME] = str(home)
    env[settings.ENV_HOME] = str(settings.corr_pipeline_home())
    for name in WITHHELD_VARIABLES:
        env.pop(name, None)
    return env


def _ensure_snapshot_pool(dagster_home: str, say: Callable[[str], None]) -> None:
    """The snapshot pool in the instance at ``dagster_home`` before its daemon starts
    (:func:`corr_pipeline.defs.concurrency.ensure_snapshot_pool`). A failure is reported and
    the UI started anyway (it reports a broken instance itself)."""
    import dagster as dg  # heavy: Dagster

    from corr_pipeline.defs.concurrency import ensure_snapshot_pool

    try:
        instance = dg.DagsterInstance.from_config(dagster_home)
        try:
            ensure_snapshot_pool(instance)
        finally:
            instance.dispose()
    except Exception as exc:  # noqa: BLE001 - reported; the UI reports it again
        say(
            f"corr-pipeline ui: could not create the snapshot pool in {dagster_home} ({exc}); "
            "the daemon's first pass may start every queued snapshot run at once"
        )


def _program(name: str) -> str:
    """The command ``name`` of this Python environment (beside the interpreter), else on PATH."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.is_file() else shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found beside {sys.executable} nor on PATH")
    return found


def write_workspace(directory: Path, working_directory: Path) -> Path:
    """``directory/workspace.yaml``: the project's code location, loaded from
    ``working_directory`` (the repository root, as ``dg dev`` loads it)."""
    import yaml

    location = {**CODE_LOCATION, "working_directory": str(working_directory)}
    path = directory / "workspace.yaml"
    path.write_text(yaml.safe_dump({"load_from": [{"python_module": location}]}))
    return path


def ui_commands(
    workspace: Path, port: int, host: str, *, read_only: bool, token: bool
) -> list[list[str]]:
    """The web server's command (``--no-token`` unless ``token``) and the daemon's."""
    webserver = [sys.executable, "-m", "corr_pipeline.cli.ui_webserver"]
    webserver += ["--host", host, "--port", str(port), "--workspace", str(workspace)]
    webserver += ["--read-only"] * read_only + ["--no-token"] * (not token)
    daemon = [_program("dagster-daemon"), "run", "--workspace", str(workspace)]
    return [webserver, daemon]


def _announce(
    host: str, port: int, secret: str, read_only: bool, say: Callable[[str], None]
) -> None:
    where = f"http://{host}:{port}/"
    mode = " (read-only: no launching or terminating)" if read_only else ""
    if secret:
        say(
            f"corr-pipeline ui: open {where}?{TOKEN_PARAMETER}={secret} when ready{mode}; "
            "only this address lets a browser in (new at every start, shown only here)"
        )
    else:
        may = "read every result" + ("" if read_only else " and launch and terminate runs")
        say(
            f"corr-pipeline ui: WARNING: --no-token: anyone who reaches {host}:{port} (every "
            f"user of this machine, at least) can {may}; {where}"
        )


def _start(
    programs: Sequence[Sequence[str]], env: dict[str, str], cwd: Path, secret: str
) -> list[subprocess.Popen[Any]]:
    """Start ``programs`` in one new process group (the first one leads it; a group of this
    session: a new session could not take the others in); the first gets ``secret`` on its
    standard input. If one cannot be started, those already started are stopped."""
    procs: list[subprocess.Popen[Any]] = []
    try:
        for argv in programs:
            first = not procs
            proc = subprocess.Popen(  # noqa: S603 - our own programs
                list(argv),
                env=env,
                cwd=cwd,
                stdin=subprocess.PIPE if first and secret else subprocess.DEVNULL,
                process_group=0 if first else procs[0].pid,
                preexec_fn=_child_setup,  # noqa: PLW1509 - single-threaded here
            )
            procs.append(proc)
            if first and secret:
                assert proc.stdin is not None
                proc.stdin.write(f"{secret}\n".encode())
                proc.stdin.close()
    except BaseException:
        if procs:
            stop_process_group(procs[0], members=procs[1:], timeout=5.0)
        raise
    return procs


def run_ui(
    port: int = DEFAULT_PORT,
    host: str = DEFAULT_HOST,
    *,
    read_only: bool = False,
    token: bool = True,
    command: Sequence[str] | None = None,
    timeout: float = STOP_TIMEOUT_SECONDS,
    say: Callable[[str], None] = echo,
) -> int:
    """Run the UI's processes (or the one program ``command``, for the tests) until one of them
    exits or this process gets SIGINT, SIGTERM or SIGHUP; then stop their whole process group
    (:func:`stop_process_group`). Returns the exit status of the one that ended by itself, 0
    after a requested stop."""
    received: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)

    previous = {signum: signal.signal(signum, on_signal) for signum in _FORWARDED}
    try:
        env = _ui_environment()
        _ensure_snapshot_pool(env[settings.ENV_DAGSTER_HOME], say)
        with tempfile.TemporaryDirectory(prefix="corr-pipeline-ui-") as private:
            workspace = write_workspace(Path(private), Path.cwd())
            secret = new_token() if token and command is None else ""
            programs = (
                [list(command)]
                if command is not None
                else ui_commands(workspace, port, host, read_only=read_only, token=token)
            )
            say(
                f"corr-pipeline ui: starting the web server and the daemon "
                f"(DAGSTER_HOME={env[settings.ENV_DAGSTER_HOME]}); Ctrl-C or SIGTERM stops them"
            )
            if command is None:
                _announce(host, port, secret, read_only, say)
            procs = _start(programs, env, Path(private), secret)
            return _supervise(procs, received, timeout, say)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _supervise(
    procs: list[subprocess.Popen[Any]],
    received: list[int],
    timeout: float,
    say: Callable[[str], None],
) -> int:
    leader, members = procs[0], procs[1:]
    while not received:
        ended = [proc for proc in procs if proc.poll() is not None]
        if ended:
            # one ended by itself: stop the others and clean up what it left in the group
            stop_process_group(leader, members=members, timeout=min(timeout, 5.0))
            return int(ended[0].returncode)
        time.sleep(0.2)
    name = signal.Signals(received[0]).name
    say(f"corr-pipeline ui: {name} received, stopping (SIGINT to its process group)")
    took, killed = stop_process_group(leader, members=members, timeout=timeout)
    if killed:
        say(
            f"corr-pipeline ui: killed {len(killed)} process(es) still running after "
            f"{timeout:.0f} s: {', '.join(map(str, killed))}"
        )
    say(f"corr-pipeline ui: stopped in {took:.1f} s")
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    return run_ui(port=args.port, host=args.host, read_only=args.read_only, token=not args.no_token)


def add_ui_command(commands: Any) -> None:
    """Register ``ui`` on the sub-command parser ``commands``."""
    ui = commands.add_parser(
        "ui",
        help="the Dagster UI (web server + daemon) on the project's instance, for the holder of "
        "the printed token only; SIGINT, SIGTERM or SIGHUP stops all of it (run it from the "
        "repository root)",
    )
    ui.add_argument("--port", type=int, default=DEFAULT_PORT, metavar="PORT")
    ui.add_argument("--host", default=DEFAULT_HOST, metavar="HOST")
    ui.add_argument(
        "--read-only",
        action="store_true",
        help="Dagster's read-only mode: results can be read, nothing launched or terminated",
    )
    ui.add_argument(
        "--no-token",
        action="store_true",
        help="no token: anyone who reaches the port reads every result and launches runs",
    )
    ui.set_defaults(func=cmd_ui, strict_env_file=True)
